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
    from chainrun.conversations.history import HistoryTurn
    from chainrun.desk import TurnRequest
    from chainrun.errors import (
        ChainClosed,
        ChainrunError,
        ConfigError,
        ConversationForbidden,
        IdempotencyKeyReused,
        InputFileError,
        LogFileGone,
        LogUnavailable,
        LogWriteError,
        ProviderError,
        ProviderStatusError,
        ProviderTimeout,
        ProviderUnavailable,
        RequestInProgress,
        StepConfigError,
        StreamTruncated,
        UserInputError,
    )
    from chainrun.events import (
        AnswerDone,
        Event,
        ProductsShown,
        StepFinished,
        StepStarted,
        TokenDelta,
        ToolCallEvent,
        TurnFinished,
    )
    from chainrun.identity import Identity
    from chainrun.log.rows import TurnUsage
    from chainrun.log.store import Store
    from chainrun.log.writer import LogWriteLost, LogWriterStopped
    from chainrun.pricing import Cost, Price, PriceBook
    from chainrun.retrieval.products import ShownProduct
    from chainrun.tools.tool import ToolContext

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
            "ChainClosed", "ChainrunError", "ConfigError", "ConversationForbidden",
            "IdempotencyKeyReused", "InputFileError", "LogFileGone", "LogUnavailable",
            "LogWriteError", "ProviderError", "ProviderStatusError", "ProviderTimeout",
            "ProviderUnavailable", "RequestInProgress", "StepConfigError", "StreamTruncated",
            "UserInputError",
        ),
        "chainrun.errors",
    ),
    **dict.fromkeys(
        (
            "AnswerDone", "Event", "ProductsShown", "StepFinished", "StepStarted", "TokenDelta",
            "ToolCallEvent", "TurnFinished",
        ),
        "chainrun.events",
    ),
    "HistoryTurn": "chainrun.conversations.history",
    "TurnRequest": "chainrun.desk",
    "Identity": "chainrun.identity",
    **dict.fromkeys(("Cost", "Price", "PriceBook"), "chainrun.pricing"),
    "TurnUsage": "chainrun.log.rows",
    "Store": "chainrun.log.store",
    **dict.fromkeys(("LogWriteLost", "LogWriterStopped"), "chainrun.log.writer"),
    "ShownProduct": "chainrun.retrieval.products",
    "ToolContext": "chainrun.tools.tool",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__version__ = "0.1.0"

__all__ = [
    "AnswerDone",
    "Chain",
    "ChainClosed",
    "ChainConfig",
    "ChainrunError",
    "ConfigError",
    "ConversationForbidden",
    "Cost",
    "Event",
    "HedgeConfig",
    "HistoryTurn",
    "IdempotencyKeyReused",
    "Identity",
    "InputFileError",
    "LogFileGone",
    "LogUnavailable",
    "LogWriteError",
    "LogWriteLost",
    "LogWriterStopped",
    "Price",
    "PriceBook",
    "ProductsShown",
    "ProviderConfig",
    "ProviderError",
    "ProviderStatusError",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RequestInProgress",
    "ShownProduct",
    "StepConfig",
    "StepConfigError",
    "StepFinished",
    "StepStarted",
    "Store",
    "StreamTruncated",
    "TokenDelta",
    "ToolCallEvent",
    "ToolContext",
    "TurnFinished",
    "TurnRequest",
    "TurnUsage",
    "UserInputError",
    "load_config",
]
