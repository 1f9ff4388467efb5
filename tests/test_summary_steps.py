"""The run summary lists steps in the chain's order although a routed step was skipped in
the first turn, and its answer-TTFT row shows the TTFT in the TTFT column (a new user read
a lone "0% cached" there as a missing figure)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from chainrun.analysis.summary import latency_summary
from chainrun.cli.tables import latency_table
from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow
from chainrun.log.store import Store

ORDER = ("classify", "retrieve", "policy", "compose")


def _turn(skipped: str, answer_ttft_ms: float) -> TurnLog:
    turn = TurnLog(TurnRow(input="m", status="ok", duration_ms=500.0,
                           answer_ttft_ms=answer_ttft_ms))  # fmt: skip
    turn.steps = [
        StepRow(step=name, status="skipped" if name == skipped else "ok", duration_ms=10.0)  # type: ignore[arg-type]
        for name in ORDER
    ]
    turn.calls = [CallRow(step="compose", ttft_ms=answer_ttft_ms - 20, output_tokens=9)]
    return turn


def test_steps_in_chain_order_and_the_answer_ttft_cell(tmp_path: Path) -> None:
    with Store.open(tmp_path / "log.db") as store:
        run = store.create_run("replay", "{}")
        store.log_turn(run, _turn("retrieve", 300.0))  # a policy question first
        store.log_turn(run, _turn("policy", 400.0))
        store.finish_run(run, "complete")
        summary = latency_summary(store, run)
    assert list(summary["steps"]) == list(ORDER)
    assert summary["steps"]["retrieve"]["n_ran"] == 1
    console = Console(width=200, record=True)
    console.print(latency_table(summary))
    row = next(line for line in console.export_text().splitlines() if "answer TTFT" in line)
    cells = [c.strip() for c in row.split("│")]
    p50, ttft = cells[3], cells[5]
    assert p50 == "300 -*" and ttft.startswith(p50) and "cached" in ttft, row
