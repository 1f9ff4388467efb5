"""The public API of ``chainrun`` (what ``chainrun/__init__.py`` exports), pinned: a name
added or removed here is a deliberate change of the library's surface."""

from __future__ import annotations

import chainrun

PUBLIC = [
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


def test_public_api_is_pinned() -> None:
    assert sorted(chainrun.__all__) == sorted(PUBLIC)


def test_every_public_name_is_importable_and_documented() -> None:
    for name in chainrun.__all__:
        obj = getattr(chainrun, name)
        assert (obj.__doc__ or "").strip(), f"chainrun.{name} has no docstring"


async def test_every_event_of_a_turn_is_plain_json(store, config, fake) -> None:
    """A whole turn's events through ``as_json()`` and ``json.dumps``: the type first,
    tuples as lists, the usage as the log stores it (its tokens summed over the calls the
    log holds for the turn, a count no call reported ``null``)."""
    import json

    from chainrun import AnswerDone, Chain, ToolCallEvent, TurnFinished, TurnUsage

    async with Chain(config, store=store, providers={"local": fake}, quiet=True) as chain:
        events = [ev async for ev in chain.stream_turn("a rain jacket under 100?")]
    kinds = set()
    for ev in events:
        data = json.loads(json.dumps(ev.as_json()))
        assert next(iter(data)) == "type" and data["type"] == ev.type
        kinds.add(ev.type)
    assert {"step_started", "token_delta", "step_finished", "answer_done",
            "turn_finished"} <= kinds  # fmt: skip
    done = next(ev for ev in events if isinstance(ev, AnswerDone))
    usage = done.as_json()["usage"]
    assert usage == done.usage.as_json() and set(usage) >= {"input_tokens", "unknown_calls"}
    finished = next(ev for ev in events if isinstance(ev, TurnFinished))
    assert finished.as_json()["turn_id"] == finished.turn_id
    # a count no call reported stays null (unknown), never 0
    assert AnswerDone("compose", "hi", None, 1.0, ("validate",)).as_json()["usage"] == (
        TurnUsage().as_json() | {"input_tokens": None}
    )
    tool = ToolCallEvent("compose", "finished", "add_to_cart", "c1", status="ok")
    assert json.loads(json.dumps(tool.as_json()))["tool"] == "add_to_cart"
    assert AnswerDone("compose", "hi", None, 1.0, ("validate",)).as_json()["pending"] == [
        "validate"
    ]


def test_every_public_name_is_in_the_api_reference() -> None:
    """docs/reference/api.md renders each exported name (``Event``, the union of the event
    types, is named in its prose)."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "api.md").read_text()
    missing = [n for n in chainrun.__all__ if f"::: chainrun.{n}\n" not in page]
    assert missing == ["Event"] and "`chainrun.Event`" in page, missing
