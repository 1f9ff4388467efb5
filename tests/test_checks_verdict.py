"""Llama Guard's reply format: `safe`, or `unsafe` with an optional category line, the
verdict word on the first non-blank line in any case; anything else is unparseable, and a
missing verdict is decided by the guard's open/closed policy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from chainrun.chain import Chain
from chainrun.checks.verdict import GuardVerdict, missing_verdict, parse_llama_guard
from chainrun.config import config_from_dict
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import WireFrame
from chainrun.log.store import Store


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


@pytest.fixture(scope="module")
def labs() -> Iterator[tuple[LabServer, LabServer]]:
    """The guard model's server and the answer's."""
    with LabServer("fast") as guard_lab, LabServer("fast") as compose_lab:
        yield guard_lab, compose_lab


def _guard_reply(text: str) -> list[WireFrame]:
    """A guard model's reply as a llama-server stream: role frame, the text, finish, usage."""
    head = {"id": "chatcmpl-g1", "object": "chat.completion.chunk", "created": 1733040000,
            "model": "llama-guard-3"}  # fmt: skip

    def frame(**fields: Any) -> WireFrame:
        return WireFrame(data=f"data: {json.dumps({**head, **fields})}\n\n")

    return [
        frame(choices=[{"index": 0, "delta": {"role": "assistant", "content": None},
                        "finish_reason": None}]),
        frame(choices=[{"index": 0, "delta": {"content": text}, "finish_reason": None}]),
        frame(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        frame(choices=[], usage={"prompt_tokens": 30, "completion_tokens": 2,
                                 "total_tokens": 32}),
        WireFrame(data="data: [DONE]\n\n"),
    ]  # fmt: skip


@pytest.mark.parametrize("reply", ["unsafe", "UNSAFE\nS1,S2", "Unsafe\n\n"])
async def test_a_guard_model_s_unsafe_refuses_the_turn_under_fail_open(
    reply: str, labs: tuple[LabServer, LabServer]
) -> None:
    """End to end: the guard model (the lab, these bytes, the real ``openai`` client)
    answers a bare or upper-case ``unsafe``; under ``on_missing_verdict = "open"`` it was
    read as no verdict and the turn went through."""
    guard_lab, compose_lab = labs
    guard_lab.set_scenario(Scenario(name="guard", wire=_guard_reply(reply)))
    # the two labs are shared by the parameters (starting one takes seconds)
    cfg = config_from_dict({
        "order": ["guard", "compose"],
        "providers": {"local": {"base_url": compose_lab.base_url},
                      "guard": {"base_url": guard_lab.base_url}},
        "steps": {"guard": {"kind": "guard", "provider": "guard", "deadline_s": 5.0,
                            "prompt": "Task: check.\nUser: {message}\nVerdict:",
                            "on_missing_verdict": "open"},
                  "compose": {"prompt": "{message}", "stream": True}},
    })  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("how do I hurt someone")
    assert done.status == "refused"
    assert done.verdicts["guard"]["status"] == "unsafe"
