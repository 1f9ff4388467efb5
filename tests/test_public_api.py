"""The public API of ``chainrun`` (what ``chainrun/__init__.py`` exports), pinned: a name
added or removed here is a deliberate change of the library's surface."""

from __future__ import annotations

import chainrun

PUBLIC = [
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


def test_public_api_is_pinned() -> None:
    assert sorted(chainrun.__all__) == sorted(PUBLIC)


def test_every_public_name_is_importable_and_documented() -> None:
    for name in chainrun.__all__:
        obj = getattr(chainrun, name)
        assert (obj.__doc__ or "").strip(), f"chainrun.{name} has no docstring"
