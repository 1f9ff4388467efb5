"""chainrun advise: the hedge delay from a step's logged calls."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from typer.testing import CliRunner

from chainrun.analysis.advise import advise_from_log, logged_candidate_delays
from chainrun.cli import app
from chainrun.errors import UserInputError
from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow
from chainrun.log.store import Store


def _config(deadline_s: float, hedge: dict | None = None) -> str:  # type: ignore[type-arg]
    step: dict = {"deadline_s": deadline_s}  # type: ignore[type-arg]
    if hedge:
        step["hedge"] = hedge
    return json.dumps({"steps": {"guard": step}})


def log_bimodal_guard(store: Store, n: int = 400, seed: int = 5) -> int:
    """An unhedged guard on a bimodal classifier with a 3 s deadline: slow calls time out."""
    rng = random.Random(seed)
    run = store.create_run("replay", _config(3.0))
    for _ in range(n):
        fast = rng.random() < 0.5
        ms = rng.uniform(100, 300) + rng.uniform(2, 15)  # plus client overhead
        if fast:
            call = CallRow(step="guard", ttft_ms=ms, duration_ms=ms, output_tokens=1,
                              n_chunks=1, outcome="not_fired")  # fmt: skip
            step = StepRow(step="guard", duration_ms=ms, n_attempts=1)
        else:
            call = CallRow(step="guard", outcome="error", error_type="timeout")
            step = StepRow(step="guard", status="failed_closed", duration_ms=3000.0,
                              error_type="timeout", n_attempts=1)  # fmt: skip
        store.log_turn(run, TurnLog(TurnRow(input="m"), steps=[step], calls=[call]))
    return run


def log_work_noise(store: Store, n: int = 400, seed: int = 6) -> int:
    """Latency = work (tokens x 15 ms, tokens vary a lot) + small noise: hedging cannot help."""
    rng = random.Random(seed)
    run = store.create_run("replay", _config(60.0))
    for _ in range(n):
        tokens = rng.randint(20, 400)
        ms = tokens * 15.0 + rng.lognormvariate(np.log(30), 0.3)
        call = CallRow(step="guard", ttft_ms=ms, duration_ms=ms, output_tokens=tokens,
                          n_chunks=1, outcome="not_fired")  # fmt: skip
        step = StepRow(step="guard", duration_ms=ms, n_attempts=1)
        store.log_turn(run, TurnLog(TurnRow(input="m"), steps=[step], calls=[call]))
    return run


def test_bimodal_guard_gets_copies_just_after_the_fast_path(store: Store) -> None:
    run = log_bimodal_guard(store)
    res = advise_from_log(store, run, "guard", max_extra_calls=1.05, simulations=5000)
    assert res["n_censored"] > 150 and res["baseline"]["in_time"] == pytest.approx(0.5, abs=0.06)
    rec = res["recommendation"]
    assert rec["hedge"]
    assert 300 < rec["delay_ms"] < 420
    assert 7 <= rec["attempts"] <= 9
    assert rec["predicted"]["in_time"] >= 0.99
    assert rec["predicted"]["extra_calls_per_turn"] <= 1.05
    assert f"delay_ms = {rec['delay_ms']:g}" in res["toml"]
    assert f"max_attempts = {rec['attempts']}" in res["toml"]
    # a tight load budget buys fewer copies
    tight = advise_from_log(store, run, "guard", max_extra_calls=0.6,
                            simulations=5000)["recommendation"]  # fmt: skip
    assert tight["hedge"] and tight["predicted"]["extra_calls_per_turn"] <= 0.6
    assert tight["predicted"]["in_time"] < rec["predicted"]["in_time"]


def test_long_answers_do_not_look_hedgeable(store: Store) -> None:
    run = log_work_noise(store)
    res = advise_from_log(store, run, "guard", max_extra_calls=0.5, simulations=5000)
    assert res["per_token_fit_ms"] == pytest.approx(15.0, rel=0.05)
    assert res["recommendation"]["hedge"] is False
    assert "do not hedge" in res["toml"]
    # every candidate's copies lose: win rate near 0 wherever the hedge fired
    for c in res["candidates"]:
        assert c["win_rate"] is None or c["win_rate"] < 0.05


def test_candidates_include_the_gap_of_a_bimodal_distribution() -> None:
    lat = np.array([100.0, 200, 280, 300] * 10 + [np.inf] * 40)
    ds = logged_candidate_delays(lat, 3000)
    assert any(300 < d <= 350 for d in ds) and all(d < 3000 for d in ds)


def test_errors(store: Store) -> None:
    run = log_bimodal_guard(store, n=20)
    with pytest.raises(UserInputError, match="no logged calls for step 'nope'"):
        advise_from_log(store, run, "nope")
    with pytest.raises(UserInputError, match="no such run"):
        advise_from_log(store, 99, "guard")


def test_cli(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "log.db"
    with Store.open(db) as s:
        run = log_bimodal_guard(s, n=200)
    runner = CliRunner()
    res = runner.invoke(app, ["advise", "--run", str(run), "--step", "guard", "--db", str(db),
                              "--max-extra-calls", "1.05", "--simulations", "2000"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "[steps.guard.hedge]" in res.output and "delay_ms" in res.output
    res = runner.invoke(app, ["advise", "--run", str(run), "--step", "guard", "--db", str(db),
                              "--json", "--simulations", "2000"])  # fmt: skip
    doc = json.loads(res.stdout)
    assert {"recommendation", "candidates", "baseline", "toml", "validation"} <= set(doc)
    bad = runner.invoke(app, ["advise", "--run", str(run), "--step", "x", "--db", str(db)])
    assert bad.exit_code == 2


def test_kaplan_meier_matches_the_textbook_example() -> None:
    """Kaplan and Meier's product-limit estimate on a small censored sample."""
    from chainrun.statistics.survival import kaplan_meier  # the hedge window's too

    times = [3.0, 4.0, 5.0, 5.0, 8.0, 10.0]
    observed = [True, False, True, True, False, True]
    km = kaplan_meier(list(zip(times, observed, strict=True)))
    # 6 at risk at 3 -> 5/6; 4 censored; 4 at risk at 5 (two events) -> 5/6 * 2/4;
    # 8 censored; 1 at risk at 10 -> 0
    assert list(km.times) == [3.0, 5.0, 10.0]
    assert km.surv[0] == pytest.approx(5 / 6)
    assert km.surv[1] == pytest.approx(5 / 6 * 2 / 4)
    assert km.surv[2] == pytest.approx(0.0)
    assert (km.n, km.n_censored, km.tail_ms) == (6, 2, 10.0)


