"""chainrun: run multi-step LLM chains for commerce chat backends fast and measurably.

The public API (pinned by tests/test_public_api.py)::

    from chainrun import Chain, load_config
    async with Chain.from_config("chainrun.toml") as chain:
        async for event in chain.stream_turn("a rain jacket under 100?"):
            ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainrun.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from chainrun.chain import Chain
    from chainrun.config import (
        ChainConfig,
        HedgeConfig,
        ProviderConfig,
        StepConfig,
        load_config,
    )
    from chainrun.errors import (
        ChainClosed,
        ChainrunError,
        ConfigError,
        InputFileError,
        ProviderError,
        ProviderStatusError,
        ProviderTimeout,
        ProviderUnavailable,
        StreamTruncated,
        UserInputError,
    )
    from chainrun.events import Event, StepFinished, StepStarted, TokenDelta, TurnFinished
    from chainrun.log.store import Store

#: public name -> the module defining it. Imported on first use (PEP 562 ``__getattr__``),
#: so that ``import chainrun.errors`` or the CLI's ``--help`` does not load the chain, the
#: providers and their HTTP stack.
_EXPORTS = {
    "Chain": "chainrun.chain",
    **dict.fromkeys(
        ("ChainConfig", "HedgeConfig", "ProviderConfig", "StepConfig", "load_config"),
        "chainrun.config",
    ),
    **dict.fromkeys(
        (
            "ChainClosed", "ChainrunError", "ConfigError", "InputFileError", "ProviderError",
            "ProviderStatusError", "ProviderTimeout", "ProviderUnavailable", "StreamTruncated",
            "UserInputError",
        ),
        "chainrun.errors",
    ),
    **dict.fromkeys(
        ("Event", "StepFinished", "StepStarted", "TokenDelta", "TurnFinished"), "chainrun.events"
    ),
    "Store": "chainrun.log.store",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__version__ = "0.1.0"

__all__ = [
    "Chain",
    "ChainClosed",
    "ChainConfig",
    "ChainrunError",
    "ConfigError",
    "Event",
    "HedgeConfig",
    "InputFileError",
    "ProviderConfig",
    "ProviderError",
    "ProviderStatusError",
    "ProviderTimeout",
    "ProviderUnavailable",
    "StepConfig",
    "StepFinished",
    "StepStarted",
    "Store",
    "StreamTruncated",
    "TokenDelta",
    "TurnFinished",
    "UserInputError",
    "load_config",
]
