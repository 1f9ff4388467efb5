"""Package front doors that import their public names on first use (PEP 562), so that
``import chainrun.errors`` or ``chainrun --help`` does not load the chain, the HTTP stack
or the statistics behind a package's ``__init__``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__``) that
    import each name of ``exports`` (public name -> the module defining it) the first
    time it is read, and keep it in the package's namespace from then on.

    Raises (from the returned ``__getattr__``):
        AttributeError: a name ``exports`` does not list, as for any module.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
