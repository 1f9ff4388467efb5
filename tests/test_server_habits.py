"""chainrun behind the servers shops use: each server family's publicly reported habit
sent as its exact bytes by the lab (``wire_rounds``: a round's frames; ``strict_history``:
the 400/500 a strict server answers to what the earlier turns hold), through the real
interfaces (``chainrun replay``, ``chainrun serve``'s ``/chat``, the real ``openai``
client), the tool's runs counted by the tool itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w
from cli_runner import chainrun
from counted_tools import ORDER, RUNS
from serve_helpers import chat, serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.lab.scenarios import Scenario, StrictHistory, WireFrame
from chainrun.log.store import Store

HEAD = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1733040000,
        "model": "served"}  # fmt: skip


def frame(delta: dict[str, Any] | None = None, finish: str | None = None,
          **extra: Any) -> WireFrame:  # fmt: skip
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body = json.dumps({**HEAD, "choices": choices, **extra})
    return WireFrame(after_ms=2, data=f"data: {body}\n\n")


def tool_round(*pieces: dict[str, Any], reasoning: str | None = None) -> list[WireFrame]:
    """A round that asks for tools: role frame, (reasoning), the pieces, finish, usage."""
    out = [frame({"role": "assistant", "content": None})]
    if reasoning:
        out.append(frame({"reasoning_content": reasoning}))
    out += [frame({"tool_calls": [p]}) for p in pieces]
    out += [frame({}, "tool_calls"),
            frame(None, usage={"prompt_tokens": 20, "completion_tokens": 9}),
            WireFrame(data="data: [DONE]\n\n")]  # fmt: skip
    return out


SHIPPED = "Your order has shipped."


def text_round(text: str = SHIPPED) -> list[WireFrame]:
    return [frame({"role": "assistant", "content": None}), frame({"content": text}),
            frame({}, "stop"), frame(None, usage={"prompt_tokens": 30, "completion_tokens": 5}),
            WireFrame(data="data: [DONE]\n\n")]  # fmt: skip


def call(order_id: int | str, *, index: int | None = 0, id_: str | None = "call_0",
         name: str | None = "order_status") -> dict[str, Any]:  # fmt: skip
    piece: dict[str, Any] = {"type": "function", "function": {}}
    if index is not None:
        piece["index"] = index
    if id_ is not None:
        piece["id"] = id_
    if name is not None:
        piece["function"]["name"] = name
    args = order_id if isinstance(order_id, str) else json.dumps({"order_id": order_id})
    piece["function"]["arguments"] = args
    return piece


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast") as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RUNS.clear()


def _config(lab: LabServer) -> dict[str, Any]:
    return {
        "order": ["answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": lab.base_url}},
        "steps": {"answer": {"prompt": "{message}", "stream": True, "deadline_s": 10.0,
                             "tools": ["order_status"], "max_tool_rounds": 3}},
        "tools": {"order_status": ORDER},
    }  # fmt: skip


def _replay(lab: LabServer, tmp_path: Path, scenario: Scenario) -> dict[str, Any]:
    """One request through ``chainrun replay``; its turn as ``show --json`` has it."""
    lab.set_scenario(scenario)
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(tomli_w.dumps(_config(lab)))
    requests = tmp_path / "r.jsonl"
    requests.write_text(json.dumps({"id": "r1", "message": "where is order 1042?"}) + "\n")
    db = tmp_path / "log.db"
    res = chainrun("replay", str(requests), "--config", str(cfg), "--db", str(db))
    assert res.returncode == 0, res.output
    shown = chainrun("show", "1", "--db", str(db), "--json")
    assert shown.returncode == 0, shown.output
    return json.loads(shown.stdout)["turns"][0]


async def _serve(lab: LabServer, tmp_path: Path, scenario: Scenario) -> list[tuple[str, Any]]:
    lab.set_scenario(scenario)
    cfg = config_from_dict(_config(lab))
    store = Store.open(tmp_path / "serve.db")
    try:
        factory = lambda: Chain(cfg, store=store, kind="live", quiet=True)  # noqa: E731
        async with (
            serving(factory) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            return await chat(client, "where is order 1042?", conversation_id="c1")
    finally:
        store.close()


def test_an_id_reused_in_the_next_round_is_a_new_call(lab: LabServer, tmp_path: Path) -> None:
    """llama.cpp's one constant id (kimi-k3's ``name:0`` each round, grok's ``call_0``)."""
    turn = _replay(lab, tmp_path, Scenario(name="constant-id", wire_rounds=[
        tool_round(call(1042)), tool_round(call(2077)), text_round()]))  # fmt: skip
    assert turn["status"] == "ok" and turn["output"] == SHIPPED
    assert RUNS == [1042, 2077]  # the second round's call ran, with its own argument
    assert [t["wire_notes"] for t in turn["tool_calls"]] == [None, "id_reused"]


