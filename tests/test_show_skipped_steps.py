"""``chainrun show`` says why a routed step was skipped (the reason it was logged with),
under the turn's waterfall, as ``--json`` always did.

Before: the table said ``skipped`` and nothing more; the reason was in ``--json`` only.
"""

from __future__ import annotations

from pathlib import Path

from cli_runner import chainrun

from chainrun.log.rows import StepRow, TurnLog, TurnRow
from chainrun.log.store import Store

WHY = "when: label is 'order_status', one of order_status, returns, sizing"


def test_show_prints_a_skipped_steps_reason(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as store:
        run = store.create_run("replay", "{}")
        turn = TurnLog(TurnRow(input="Where is my order 1042?", status="ok", duration_ms=40.0,
                               label="order_status"))  # fmt: skip
        turn.steps = [
            StepRow(step="classify", status="ok", duration_ms=1.0),
            StepRow(step="retrieve", status="skipped", detail={"skipped": WHY}),
            StepRow(step="policy", status="ok", duration_ms=1.0),
            StepRow(step="compose", status="ok", duration_ms=30.0),
        ]
        store.log_turn(run, turn)
        store.finish_run(run, "complete")
    res = chainrun("show", "1", "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert f"\n  retrieve skipped: {WHY}\n" in res.stdout, res.stdout
    assert res.stdout.count(" skipped: ") == 1  # only the step that was skipped