def test_cancelled_slow_primaries_are_imputed_as_slow(store: Store) -> None:
    """A hedged run: slow primaries were cancelled at ~1.1 s when the copy won; a few fast
    calls happened to take 1.2-1.4 s. The cancelled ones must not all become those."""
    rng = random.Random(9)
    run = store.create_run("replay", _config(3.0, {"delay_ms": 1000, "max_attempts": 2}))
    for _ in range(300):
        if rng.random() < 0.5:
            ms = rng.uniform(100, 300) if rng.random() < 0.97 else rng.uniform(1200, 1400)
            calls = [CallRow(step="guard", ttft_ms=ms, duration_ms=ms, outcome="not_fired")]
            step = StepRow(step="guard", duration_ms=ms, n_attempts=1)
        elif rng.random() < 0.5:  # slow primary, fast copy at 1 s: the primary is cut
            copy_ms = rng.uniform(100, 300)
            calls = [
                CallRow(step="guard", outcome="cancelled"),
                CallRow(step="guard", attempt=2, started_offset_ms=1000.0, ttft_ms=copy_ms,
                           duration_ms=copy_ms, outcome="duplicate"),
            ]  # fmt: skip
            step = StepRow(step="guard", duration_ms=1000 + copy_ms, n_attempts=2,
                              hedge_delay_ms=1000.0, hedge_fired=True, hedge_won=True)  # fmt: skip
        else:  # both slow: cut by the deadline
            calls = [
                CallRow(step="guard", outcome="error", error_type="timeout"),
                CallRow(step="guard", attempt=2, started_offset_ms=1000.0, outcome="error",
                           error_type="timeout"),
            ]  # fmt: skip
            step = StepRow(step="guard", status="failed_closed", duration_ms=3000.0,
                              n_attempts=2, hedge_delay_ms=1000.0, hedge_fired=True)  # fmt: skip
        store.log_turn(run, TurnLog(TurnRow(input="m"), steps=[step], calls=calls))
    res = advise_from_log(store, run, "guard", deadline_s=3.0, max_extra_calls=1.0,
                          simulations=4000)  # fmt: skip
    # one attempt: only the fast half is in time (imputing the cancelled slow primaries
    # from the answered calls above their cut, 1.2-1.4 s, would give about 1.0)
    assert res["baseline"]["in_time"] == pytest.approx(0.5, abs=0.06)
    v = res["validation"]
    assert v is not None and v["predicted"]["in_time"] == pytest.approx(0.75, abs=0.06)


