"""Which event loop chainrun's own commands run on: uvloop when it is installed, else
asyncio's.

uvloop (the ``uvloop`` extra: ``pip install 'chainrun[uvloop]'``) is a drop-in asyncio
loop on libuv whose sockets, timers and callbacks cost less CPU per event; with 1,000
turns in flight the loop's own work is a share of every turn (benchmarks/README.md,
"Scale in one process", measures both loops in one run). The library never needs it
and never installs a loop policy: a chat backend that embeds chainrun runs it on its
own loop. The CLI (:func:`loop_factory` in ``chainrun.cli.run_async``) and ``chainrun
serve`` / ``chainrun lab serve`` (uvicorn's ``loop="auto"``, which prefers uvloop the
same way) pick it up when it is importable; ``CHAINRUN_EVENT_LOOP=asyncio`` keeps the
standard loop (e.g. to compare).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable
from typing import Any, Literal

#: the environment variable that picks the loop: ``auto`` (default) or ``asyncio``
ENV = "CHAINRUN_EVENT_LOOP"


def wanted() -> Literal["auto", "asyncio"]:
    """``asyncio`` when :data:`ENV` says so, else ``auto``."""
    return "asyncio" if os.environ.get(ENV, "").strip().lower() == "asyncio" else "auto"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``uvloop.new_event_loop`` when uvloop is importable and :data:`ENV` does not say
    ``asyncio``; None (asyncio's default loop) otherwise. For ``asyncio.Runner``."""
    if wanted() == "asyncio":
        return None
    try:
        uvloop: Any = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def uvicorn_loop() -> Literal["auto", "asyncio"]:
    """The ``loop`` setting for uvicorn (``auto`` prefers uvloop when installed)."""
    return wanted()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which implementation ``loop`` is."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
