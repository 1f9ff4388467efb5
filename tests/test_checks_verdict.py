"""Llama Guard's reply format: `safe`, or `unsafe` with an optional category line, the
verdict word on the first non-blank line in any case; anything else is unparseable, and a
missing verdict is decided by the guard's open/closed policy."""

from __future__ import annotations

import pytest

from chainrun.checks.verdict import GuardVerdict, missing_verdict, parse_llama_guard


@pytest.mark.parametrize(
    ("reply", "status", "categories"),
    [("safe", "safe", ()), ("  safe\n", "safe", ()), ("unsafe\nS1", "unsafe", ("S1",)),
     ("unsafe\nS2,S14", "unsafe", ("S2", "S14")),
     ("\nunsafe\n S10 , S3 \n", "unsafe", ("S10", "S3")),
     # a bare `unsafe` (the model card says it occurs) and the verdict word in any case
     ("unsafe", "unsafe", ()), ("UNSAFE\nS1,S2", "unsafe", ("S1", "S2")),
     ("Safe", "safe", ()), ("SAFE\n", "safe", ()), ("\n\n  Unsafe  \n\n", "unsafe", ()),
     ("unsafe\ns3", "unsafe", ("S3",))],
)  # fmt: skip
def test_accepted_replies(reply: str, status: str, categories: tuple[str, ...]) -> None:
    v = parse_llama_guard(reply)
    assert (v.status, v.categories, v.missing) == (status, categories, None)


@pytest.mark.parametrize(
    "reply",
    ["", None, "  \n ", "safe.", "unsafe.", "unsafe S1", "unsafe\nS15", "unsafe\nS0",
     "unsafe\nviolence", "safe\nS1", "unsafe\nS1\nmore", "I think this is safe", "unsafe\nS1,"],
)  # fmt: skip
def test_anything_else_is_unparseable(reply: str | None) -> None:
    v = parse_llama_guard(reply)
    assert v.status == "missing" and v.missing == "unparseable"


def test_only_unsafe_or_closed_missing_refuses() -> None:
    assert parse_llama_guard("unsafe\nS1").refuses("open")
    assert not parse_llama_guard("safe").refuses("closed")
    assert missing_verdict("timeout").refuses("closed")
    assert not missing_verdict("timeout").refuses("open")
    assert GuardVerdict("missing", missing="error").as_json() == {
        "status": "missing", "categories": [], "missing": "error"}  # fmt: skip


@pytest.mark.parametrize("reply", ["unsafe", "UNSAFE\nS1,S2", "Unsafe\n"])
def test_an_unsafe_verdict_refuses_under_the_open_policy(reply: str) -> None:
    # read as unparseable, these let the turn through when a missing verdict fails open
    assert parse_llama_guard(reply).refuses("open")
