"""The effective config as TOML: the built-in defaults merged with a config file.

``chainrun config show`` prints it. Loaded again as a ``chainrun.toml`` it gives the
same chain (tested), so it is a starting point for a config of one's own. TOML has no
null: a key whose value is None (unset) is left out, which is its default.
"""

from __future__ import annotations

import json
from typing import Any

import tomli_w

from chainrun.config.chain import ChainConfig


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value if v is not None]
    return value


def effective_toml(config: ChainConfig, source: str | None = None) -> str:
    """``config`` as a TOML document (keys in the models' order, prompts as multi-line
    strings), headed by a comment naming ``source`` (the file it was merged from)."""
    data = _without_none(json.loads(json.dumps(config.model_dump(mode="json"))))
    origin = f"the built-in defaults merged with {source}" if source else "the built-in defaults"
    head = f"# The effective chainrun config: {origin}.\n\n"
    return head + tomli_w.dumps(data, multiline_strings=True)


__all__ = ["effective_toml"]
