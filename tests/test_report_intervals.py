"""Reports give every percentile and rate its n and a 95% interval; show's text and a
closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from chainrun.log.store import Store


def chainrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip



# -- 5. every percentile with n and an interval; 6. show's text and a closed pipe ---------


def _log_run(db: Path, n: int = 120, label: str | None = None) -> int:
    from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow

    with Store.open(db) as s:
        run = s.create_run("replay", "{}", label=label)
        for i in range(n):
            ms = 10.0 + i
            hedged = i % 4 == 0
            s.log_turn(run, TurnLog(
                TurnRow(input="m", output="o", duration_ms=ms + 5, answer_ttft_ms=ms,
                        answer_done_ms=ms + 4),
                steps=[StepRow(step="compose", kind="llm", duration_ms=ms,
                               hedge_delay_ms=20.0, hedge_fired=hedged,
                               hedge_won=hedged and i % 8 == 0)],
                calls=[CallRow(step="compose", ttft_ms=5.0 + i % 7, duration_ms=ms,
                               outcome="not_fired")],
            ))  # fmt: skip
        s.finish_run(run, "complete")
    return run


def test_reports_give_every_percentile_and_rate_an_interval(tmp_path: Path) -> None:
    from chainrun.analysis.summary import hedge_stats, latency_summary

    db = tmp_path / "log.db"
    run = _log_run(db)
    with Store.open(db, create=False) as s:
        summary = latency_summary(s, run)
        hs = hedge_stats(s, run)["steps"]["compose"]
    assert summary["turn"]["p50_ci"][0] <= summary["turn"]["p50_ms"] <= summary["turn"]["p50_ci"][1]
    assert summary["turn"]["p90_ci"] is not None
    step = summary["steps"]["compose"]
    assert step["p50_ci"] and step["p90_ci"] and step["ttft_p50_ci"] and step["ttft_n"] == 120
    lo, hi = hs["fire_rate_ci95"]
    assert 0 <= lo < hs["fire_rate"] == 0.25 < hi <= 1
    assert hs["win_rate_ci95"][0] < hs["win_rate"] < hs["win_rate_ci95"][1]

    wide = {**os.environ, "COLUMNS": "250"}
    shown = chainrun("show", str(run), "--db", str(db), env=wide)
    assert shown.returncode == 0, shown.stderr
    assert "p50 ms [95% CI]" in shown.stdout and "None" not in shown.stdout
    turn = summary["turn"]
    assert f"{turn['p50_ms']:.0f} [{turn['p50_ci'][0]:.0f}, {turn['p50_ci'][1]:.0f}]" in (
        shown.stdout
    )
    hedge = chainrun("hedge-stats", str(run), "--db", str(db), env=wide)
    assert "fire rate [95% CI]" in hedge.stdout
    assert f"0.250 [{lo:.3f}, {hi:.3f}]" in hedge.stdout
    cmp = chainrun("compare", str(run), str(run), "--db", str(db), env=wide)
    assert cmp.returncode == 0, cmp.stderr
    assert "p50 A [95% CI]" in cmp.stdout
    assert f"{turn['p50_ms']:.0f} [{turn['p50_ci'][0]:.0f}, {turn['p50_ci'][1]:.0f}]" in (
        cmp.stdout
    )


def test_show_prints_no_python_reprs_and_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    run = _log_run(db, n=300)
    proc = subprocess.run(
        f"{sys.executable} -m chainrun show {run} --db {db} | head -1",
        shell=True, capture_output=True, text=True, timeout=120,
        executable="/bin/bash",
    )  # fmt: skip
    assert proc.stdout == f"run {run}: replay complete label=- source=-\n"
    assert proc.stderr == ""
    status = subprocess.run(
        f"{sys.executable} -m chainrun show {run} --db {db} | head -1 >/dev/null; "
        'echo "${PIPESTATUS[0]}"',
        shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash",
    )  # fmt: skip
    assert status.stdout.strip() == "141"  # as `seq 1000000 | head -1`: killed by SIGPIPE
    assert status.stderr == ""