async def test_parallel_calls_that_all_say_index_0_each_run(lab: LabServer, tmp_path: Path) -> None:
    """Ollama behind proxies: two calls on index 0, each with its own id."""
    events = await _serve(lab, tmp_path, Scenario(name="index-0", wire_rounds=[
        tool_round(call(1042, id_="call_a"), call(2077, id_="call_b")), text_round()]))
    assert events[-1][1]["status"] == "ok" and events[-1][1]["output"] == SHIPPED
    assert sorted(RUNS) == [1042, 2077]


def test_parallel_calls_without_an_index_each_run(lab: LabServer, tmp_path: Path) -> None:
    """Gemini's compatible endpoint: no index, no id."""
    turn = _replay(lab, tmp_path, Scenario(name="no-index", wire_rounds=[
        tool_round(call(1042, index=None, id_=None), call(2077, index=None, id_=None)),
        text_round()]))  # fmt: skip
    assert turn["status"] == "ok" and turn["output"] == SHIPPED and sorted(RUNS) == [1042, 2077]


async def test_a_name_streamed_in_fragments_is_the_whole_name(
    lab: LabServer, tmp_path: Path
) -> None:
    first = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "order_"}}
    rest = {"index": 0, "function": {"name": "status", "arguments": '{"order_id": 1042}'}}
    events = await _serve(lab, tmp_path, Scenario(name="name-fragments", wire_rounds=[
        tool_round(first, rest), text_round()]))  # fmt: skip
    assert events[-1][1]["status"] == "ok" and events[-1][1]["output"] == SHIPPED and RUNS == [1042]


def test_arguments_sent_as_an_object_are_read(lab: LabServer, tmp_path: Path) -> None:
    """llama.cpp (ggml-org/llama.cpp#20198): ``arguments`` a JSON object, not text."""
    piece = {"index": 0, "id": "call_0", "type": "function",
             "function": {"name": "order_status", "arguments": {"order_id": 1042}}}  # fmt: skip
    turn = _replay(lab, tmp_path, Scenario(name="args-object", wire_rounds=[
        tool_round(piece), text_round()]))  # fmt: skip
    assert turn["status"] == "ok" and turn["output"] == SHIPPED and RUNS == [1042]
    assert turn["tool_calls"][0]["wire_notes"] == "arguments_object"


def test_fragments_on_a_shifted_index_join_the_open_call(lab: LabServer, tmp_path: Path) -> None:
    """Nebius, Cerebras: argument pieces on index 1 with no id or name."""
    head = call('{"order_', index=0)
    tail = {"index": 1, "function": {"arguments": 'id": 1042}'}}
    turn = _replay(lab, tmp_path, Scenario(name="shifted", wire_rounds=[
        tool_round(head, tail), text_round()]))  # fmt: skip
    assert turn["status"] == "ok" and turn["output"] == SHIPPED and RUNS == [1042]


