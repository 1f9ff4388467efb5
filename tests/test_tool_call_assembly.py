"""Streamed tool calls put together as servers really send them (the pure accumulator,
fed the exact ``delta.tool_calls`` frames each server family was reported to send)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chainrun.errors import MalformedStream
from chainrun.providers.chat_sse import chunk_from_dict
from chainrun.timing import StreamTimer


def _frame(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": list(calls)},
                         "finish_reason": None}]}  # fmt: skip


def _assemble(*frames: dict[str, Any]) -> list[tuple[str | None, str | None, str, tuple]]:
    timer = StreamTimer(t_start=0.0)
    for i, f in enumerate(frames):
        timer.on_chunk(0.01 * (i + 1), chunk_from_dict(f))
    return [(c.id, c.name, c.arguments, c.notes) for c in timer.tool_calls]


def _fn(name: str | None = None, arguments: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if name is not None:
        out["name"] = name
    if arguments is not None:
        out["arguments"] = arguments
    return out


def test_a_stream_as_the_api_documents_it_is_read_as_before() -> None:
    calls = _assemble(
        _frame({"index": 0, "id": "call_a", "type": "function",
                "function": _fn("order_status", "")}),
        _frame({"index": 0, "function": _fn(arguments='{"order_id"')}),
        _frame({"index": 1, "id": "call_b", "type": "function", "function": _fn("faq", "{}")}),
        _frame({"index": 0, "function": _fn(arguments=": 1042}")}),
    )
    assert calls == [("call_a", "order_status", '{"order_id": 1042}', ()),
                     ("call_b", "faq", "{}", ())]  # fmt: skip


def test_parallel_calls_that_all_carry_index_0_are_two_calls() -> None:
    """Ollama behind proxies: every call on index 0, each with its own id."""
    calls = _assemble(
        _frame({"index": 0, "id": "call_1", "function": _fn("order_status", '{"order_id":1042}')}),
        _frame({"index": 0, "id": "call_2", "function": _fn("order_status", '{"order_id":2077}')}),
    )
    assert [(c[0], c[2]) for c in calls] == [("call_1", '{"order_id":1042}'),
                                             ("call_2", '{"order_id":2077}')]  # fmt: skip
    assert calls[1][3] == ("new_call_on_same_index",)


def test_parallel_calls_without_index_or_id_are_split_on_the_restated_name() -> None:
    """Gemini's compatible endpoint: no index; a name after arguments is the next call."""
    calls = _assemble(
        _frame({"function": _fn("order_status", '{"order_id":1042}')}),
        _frame({"function": _fn("order_status", '{"order_id":2077}')}),
    )
    assert [c[2] for c in calls] == ['{"order_id":1042}', '{"order_id":2077}']
    assert all("index_inferred" in c[3] for c in calls)


def test_a_name_streamed_in_fragments_is_joined_and_a_restated_one_kept_once() -> None:
    joined = _assemble(
        _frame({"index": 0, "id": "call_1", "function": _fn("order_")}),
        _frame({"index": 0, "function": _fn("status")}),
        _frame({"index": 0, "function": _fn(arguments='{"order_id":1042}')}),
    )
    assert joined == [("call_1", "order_status", '{"order_id":1042}', ("name_fragments_joined",))]
    restated = _assemble(
        _frame({"index": 0, "id": "call_1", "function": _fn("order_status")}),
        _frame({"index": 0, "function": _fn("order_status", '{"order_id":1}')}),
    )
    assert restated == [("call_1", "order_status", '{"order_id":1}', ())]


def test_arguments_sent_as_a_json_object_are_serialised_and_noted() -> None:
    """llama.cpp (ggml-org/llama.cpp#20198): ``arguments`` as an object, not text."""
    calls = _assemble(
        _frame({"index": 0, "id": "x", "function": _fn("order_status", {"order_id": 1042})}))
    assert calls[0][1] == "order_status" and json.loads(calls[0][2]) == {"order_id": 1042}
    assert calls[0][3] == ("arguments_object",)


def test_nameless_fragments_on_a_shifted_index_belong_to_the_open_call() -> None:
    """Nebius, Cerebras: argument pieces on index 1 with no id or name."""
    calls = _assemble(
        _frame({"index": 0, "id": "call_1", "function": _fn("order_status", '{"order_')}),
        _frame({"index": 1, "function": _fn(arguments='id": 1042}')}),
    )
    assert calls == [("call_1", "order_status", '{"order_id": 1042}', ("fragment_reattached",))]


def test_an_index_that_is_no_integer_is_a_malformed_stream() -> None:
    with pytest.raises(MalformedStream):
        chunk_from_dict(_frame({"index": "0", "function": _fn("f", "{}")}))
