"""A logged turn's tool calls as each reader shows them: ``chainrun show`` (text and
JSON), the serve faces' turn summary, and the OpenTelemetry ``execute_tool`` spans."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typer.testing import CliRunner

from chainrun.cli import app
from chainrun.events import TurnFinished
from chainrun.log.redaction import Redactor, redact_turn
from chainrun.log.rows import CallRow, StepRow, ToolCallRow, TurnLog, TurnRow
from chainrun.log.store import Store
from chainrun.serve.turns import turn_summary
from chainrun.telemetry.otel import Telemetry


def tool_rows(turn_id: int) -> list[ToolCallRow]:
    return [
        ToolCallRow(step="compose", round=1, attempt=1, call_id="call_1", tool="add_to_cart",
                    arguments='{"sku": "JKT-12", "qty": "two"}', status="invalid_arguments",
                    idempotency_key=f"{turn_id}:call_1", side_effects=True,
                    error_type="invalid_arguments",
                    error_message="the arguments break the tool's schema: $.qty: 'two' is "
                                  "not of type 'integer'"),
        ToolCallRow(step="compose", round=2, attempt=3, call_id="call_2", tool="add_to_cart",
                    arguments='{"sku": "JKT-12", "qty": 2}', status="ok",
                    idempotency_key=f"{turn_id}:call_2", side_effects=True,
                    started_offset_ms=40.0, duration_ms=12.5, result='{"added": true}'),
    ]  # fmt: skip


def logged_turn(store: Store) -> tuple[int, int]:
    run_id = store.create_run("live", "{}")
    turn = TurnRow(input="put 2 of JKT-12 in my cart", output="Added.", duration_ms=90.0,
                   started_at=datetime.now(UTC).isoformat(timespec="milliseconds"))  # fmt: skip
    turn_id = store.log_turn(run_id, TurnLog(
        turn, [StepRow(step="compose", started_offset_ms=1.0, duration_ms=80.0, n_attempts=3)],
        [CallRow(step="compose", attempt=a, duration_ms=10.0, started_offset_ms=0.0)
         for a in (1, 2, 3)],
        tool_rows(0)))  # fmt: skip
    return run_id, turn_id


def test_show_lists_a_turns_tool_calls(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as store:
        run_id, turn_id = logged_turn(store)
    text = CliRunner().invoke(app, ["show", str(run_id), "--db", str(db)])
    assert text.exit_code == 0, text.output
    out = " ".join(text.output.split())
    assert "add_to_cart call_2: key=0:call_2" in out and '"qty": 2' in out
    assert "invalid_arguments" in out and "$.qty: 'two' is not of type 'integer'" in out
    doc = json.loads(CliRunner().invoke(app, ["show", str(run_id), "--db", str(db),
                                              "--json"]).output)  # fmt: skip
    (turn,) = doc["turns"]
    assert turn["id"] == turn_id
    assert [(t["round"], t["attempt"], t["status"]) for t in turn["tool_calls"]] == [
        (1, 1, "invalid_arguments"), (2, 3, "ok")]
    assert turn["tool_calls"][1]["duration_ms"] == 12.5


def test_the_turn_summary_and_spans_carry_the_tool_calls() -> None:
    with Store.open(":memory:") as store:
        run_id, turn_id = logged_turn(store)
        logged = store.turn(turn_id)
    assert logged is not None
    done = TurnFinished(turn_id=turn_id, run_id=run_id, output="Added.", status="ok",
                        duration_ms=90.0)  # fmt: skip
    (step,) = turn_summary(logged, done, "conv", {})["steps"]
    assert [(t["tool"], t["status"], t["started_ms"]) for t in step["tool_calls"]] == [
        ("add_to_cart", "invalid_arguments", None), ("add_to_cart", "ok", 40.0)]
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    Telemetry(tp, workflow="shop").turn_logged(logged)
    tools = [s for s in spans.get_finished_spans() if s.name == "execute_tool add_to_cart"]
    assert len(tools) == 2
    step_span = next(s for s in spans.get_finished_spans() if s.name == "step compose")
    ok = next(s for s in tools if s.attributes["gen_ai.tool.call.id"] == "call_2")
    bad = next(s for s in tools if s.attributes["gen_ai.tool.call.id"] == "call_1")
    assert ok.parent.span_id == step_span.context.span_id
    assert ok.attributes["gen_ai.operation.name"] == "execute_tool"
    assert ok.attributes["gen_ai.tool.name"] == "add_to_cart"
    assert ok.attributes["gen_ai.tool.type"] == "function"
    assert ok.attributes["chainrun.tool.idempotency_key"] == "0:call_2"
    assert ok.attributes["chainrun.hedge.attempt"] == 3
    assert ok.attributes["chainrun.tool.round"] == 2
    assert (ok.end_time - ok.start_time) / 1e6 == 12.5
    assert (ok.start_time - step_span.start_time) / 1e6 == 40.0  # its offset in the step
    assert bad.attributes["error.type"] == "invalid_arguments"
    assert bad.end_time == bad.start_time == step_span.end_time  # never ran: at the step's end


def test_logged_tool_arguments_and_results_are_redacted() -> None:
    row = ToolCallRow(step="s", call_id="c", tool="t", status="ok",
                      arguments='{"email": "ann@example.com"}', result='{"to": "ann@example.com"}',
                      error_message="mail ann@example.com failed")  # fmt: skip
    log = TurnLog(TurnRow(input="hi"), tool_calls=[row])
    redact_turn(log, Redactor(["email"]))
    assert json.loads(row.arguments or "") == {"email": "[email]"}
    assert "ann@" not in (row.result or "") and "ann@" not in (row.error_message or "")
