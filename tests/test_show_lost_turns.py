"""``chainrun show`` of a run with a lost turn says what the log knows of it.

Before: a turn logged ``lost`` (its process ended before its rows were written: a serve
worker killed mid-turn) printed ``(-) lost  ms, answer TTFT - ms, ...``: a unit with no
number, no reason, an empty answer line and two empty tables. Here the lost turn is
logged as the log's own recovery logs it (a claimed turn index whose run ended), beside
an ok turn and an errored one with no answer.
"""

from __future__ import annotations

import re
from pathlib import Path

from cli_runner import chainrun

from chainrun.log.lifecycle import log_lost_turns
from chainrun.log.rows import StepRow, TurnLog, TurnRow
from chainrun.log.store import Store

STARTED = "2026-12-03T14:00:00+00:00"


def _log_with_a_lost_turn(db: Path) -> None:
    with Store.open(db) as store:
        run = store.create_run("live", "{}")
        ok = TurnLog(TurnRow(input="hello", output="Hi!", status="ok", duration_ms=812.4,
                             answer_ttft_ms=140.2, answer_done_ms=655.0, label="greeting",
                             conversation_id="c1", turn_index=1))  # fmt: skip
        ok.steps = [StepRow(step="compose", status="ok", duration_ms=650.0)]
        store.log_turn(run, ok)
        failed = TurnLog(TurnRow(input="and?", status="error", duration_ms=30.0,
                                 error_type="timeout", conversation_id="c2",
                                 turn_index=1))  # fmt: skip
        failed.steps = [StepRow(step="compose", status="failed_closed", duration_ms=30.0)]
        store.log_turn(run, failed)
        with store.log.transaction():  # the claim of a turn whose process then died
            store.claim_turn_index("c1", run_id=run, message="where is my order?",
                                   started_at=STARTED, request_id="req-7")  # fmt: skip
        with store.log.transaction():
            assert len(log_lost_turns(store.log, run)) == 1
        store.finish_run(run, "interrupted")


def test_show_says_what_is_known_of_a_lost_turn(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    _log_with_a_lost_turn(db)
    res = chainrun("show", "1", "--db", str(db))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    lost = next(ln for ln in out.splitlines() if "(req-7)" in ln)
    assert "lost (process_ended: its process ended before the turn's rows were written)" in lost
    assert f"started {STARTED}" in lost and "duration unknown" in lost
    assert "no answer" in lost and "label=unknown" in lost
    assert "  < (no answer: the turn was lost)" in out
    # on every turn's line a unit always follows a number, and no unknown time reads 0
    turn_lines = [ln for ln in out.splitlines() if ln.startswith("turn ")]
    assert len(turn_lines) == 3, out
    for line in turn_lines:
        assert not re.search(r"(?<!\d) ms\b", line), line
        assert " 0 ms" not in line, line
    # the ok turn keeps its times; the errored one has none of the answer's
    assert "ok 812 ms, answer TTFT 140 ms, answer done 655 ms" in out
    assert "error (timeout) 30 ms, answer TTFT -, answer done -," in out
    # no empty step or call table under the lost turn: the next thing is another turn's
    after = out.split("  < (no answer: the turn was lost)\n", 1)[1].lstrip("\n")
    assert after.startswith(("conversation ", "turn ", "run 1 (live, interrupted)")), after