def test_a_history_with_unparsable_arguments_is_accepted_by_llama_server(
    lab: LabServer, tmp_path: Path
) -> None:
    """llama-server answers 500 to a history whose tool call does not parse (#25510); the
    round that lets the model correct itself must reach it."""
    turn = _replay(lab, tmp_path, Scenario(
        name="strict-args", strict_history=StrictHistory(arguments_must_parse=True),
        wire_rounds=[tool_round(call('{"order_id": 10')), tool_round(call(1042)),
                     text_round()]))  # fmt: skip
    assert turn["status"] == "ok" and turn["output"] == SHIPPED and RUNS == [1042]
    statuses = [t["status"] for t in turn["tool_calls"]]
    assert statuses == ["invalid_arguments", "ok"]


async def test_deepseek_thinking_gets_its_reasoning_back(lab: LabServer, tmp_path: Path) -> None:
    """DeepSeek's thinking mode: a round-2 request without the round's reasoning_content
    on the assistant tool-call message is a 400."""
    events = await _serve(lab, tmp_path, Scenario(
        name="deepseek", strict_history=StrictHistory(reasoning_content=True),
        wire_rounds=[tool_round(call(1042), reasoning="Look the order up."), text_round()]))
    assert events[-1][1]["status"] == "ok" and events[-1][1]["output"] == SHIPPED and RUNS == [1042]


def test_content_null_is_never_sent_back(lab: LabServer, tmp_path: Path) -> None:
    """Ollama and LM Studio answer 400 to ``"content": null`` on an assistant tool call."""
    turn = _replay(lab, tmp_path, Scenario(
        name="no-null", strict_history=StrictHistory(content_null=True),
        wire_rounds=[tool_round(call(1042)), text_round()]))  # fmt: skip
    assert turn["status"] == "ok" and turn["output"] == SHIPPED and RUNS == [1042]


def test_deepseek_cache_fields_are_cached_tokens(lab: LabServer, tmp_path: Path) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "prompt_cache_hit_tokens": 64,
             "prompt_cache_miss_tokens": 36}  # fmt: skip
    frames = [frame({"role": "assistant", "content": None}), frame({"content": "Hi."}),
              frame({}, "stop"), frame(None, usage=usage), WireFrame(data="data: [DONE]\n\n")]
    lab.set_scenario(Scenario(name="deepseek-cache", wire=frames))
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(tomli_w.dumps({"order": ["compose"], "answer_step": "compose",
                                  "providers": {"local": {"base_url": lab.base_url}},
                                  "steps": {"compose": {"prompt": "{message}"}}}))
    requests = tmp_path / "r.jsonl"
    requests.write_text(json.dumps({"id": "r1", "message": "hello"}) + "\n")
    db = tmp_path / "log.db"
    assert chainrun("replay", str(requests), "--config", str(cfg), "--db", str(db)).returncode == 0
    with Store.open(db, create=False) as store:
        (row,) = store.calls(store.latest_run_id() or 0)
    assert (row.input_tokens, row.cached_input_tokens) == (100, 64)


async def test_a_retry_after_date_beyond_the_deadline_fails_at_once(lab: LabServer) -> None:
    """Against a 30 s pushback given as an HTTP-date, one request, not three in 10 ms
    (a 429 is non-fatal here: a copy would start at once without the pushback)."""
    lab.set_scenario(Scenario(name="pushback", faults={"rate_limit": 1.0, "retry_after_s": 30,
                                                       "retry_after_form": "http_date"}))
    cfg = config_from_dict({
        "order": ["compose"], "answer_step": "compose",
        "providers": {"local": {"base_url": lab.base_url}},
        "steps": {"compose": {"prompt": "{message}", "deadline_s": 5.0, "hedge": {
            "delay_ms": 100, "max_attempts": 3, "max_extra_load": 2.0, "non_fatal": [429]}}},
    })  # fmt: skip
    lab.reset()
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("hello")
        (row,) = [s for s in store.steps(chain.run_id or 0) if s.step == "compose"]
    assert done.status != "ok" and row.error_type == "http_429"
    assert len(lab.requests()) == 1