def test_validation_counts_the_turns_a_fail_closed_guard_refused(store: Store) -> None:
    """Copies every 1 s on a half-slow guard that fails closed: the races every attempt
    lost end in refused turns. Over completed turns only the win rate would read 1.0;
    the validation counts every turn, so the prediction (about 0.5) is inside."""
    from chainrun.analysis.summary import hedge_stats

    rng = random.Random(4)
    run = store.create_run("replay", _config(3.0, {"delay_ms": 1000, "max_attempts": 2}))
    for _ in range(300):
        status = "ok"
        if rng.random() < 0.5:
            ms = rng.uniform(100, 300)
            calls = [CallRow(step="guard", ttft_ms=ms, duration_ms=ms, outcome="not_fired")]
            step = StepRow(step="guard", duration_ms=ms, n_attempts=1, hedge_delay_ms=1000.0)
        elif rng.random() < 0.5:
            copy_ms = rng.uniform(100, 300)
            calls = [
                CallRow(step="guard", outcome="cancelled"),
                CallRow(step="guard", attempt=2, started_offset_ms=1000.0, ttft_ms=copy_ms,
                           duration_ms=copy_ms, outcome="duplicate"),
            ]  # fmt: skip
            step = StepRow(step="guard", duration_ms=1000 + copy_ms, n_attempts=2,
                              hedge_delay_ms=1000.0, hedge_fired=True, hedge_won=True)  # fmt: skip
        else:
            status = "refused"  # the guard failed closed: the turn was refused
            calls = [
                CallRow(step="guard", outcome="error", error_type="timeout"),
                CallRow(step="guard", attempt=2, started_offset_ms=1000.0, outcome="error",
                           error_type="timeout"),
            ]  # fmt: skip
            step = StepRow(step="guard", status="failed_closed", duration_ms=3000.0,
                              n_attempts=2, hedge_delay_ms=1000.0, hedge_fired=True)  # fmt: skip
        turn = TurnRow(input="m", status=status)  # type: ignore[arg-type]
        store.log_turn(run, TurnLog(turn, steps=[step], calls=calls))
    completed = hedge_stats(store, run)["steps"]["guard"]
    every = hedge_stats(store, run, include_failed=True)["steps"]["guard"]
    assert completed["win_rate"] == 1.0  # the lost races are all in refused turns
    assert every["n"] == 300 and every["win_rate"] == pytest.approx(0.5, abs=0.1)
    v = advise_from_log(store, run, "guard", max_extra_calls=1.0, simulations=4000)["validation"]
    assert v is not None and v["observed"]["n_armed"] == 300
    assert v["inside"] == {"fire_rate": True, "win_rate": True, "extra_calls_per_turn": True}


def test_the_pick_comes_with_bootstrap_intervals(store: Store) -> None:
    run = log_bimodal_guard(store)
    rec = advise_from_log(store, run, "guard", max_extra_calls=1.05,
                          simulations=5000)["recommendation"]  # fmt: skip
    iv = rec["predicted"]["intervals"]
    lo, hi = iv["extra_calls_per_turn_ci95"]
    assert iv["n_resamples"] == 200 and lo < rec["predicted"]["extra_calls_per_turn"] < hi
    assert hi - lo > 0.05  # 400 calls do not pin a half-slow classifier's share down
    assert iv["in_time_ci95"][0] <= rec["predicted"]["in_time"] <= iv["in_time_ci95"][1]
    assert "95% bootstrap" in rec["reason"]
