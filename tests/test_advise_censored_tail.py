"""advise: censored attempts (cancelled losers) and the tail past the longest logged time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from chainrun.log.store import Store


def chainrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip



# -- 2. advise: a loser cancelled at 24 ms is not "never answers" --------------------------


def log_fast_hedged_classify(store: Store, n: int = 300, seed: int = 11) -> int:
    """The fast lab with a classify hedge (delay p95, 5 ms to start): every call answers in
    <= 23 ms; a few primaries were cancelled at 23.9 ms, longer than the slowest answer."""
    import random

    from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow

    rng = random.Random(seed)
    hedge = {"delay": "p95", "initial_delay_ms": 5, "max_attempts": 2}
    run = store.create_run("replay", json.dumps(
        {"steps": {"classify": {"deadline_s": 3.0, "hedge": hedge}}}))  # fmt: skip
    for i in range(n):
        if i % 30 == 0:  # the primary lost to the copy sent at 5 ms, cancelled at 23.9 ms
            calls = [
                CallRow(step="classify", outcome="cancelled"),
                CallRow(step="classify", attempt=2, started_offset_ms=5.0, ttft_ms=18.9,
                        duration_ms=18.9, outcome="duplicate"),
            ]  # fmt: skip
            step = StepRow(step="classify", duration_ms=23.9, n_attempts=2,
                           hedge_delay_ms=5.0, hedge_fired=True, hedge_won=True)  # fmt: skip
        else:
            ms = rng.uniform(3.0, 23.0)
            calls = [CallRow(step="classify", ttft_ms=ms, duration_ms=ms, outcome="not_fired")]
            step = StepRow(step="classify", duration_ms=ms, n_attempts=1, hedge_delay_ms=5.0)
        store.log_turn(run, TurnLog(TurnRow(input="m"), steps=[step], calls=calls))
    return run


def test_advise_puts_the_censored_tail_at_the_longest_time_not_never(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from chainrun.analysis.advise import advise_from_log
    from chainrun.cli import app

    with Store.open(":memory:") as store:
        run = log_fast_hedged_classify(store)
        res = advise_from_log(store, run, "classify", deadline_s=3.0, max_extra_calls=1.05,
                     simulations=4000)  # fmt: skip
    # before: the cancelled primaries' leftover Kaplan-Meier mass was drawn as "never",
    # so one attempt missed a 3 s deadline in ~3% of turns although nothing took 24 ms
    assert res["baseline"]["in_time"] == 1.0
    assert res["baseline"]["p99_ms"] is not None and res["baseline"]["p99_ms"] < 30
    tail = res["censored_tail"]
    assert tail["at_ms"] == 23.9 and 0 < tail["share"] < 0.2 and not tail["beyond_deadline"]
    assert "None" not in res["recommendation"]["reason"]
    lo, hi = res["validation"]["observed"]["extra_calls_per_turn_ci95"]
    assert 0 <= lo < res["validation"]["observed"]["extra_calls_per_turn"] < hi <= 1

    db = tmp_path / "log.db"
    with Store.open(db) as s:
        run = log_fast_hedged_classify(s)
    runner = CliRunner()
    for bad in ("0", "-1"):
        out = runner.invoke(app, ["advise", "--run", str(run), "--step", "classify", "--db",
                                  str(db), "--deadline-s", bad])  # fmt: skip
        assert out.exit_code == 2
        assert "--deadline-s must be > 0 s" in " ".join(out.output.split())


def test_a_deadline_cut_call_still_misses_the_deadline() -> None:
    """Efron's tail sits just above the longest time: a call cut at the 3 s deadline (the
    longest logged time) is not counted in time at a 3 s deadline."""
    import numpy as np

    from chainrun.analysis.advise import _Calls, _impute

    nan = float("nan")
    calls = _Calls(
        settle=np.array([100.0, 200.0, nan]), ttft=np.array([100.0, 200.0, nan]),
        per_token=np.full(3, nan), work=np.full(3, nan), censored_at=np.array([nan, nan, 3000.0]),
        stream=False, n_split=0, n_errors_fast=0,
    )  # fmt: skip
    out = _impute(calls, np.random.default_rng(0))
    assert out[2] > 3000.0 and out[2] < 3000.001
