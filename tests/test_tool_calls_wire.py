"""Tool calls on the wire: requests carry the tools, streamed pieces are put together.

The lab answers with streamed ``delta.tool_calls`` pieces over real HTTP, read by the
real ``openai`` client through chainrun's adapter (and through the SDK's own parser, the
oracle); the Responses adapter's request and event mapping are checked on the SDK's
typed events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from chainrun.lab import LabServer
from chainrun.lab.scenarios import Scenario
from chainrun.lab.tool_calls import ToolCallsConfig
from chainrun.providers.base import ChatRequest, ChatStream
from chainrun.providers.chat_sse import chunk_from_dict
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.providers.responses import ResponseEvents, ResponsesProvider, response_params
from chainrun.timing import Chunk, StreamTimer, ToolCallDelta

ORDER = {"name": "order_status", "description": "Look an order up",
         "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}},
                        "required": ["order_id"]}}  # fmt: skip


def test_the_timer_puts_pieces_together_by_index_and_gives_no_ttft() -> None:
    timer = StreamTimer(t_start=0.0)
    timer.on_chunk(0.1, Chunk(role="assistant"))
    timer.on_chunk(0.2, Chunk(tool_calls=(ToolCallDelta(0, "c1", "order_status", '{"ord'),)))
    timer.on_chunk(0.25, Chunk(tool_calls=(ToolCallDelta(1, "c2", "add_to_cart"),)))
    timer.on_chunk(0.3, Chunk(tool_calls=(ToolCallDelta(0, arguments='er_id": 1042}'),
                                          ToolCallDelta(1, arguments="{}"))))  # fmt: skip
    timer.on_chunk(0.4, Chunk(finish_reason="tool_calls"))
    calls = timer.tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("c1", "order_status", '{"order_id": 1042}'), ("c2", "add_to_cart", "{}")]
    assert timer.ttft_ms is None  # a tool call is no content or reasoning token
    assert timer.first_tool_call_ms == pytest.approx(200.0)
    assert timer.finish_reason == "tool_calls"


def test_the_sse_parser_reads_delta_tool_calls() -> None:
    chunk = chunk_from_dict({"id": "x", "model": "m", "choices": [{"index": 0, "delta": {
        "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "order_status", "arguments": ""}}]},
        "finish_reason": None}]})  # fmt: skip
    assert chunk.tool_calls == (ToolCallDelta(0, "call_1", "order_status", ""),)
    piece = chunk_from_dict({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": '{"a"'}}]}}]})  # fmt: skip
    assert piece.tool_calls == (ToolCallDelta(0, None, None, '{"a"'),)


@pytest.fixture(scope="module")
def tool_lab() -> Iterator[LabServer]:
    scenario = Scenario(name="tools", n_tokens=6, per_token_ms=2,
                        tool_calls=ToolCallsConfig(rounds=2, fragments=4))  # fmt: skip
    with LabServer(scenario) as lab:
        yield lab


@pytest.mark.parametrize("sdk_sse", [False, True])
async def test_streamed_tool_call_pieces_arrive_whole(tool_lab: LabServer, sdk_sse: bool) -> None:
    tool_lab.reset()
    provider = OpenAICompatProvider("lab", tool_lab.base_url)
    provider.sdk_sse = sdk_sse  # the SDK's own parser is the oracle
    try:
        request = ChatRequest(model="m", tools=[ORDER],
                              messages=[{"role": "user", "content": "Where is my order 1042?"}])
        s = await ChatStream(provider, request).collect()
    finally:
        await provider.aclose()
    (call,) = s.timer.tool_calls
    assert call.name == "order_status" and call.id and call.id.startswith("call_")
    assert json.loads(call.arguments) == {"order_id": 1042}
    assert s.timer.finish_reason == "tool_calls" and s.timer.text == ""
    assert s.timer.n_chunks >= 4  # the pieces came in several chunks
    (rec,) = tool_lab.requests()
    assert rec["tool_call"] == "order_status" and rec["completed"]


async def test_the_second_round_answers_from_the_tool_result(tool_lab: LabServer) -> None:
    tool_lab.reset()
    provider = OpenAICompatProvider("lab", tool_lab.base_url)
    call_msg = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "order_status", "arguments": '{"order_id": 1042}'}}]}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "call_a", "content": '{"status": "shipped"}'}
    base = [{"role": "user", "content": "Where is my order 1042?"}, call_msg, result]
    try:
        second = await ChatStream(provider, ChatRequest(model="m", tools=[ORDER],
                                                        messages=base)).collect()  # fmt: skip
        third = await ChatStream(provider, ChatRequest(model="m", tools=[ORDER], messages=[
            *base, {**call_msg, "tool_calls": [{**call_msg["tool_calls"][0], "id": "call_b"}]},
            {**result, "tool_call_id": "call_b"}])).collect()  # fmt: skip
    finally:
        await provider.aclose()
    assert second.timer.tool_calls and second.timer.finish_reason == "tool_calls"  # round 2
    assert not third.timer.tool_calls and third.timer.finish_reason == "stop"
    assert third.timer.text == 'order_status: {"status": "shipped"}'
    sent = tool_lab.requests()
    assert len(sent) == 2


def test_chat_completions_request_carries_the_tools() -> None:
    provider = OpenAICompatProvider("x", "http://127.0.0.1:9/v1")
    params = provider._params(ChatRequest(model="m", messages=[], tools=[ORDER],
                                          tool_choice="auto"))  # fmt: skip
    assert params["tools"] == [{"type": "function", "function": ORDER}]
    assert params["tool_choice"] == "auto"


def test_responses_request_turns_calls_and_results_into_items() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "order 1042?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "order_status", "arguments": '{"order_id": 1042}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": '{"status": "shipped"}'},
    ]  # fmt: skip
    params = response_params(ChatRequest(model="m", messages=messages, tools=[ORDER]))
    assert params["instructions"] == "be brief"
    assert params["input"] == [
        {"role": "user", "content": "order 1042?"},
        {"type": "function_call", "call_id": "call_a", "name": "order_status",
         "arguments": '{"order_id": 1042}'},
        {"type": "function_call_output", "call_id": "call_a", "output": '{"status": "shipped"}'},
    ]  # fmt: skip
    assert params["tools"] == [{"type": "function", **ORDER}]


def test_responses_function_call_events_become_tool_call_pieces() -> None:
    ev = ResponseEvents("r")
    item = SimpleNamespace(type="function_call", call_id="call_a", name="order_status",
                           arguments="")  # fmt: skip
    first = ev.on_event(SimpleNamespace(type="response.output_item.added", output_index=0,
                                        item=item))  # fmt: skip
    piece = ev.on_event(SimpleNamespace(type="response.function_call_arguments.delta",
                                        output_index=0, delta='{"order_id": 1042}'))  # fmt: skip
    done = ev.on_event(SimpleNamespace(type="response.completed", response=SimpleNamespace(
        model="m", id="resp_1", usage=None)))  # fmt: skip
    timer = StreamTimer(t_start=0.0)
    for i, c in enumerate((first, piece, done)):
        assert c is not None
        timer.on_chunk(0.1 * (i + 1), c)
    (call,) = timer.tool_calls
    assert (call.id, call.name, call.arguments) == ("call_a", "order_status", '{"order_id": 1042}')
    assert timer.finish_reason == "tool_calls"


async def test_responses_api_tool_rounds_against_the_lab(tool_lab: LabServer) -> None:
    tool_lab.reset()
    provider = ResponsesProvider("lab", tool_lab.base_url)
    user = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "Where is my order 1042?"}]  # fmt: skip
    try:
        first = await ChatStream(provider, ChatRequest(model="m", tools=[ORDER],
                                                       messages=user)).collect()  # fmt: skip
        (call,) = first.timer.tool_calls
        asked = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}]}  # fmt: skip
        answered = {"role": "tool", "tool_call_id": call.id, "content": '{"status": "shipped"}'}
        second = await ChatStream(provider, ChatRequest(
            model="m", tools=[ORDER], messages=[*user, asked, answered])).collect()  # fmt: skip
    finally:
        await provider.aclose()
    assert call.name == "order_status" and json.loads(call.arguments) == {"order_id": 1042}
    assert first.timer.finish_reason == "tool_calls" and first.timer.n_chunks >= 3
    assert second.timer.tool_calls  # the scenario asks for 2 rounds
    routes = {r["route"] for r in tool_lab.requests()}
    assert routes == {"/v1/responses"}
