"""chainrun: run multi-step LLM chains for commerce chat backends fast and measurably.

The public API (pinned by tests/test_public_api.py)::

    from chainrun import Chain, load_config
    async with Chain.from_config("chainrun.toml") as chain:
        async for event in chain.stream_turn("a rain jacket under 100?"):
            ...
"""

from chainrun.chain import Chain
from chainrun.config import ChainConfig, HedgeConfig, ProviderConfig, StepConfig, load_config
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
