"""Tool calls where people see them: ``/chat``'s ``tool`` events and turn summary, the
``tool_calls`` rows, ``chainrun show`` and the OpenTelemetry ``execute_tool`` spans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serve_helpers import chat, serving
from test_tool_steps import RUNS, cart_call, is_key, rounds_script, tool_config
from typer.testing import CliRunner

from chainrun.chain import Chain
from chainrun.cli import app
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.telemetry.otel import Telemetry


def shop_fake() -> FakeProvider:
    return FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": "two"}),  # invalid: back to the model
        cart_call({"sku": "JKT-12", "qty": 2}, call_id="call_2"),
        FakeReply("Two JKT-12 are in your cart.", gap_s=0.001)))  # fmt: skip


async def test_chat_streams_tool_events_and_the_summary_lists_the_calls(tmp_path: Path) -> None:
    RUNS.clear()  # the count of the tool's runs is this test's
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Telemetry(tp, workflow="shop")
    db = tmp_path / "tools.db"
    store = Store.open(db)
    cfg = tool_config(max_tool_rounds=3)
    fake = shop_fake()

    def factory() -> Chain:
        return Chain(cfg, store=store, providers={"local": fake}, quiet=True)

    try:
        async with serving(factory, observers=[telemetry]) as (url, _):
            async with httpx.AsyncClient(base_url=url) as client:
                events = await chat(client, "put 2 of JKT-12 in my cart")
    finally:
        store.close()
    tools = [d for e, d in events if e == "tool"]
    assert [(d["phase"], d["tool"], d["status"]) for d in tools] == [
        ("finished", "add_to_cart", "invalid_arguments"),
        ("started", "add_to_cart", None),
        ("finished", "add_to_cart", "ok"),
    ]
    assert tools[1]["side_effects"] is True and tools[2]["duration_ms"] >= 0
    turn = events[-1][1]
    assert turn["status"] == "ok" and turn["output"] == "Two JKT-12 are in your cart."
    (step,) = turn["steps"]
    assert [(t["status"], t["round"]) for t in step["tool_calls"]] == [
        ("invalid_arguments", 1), ("ok", 2)]
    assert len(RUNS) == 1
    # the log: one row per call, arguments as the model sent them
    with Store.open(db, create=False) as log:
        rows = log.tool_calls(turn["run_id"])
    assert [is_key(r.idempotency_key or "", turn["turn_id"], call)
            for r, call in zip(rows, ("answer:1:0", "answer:2:0"), strict=True)] == [True, True]
    assert json.loads(rows[1].arguments or "") == {"sku": "JKT-12", "qty": 2}
    assert rows[1].step == "answer" and (rows[1].round, rows[1].attempt) == (2, 1)
    assert rows[1].duration_ms is not None
    assert json.loads(rows[1].result or "")["added"] == "JKT-12"
    # OpenTelemetry: one execute_tool span per call, under the step's span
    by_name: dict[str, list[Any]] = {}
    for s in spans.get_finished_spans():
        by_name.setdefault(s.name, []).append(s)
    (step_span,) = by_name["step answer"]
    tool_spans = by_name["execute_tool add_to_cart"]
    assert len(tool_spans) == 2
    ok = next(s for s in tool_spans if s.attributes["chainrun.tool.status"] == "ok")
    bad = next(s for s in tool_spans if s.attributes["chainrun.tool.status"] != "ok")
    assert ok.parent.span_id == step_span.context.span_id
    assert ok.attributes["gen_ai.operation.name"] == "execute_tool"
    assert ok.attributes["gen_ai.tool.name"] == "add_to_cart"
    assert ok.attributes["gen_ai.tool.call.id"] == "call_2"
    assert ok.attributes["chainrun.tool.idempotency_key"] == rows[1].idempotency_key
    assert json.loads(ok.attributes["gen_ai.tool.call.arguments"]) == {"sku": "JKT-12", "qty": 2}
    assert bad.attributes["error.type"] == "invalid_arguments"
    assert (ok.end_time - ok.start_time) / 1e6 >= 0
    # chainrun show lists them in the turn
    result = CliRunner().invoke(app, ["show", str(turn["run_id"]), "--db", str(db)],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "add_to_cart" in result.output and "invalid_arguments" in result.output
    assert f"{rows[1].idempotency_key}" in result.output
    shown = CliRunner().invoke(app, ["show", str(turn["run_id"]), "--db", str(db), "--json"])
    doc = json.loads(shown.output)
    assert [t["status"] for t in doc["turns"][0]["tool_calls"]] == ["invalid_arguments", "ok"]

