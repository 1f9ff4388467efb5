"""The hedge delay from the log (``chainrun advise``): replay a step's logged calls through
candidate delays and numbers of attempts, and recommend one (or "do not hedge").

What a copy shares with its original (Dean and Barroso, "The Tail at Scale", CACM 2013):
a call's time is work W (its generated tokens, the same for both copies) plus
serving noise N (TTFT and time per token, drawn independently per copy). So a simulated
turn keeps the primary's own logged call (its W and its noise) and gives each copy the
same W with the noise of another logged call, resampled: the copy of a long answer is a
long answer too, and long answers do not look hedgeable when they are not. Where the log
cannot split a call into W and N (a non-streamed call, or a stream of one chunk), the
whole latency is taken as noise (``work_split`` says how many calls were split).

The log is censored: a loser closed when its race settled, or an attempt cut by the
deadline, is known only to take longer than it ran. Such a call is replaced in each
simulated draw by a latency drawn from the Kaplan-Meier estimate given that it is longer:
the slow calls a hedged run cancelled still count as slow. When the longest logged time
is a censored one, the estimate leaves mass beyond the last observed answer; it is put
just above the longest logged time (Efron's tail convention: B. Efron, "The two sample
problem with censored data", Proc. 5th Berkeley Symposium 4, 1967, treats the largest
observation as an event), a lower bound: a loser cancelled at 24 ms took more than
24 ms, not "never". A call cut by the deadline ran the whole deadline, so it still
misses it; for a longer ``--deadline-s`` than the run's, ``censored_tail`` says how much
of the prediction rests on that lower bound (its ``in_time`` is then an upper bound).

Predictions per (delay, attempts): the step's p50 and p99, the share inside the deadline,
extra calls per turn, fire rate and win rate (defined in :mod:`chainrun.hedging.stats`),
each from ``simulations`` resampled turns. Candidate delays run from the step's p50 to its
p99 of the logged latencies, plus the gaps of a bimodal distribution (just above the end
of each cluster). The pick maximises the share in time, then minimises the p99, then the
extra calls, within ``max_extra_calls`` and the deadline; it is "do not hedge" when no
candidate beats one attempt by more than the Monte Carlo noise.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from chainrun.analysis.simulate import hedged_race
from chainrun.analysis.summary import hedge_stats
from chainrun.errors import UserInputError
from chainrun.hedging.policy import MAX_ATTEMPTS_LIMIT
from chainrun.hedging.stats import fire_rate, win_rate
from chainrun.log.store import Store
from chainrun.statistics.intervals import wilson_interval
from chainrun.statistics.ranks import nearest_rank
from chainrun.statistics.survival import kaplan_meier

#: outcomes of calls that answered (their latency is known)
_ANSWERED = ("not_fired", "primary", "duplicate", "shadow_finished")
#: outcomes of calls cut short (their latency is longer than they ran)
_CUT = ("cancelled", "error")
#: a candidate must beat the next best by more than this share in time to count as better
_SHARE_TOL = 0.002
#: resamples of the logged calls behind the intervals of the pick's prediction
BOOTSTRAP_RESAMPLES = 200


@dataclass
class _Calls:
    """The step's logged calls as arrays (ms); NaN where unknown."""

    settle: np.ndarray  # time to settle (first token for a streamed step, else the answer)
    ttft: np.ndarray
    per_token: np.ndarray  # time per generated token after the first
    work: np.ndarray  # generated tokens (W)
    censored_at: np.ndarray  # for cut calls: they ran at least this long; NaN otherwise
    stream: bool
    n_split: int
    n_errors_fast: int
    #: common time per generated token (ms) for calls the log cannot split: the slope of
    #: latency on tokens over the answered calls (least squares, >= 0); 0 when unknown
    per_token_fit: float = 0.0


def _load_calls(store: Store, run_id: int, step: str) -> _Calls:
    calls = [c for c in store.calls(run_id) if c.step == step]
    if not calls:
        known = sorted({c.step for c in store.calls(run_id)})
        raise UserInputError(
            f"run {run_id}: no logged calls for step {step!r}"
            + (f"; steps with calls: {', '.join(known)}" if known else "")
        )
    step_rows = {s.turn_id: s for s in store.steps(run_id) if s.step == step and s.duration_ms}
    stream = any(bool(c.stream) for c in calls)
    # when each turn's race settled (ms from the step's start): losers were closed then
    settled_at: dict[int | None, float] = {}
    for c in calls:
        took = c.ttft_ms if stream else c.duration_ms
        if c.outcome in ("not_fired", "primary", "duplicate") and took is not None:
            settled_at[c.turn_id] = (c.started_offset_ms or 0.0) + took
    settle, ttft, per_token, work, cens = [], [], [], [], []
    n_split = n_fast_errors = 0
    for c in calls:
        outcome = c.outcome
        if outcome in _ANSWERED and c.error_type in (None, "truncated"):
            t, d, tokens = c.ttft_ms, c.duration_ms, c.output_tokens or c.n_chunks
            if d is None or t is None:
                if d is None and t is None:
                    continue
                t = d = t if t is not None else d
            assert t is not None and d is not None
            if stream and tokens and tokens > 1 and d > t:
                tpt = (d - t) / (tokens - 1)
                n_split += 1
            else:
                tpt = math.nan
            settle.append(t if stream else d)
            ttft.append(t)
            per_token.append(tpt)
            work.append(float(tokens) if tokens else math.nan)
            cens.append(math.nan)
        elif outcome in _CUT:
            timed_out = c.error_type in ("timeout", "DeadlineExceeded")
            if outcome == "error" and not timed_out:
                n_fast_errors += 1  # errors are not hedged and never enter the window
                continue
            row = step_rows.get(c.turn_id)
            end = settled_at.get(c.turn_id) if outcome == "cancelled" else None
            if end is None and row is not None:
                end = row.duration_ms
            ran = None if end is None else end - (c.started_offset_ms or 0.0)
            if ran is None or ran <= 0:
                continue
            settle.append(math.nan)
            ttft.append(math.nan)
            per_token.append(math.nan)
            work.append(math.nan)
            cens.append(ran)
    if not settle:
        raise UserInputError(f"run {run_id}: step {step!r} has no call with a usable latency")
    out = _Calls(
        np.array(settle), np.array(ttft), np.array(per_token), np.array(work), np.array(cens),
        stream, n_split, n_fast_errors,
    )  # fmt: skip
    ok = ~np.isnan(out.settle) & ~np.isnan(out.work)
    if not stream and ok.sum() >= 10 and np.ptp(out.work[ok]) > 0:
        slope = float(np.polyfit(out.work[ok], out.settle[ok], 1)[0])
        out.per_token_fit = max(0.0, slope)
    return out


def censored_tail(calls: _Calls) -> dict[str, Any] | None:
    """The Kaplan-Meier mass beyond the last observed latency, and where it is put.

    Returns ``{share, at_ms}`` (``share`` of calls, 0-1; ``at_ms`` just above the longest
    logged time, a censored one: Efron's tail convention, see the module docstring), or
    None when the longest logged time is an answer (the estimate reaches 0 there).
    """
    cut = np.isnan(calls.settle)
    if not cut.any():
        return None
    times = np.where(cut, calls.censored_at, calls.settle)
    share = kaplan_meier(list(zip(times.tolist(), (~cut).tolist(), strict=True))).tail_share
    if share <= 0:
        return None
    return {"share": round(share, 4), "at_ms": round(float(np.max(times)), 1)}


def _impute(calls: _Calls, rng: np.random.Generator) -> np.ndarray:
    """Latencies (ms) with each censored call replaced by a draw from the Kaplan-Meier
    estimate of the latency given that it exceeds the time the call ran. The estimate's
    mass beyond the last observed latency (when the longest logged time is censored) is
    put just above the longest logged time: Efron's (1967) tail convention, a lower bound
    (the call is known to take longer than it ran, by how much is unknown)."""
    out = calls.settle.copy()
    cut = np.isnan(out)
    if not cut.any():
        return out
    times = np.where(cut, calls.censored_at, out)
    # "just above": a censored call took longer than it ran, so one cut at the deadline
    # still misses it
    tail_ms = float(np.nextafter(np.max(times), np.inf))
    km = kaplan_meier(list(zip(times.tolist(), (~cut).tolist(), strict=True)))
    event_t, surv = np.asarray(km.times, float), np.asarray(km.surv, float)
    for i in np.flatnonzero(cut):
        c = calls.censored_at[i]
        k = int(np.searchsorted(event_t, c, side="right"))
        s_c = surv[k - 1] if k > 0 else 1.0
        # X | X > c: the first event time after c where S falls to u * S(c) or below
        target = rng.random() * s_c
        j = k + int(np.searchsorted(-surv[k:], -target, side="left"))
        out[i] = event_t[j] if j < len(event_t) else tail_ms
    return out


def _simulate(
    calls: _Calls,
    delay_ms: float,
    attempts: int,
    deadline_ms: float,
    simulations: int,
    seed: int | None,
) -> dict[str, Any]:
    """One candidate over ``simulations`` resampled turns; the same ``seed`` gives every
    candidate the same turns (common random numbers), so they differ by policy only."""
    rng = np.random.default_rng(seed)
    n = len(calls.settle)
    base = _impute(calls, rng)
    primary = rng.integers(0, n, simulations)
    others = rng.integers(0, n, (simulations, max(0, attempts - 1)))
    idx = np.concatenate([primary[:, None], others], axis=1)
    split = ~np.isnan(calls.per_token) & ~np.isnan(calls.work)
    w = calls.work[primary]  # the primary's work, carried by every copy
    # a copy whose noise sample can be split takes the primary's W with its own TTFT and
    # time per token; otherwise its own whole latency
    if calls.stream:
        settle = base[idx]  # a streamed step settles on the first token
    else:
        lat = base[idx].copy()
        has_w = ~np.isnan(w)[:, None]
        both = split[idx] & has_w
        rebuilt = calls.ttft[idx] + (w[:, None] - 1) * calls.per_token[idx]
        lat[both] = rebuilt[both]
        # unsplit calls: noise = own latency - own W x the fitted time per token
        tau = calls.per_token_fit
        fit = ~split[idx] & has_w & ~np.isnan(calls.work[idx]) & ~np.isnan(calls.settle[idx])
        moved = calls.settle[idx] - calls.work[idx] * tau + w[:, None] * tau
        lat[fit] = moved[fit]
        settle = lat
    answer, started = hedged_race(settle, delay_ms, attempts, deadline_ms)
    # which attempt won: the earliest settle among those started
    starts = np.arange(attempts) * delay_ms
    finish = np.where(np.arange(attempts)[None, :] < started[:, None], starts + settle, np.inf)
    winner = np.argmin(finish, axis=1)
    # the step's latency: settle, plus the rest of the answer for a streamed step
    total = answer.copy()
    if calls.stream:
        wi = idx[np.arange(simulations), winner]
        rest = np.where(split[wi] & ~np.isnan(w), (w - 1) * calls.per_token[wi], 0.0)
        total = answer + rest
    total = np.where(total <= deadline_ms, total, np.inf)
    fired = started > 1  # the primary was still out at d (before the deadline): a copy went
    won = fired & (winner > 0) & np.isfinite(total)
    in_time = float(np.isfinite(total).mean())
    return {
        "delay_ms": round(float(delay_ms), 1),
        "attempts": attempts,
        "n": simulations,
        "in_time": round(in_time, 4),
        "p50_ms": _q(total, 50),
        "p99_ms": _q(total, 99),
        "extra_calls_per_turn": round(float((started - 1).mean()), 4),
        "fire_rate": _r(fire_rate(int(fired.sum()), simulations)),
        "win_rate": _r(win_rate(int(won.sum()), int(fired.sum()))),
    }


def _resampled(calls: _Calls, idx: np.ndarray) -> _Calls:
    return dataclasses.replace(
        calls, settle=calls.settle[idx], ttft=calls.ttft[idx], per_token=calls.per_token[idx],
        work=calls.work[idx], censored_at=calls.censored_at[idx],
    )  # fmt: skip


def prediction_intervals(
    calls: _Calls, delay_ms: float, attempts: int, deadline_ms: float, simulations: int,
    seed: int,
) -> dict[str, Any]:  # fmt: skip
    """95% percentile-bootstrap intervals of a prediction (Efron and Tibshirani, "An
    Introduction to the Bootstrap", 1993): the logged calls resampled with replacement
    :data:`BOOTSTRAP_RESAMPLES` times, each simulated over ``simulations // 10`` turns
    (at least 1,000). They say how far the prediction moves with another log of the same
    size: 300 calls of a half-slow classifier know its slow share only to about ±0.06,
    and the extra calls of 8 attempts (Σ pᵏ) follow that share steeply.

    Returns ``{n_resamples, in_time_ci95: [lo, hi], extra_calls_per_turn_ci95: [lo, hi]}``.
    """
    rng = np.random.default_rng(seed)
    n = len(calls.settle)
    sims = max(1000, simulations // 10)
    in_time, extra = [], []
    for b in range(BOOTSTRAP_RESAMPLES):
        r = _simulate(_resampled(calls, rng.integers(0, n, n)), delay_ms, attempts,
                      deadline_ms, sims, seed + 1 + b)  # fmt: skip
        in_time.append(r["in_time"])
        extra.append(r["extra_calls_per_turn"])

    def ci(v: list[float]) -> list[float]:
        return [round(float(np.quantile(v, 0.025)), 4), round(float(np.quantile(v, 0.975)), 4)]

    return {"n_resamples": BOOTSTRAP_RESAMPLES, "in_time_ci95": ci(in_time),
            "extra_calls_per_turn_ci95": ci(extra)}  # fmt: skip


def _q(values: np.ndarray, p: int) -> float | None:
    """The ``p``-th percentile (``p`` in percent), nearest rank in exact arithmetic
    (:func:`chainrun.statistics.ranks.nearest_rank`), in ms; None when it lies beyond the deadline
    (inf)."""
    v = float(np.sort(values)[nearest_rank(len(values), p) - 1])
    return None if not math.isfinite(v) else round(v, 1)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def logged_candidate_delays(latencies_ms: np.ndarray, deadline_ms: float) -> list[float]:
    """Delays :func:`advise_from_log` tries, in ms (the live advisor has its own,
    :func:`chainrun.hedging.advisor.candidate_delays`, from the window's survival curve):
    the p50..p99 of the logged latencies (finite ones), and just above the end of each
    cluster of a multi-modal distribution (a gap where the next logged latency is at least
    twice the previous, or the last answer when some calls never answered), all below the
    deadline."""
    finite = np.sort(latencies_ms[np.isfinite(latencies_ms)])
    if not len(finite):
        return []
    out = {float(np.quantile(finite, p / 100)) for p in (50, 60, 70, 80, 90, 95, 99)}
    ends = [lo for lo, hi in itertools.pairwise(finite) if lo > 0 and hi >= 2 * lo]
    if len(finite) < len(latencies_ms):  # calls that never answered: a cluster beyond
        ends.append(float(finite[-1]))
    for lo in ends:
        for margin in (1.05, 1.15, 1.3, 1.5):
            out.add(float(lo * margin))
    return sorted(round(d, 1) for d in out if 0 < d < deadline_ms)


def advise_from_log(
    store: Store,
    run_id: int,
    step: str,
    *,
    deadline_s: float | None = None,
    max_extra_calls: float = 0.1,
    simulations: int = 20_000,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Recommend a hedge delay and number of attempts for ``step`` from run ``run_id``
    (``chainrun advise``): offline, by resampling the run's logged turns. Not the live
    engine's advisor (:func:`chainrun.hedging.advisor.advise`, behind ``delay = "auto"``),
    which predicts from the hedge window's survival curve as the process runs.

    Args:
        deadline_s: the step's deadline (default: the run's configured ``deadline_s``).
        max_extra_calls: the most extra calls per turn a pick may cost on average.
        simulations: resampled turns per candidate.
        seed: of the resampling (None: fresh randomness).

    Returns ``{run_id, step, n_calls, n_censored, n_errors_not_hedged, work_split,
    stream, censored_tail, deadline_s, max_extra_calls, baseline: {...}, candidates: [{delay_ms,
    attempts, n, in_time, p50_ms, p99_ms, extra_calls_per_turn, fire_rate, win_rate}],
    recommendation: {hedge: bool, delay_ms, attempts, reason, predicted: {...,
    intervals: {n_resamples, in_time_ci95, extra_calls_per_turn_ci95}}},
    toml: str, validation: {...} or null}``. ``validation`` compares, for the delay the
    run itself used, the predicted fire rate, win rate and extra calls with the run's own
    values and their 95% Wilson intervals; its ``observed`` also holds the copies actually
    sent per call and the due copies not sent (``unsent``, by reason), and ``note`` says
    when fires sent no copy (the prediction sends every due copy; a fire with no copy
    sent is a lost fire in the observed win rate), else null. ``censored_tail`` is
    :func:`censored_tail` plus ``beyond_deadline`` (null when no mass is left): when it
    is false and ``share`` is not small, ``in_time`` is an upper bound (those calls are
    placed at the least they took).

    Raises:
        UserInputError: no such run, no calls for the step, or bad arguments.
    """
    if max_extra_calls < 0 or simulations < 100:
        raise UserInputError(
            f"advise: need --max-extra-calls >= 0 and simulations >= 100, got "
            f"{max_extra_calls}, {simulations}"
        )
    run = store.get_run(run_id)
    config = json.loads(run.config) if run.config else {}
    step_cfg = config.get("steps", {}).get(step, {})
    if deadline_s is None:
        deadline_s = step_cfg.get("deadline_s")
    calls = _load_calls(store, run_id, step)
    if deadline_s is None:
        raise UserInputError(
            f"advise: give --deadline-s (run {run_id} has no deadline for {step!r})"
        )
    if not deadline_s > 0:  # also NaN
        raise UserInputError(f"advise: --deadline-s must be > 0 s, got {deadline_s:g}")
    deadline_ms = deadline_s * 1000
    if seed is None:
        seed = int(np.random.default_rng().integers(2**32))
    baseline = _simulate(calls, deadline_ms, 1, deadline_ms, simulations, seed)
    imputed = _impute(calls, np.random.default_rng(seed))
    candidates = []
    for d in logged_candidate_delays(imputed, deadline_ms):
        for k in range(2, MAX_ATTEMPTS_LIMIT + 1):
            if (k - 1) * d >= deadline_ms:
                break
            candidates.append(_simulate(calls, d, k, deadline_ms, simulations, seed))
    allowed = [c for c in candidates if c["extra_calls_per_turn"] <= max_extra_calls]
    rec = _pick(baseline, allowed)
    if rec["hedge"]:
        iv = prediction_intervals(calls, rec["delay_ms"], rec["attempts"], deadline_ms,
                                  simulations, seed)  # fmt: skip
        rec["predicted"] = {**rec["predicted"], "intervals": iv}
        lo, hi = iv["extra_calls_per_turn_ci95"]
        rec["reason"] += f" (95% bootstrap over the log's calls: {lo:.3f}-{hi:.3f})"
    hedge_cfg = step_cfg.get("hedge") or {}
    tail = censored_tail(calls)
    if tail is not None:
        tail["beyond_deadline"] = tail["at_ms"] >= deadline_ms
    return {
        "run_id": run_id,
        "step": step,
        "n_calls": len(calls.settle),
        "n_censored": int(np.isnan(calls.settle).sum()),
        "n_errors_not_hedged": calls.n_errors_fast,
        "work_split": calls.n_split,
        "per_token_fit_ms": round(calls.per_token_fit, 3),
        "stream": calls.stream,
        "censored_tail": tail,
        "deadline_s": deadline_s,
        "max_extra_calls": max_extra_calls,
        "baseline": baseline,
        "candidates": candidates,
        "recommendation": rec,
        "toml": _toml(step, rec, hedge_cfg, max_extra_calls),
        "validation": _validate(
            store, run_id, step, hedge_cfg, calls, deadline_ms, simulations, seed
        ),
    }


def _ms(v: float | None) -> str:
    """A p99 for a sentence, with its unit; None (it lies beyond the deadline) is said in
    words, with no unit after them."""
    return "beyond the deadline" if v is None else f"{v:g} ms"


def _p99_change(before: float | None, after: float | None, sep: str) -> str:
    """``p99 1200 ms -> 900 ms``; one phrase when both lie beyond the deadline."""
    if before is None and after is None:
        return "p99 beyond the deadline either way"
    return f"p99 {_ms(before)}{sep}{_ms(after)}"


def _key_p99(c: dict[str, Any]) -> float:
    return c["p99_ms"] if c["p99_ms"] is not None else math.inf


def _pick(baseline: dict[str, Any], allowed: list[dict[str, Any]]) -> dict[str, Any]:
    """The recommendation. When some candidate answers more turns in time than one attempt
    (a deadline-bound step), the most in time wins, then the fewest extra calls; otherwise
    the lowest p99 (within 2%), then the fewest extra calls. Ties go to the fewest attempts
    and the longest delay."""
    if not allowed:
        return {
            "hedge": False,
            "reason": "no candidate fits --max-extra-calls",
            "predicted": baseline,
        }
    best_share = max(c["in_time"] for c in allowed)
    if best_share > baseline["in_time"] + _SHARE_TOL:
        pool = [c for c in allowed if c["in_time"] >= best_share - _SHARE_TOL]
    else:
        pool = [c for c in allowed if c["in_time"] >= baseline["in_time"] - _SHARE_TOL]
        best_p99 = min((_key_p99(c) for c in pool), default=math.inf)
        pool = [c for c in pool if _key_p99(c) <= best_p99 * 1.02]
    if not pool:
        return {"hedge": False, "reason": "every candidate loses turns", "predicted": baseline}
    least = min(c["extra_calls_per_turn"] for c in pool)
    pool = [c for c in pool if c["extra_calls_per_turn"] <= least + 0.02]
    best = min(pool, key=lambda c: (c["attempts"], -c["delay_ms"]))
    gains_share = best["in_time"] > baseline["in_time"] + _SHARE_TOL
    gains_p99 = _key_p99(best) < 0.95 * _key_p99(baseline)
    if not (gains_share or gains_p99):
        return {
            "hedge": False,
            "reason": (
                "no delay beats one attempt: share in time "
                f"{best['in_time']:.4f} vs {baseline['in_time']:.4f}, "
                f"{_p99_change(best['p99_ms'], baseline['p99_ms'], ' vs ')}"
            ),
            "predicted": baseline,
        }
    return {
        "hedge": True,
        "delay_ms": best["delay_ms"],
        "attempts": best["attempts"],
        "reason": (
            f"share in time {baseline['in_time']:.4f} -> {best['in_time']:.4f}, "
            f"{_p99_change(baseline['p99_ms'], best['p99_ms'], ' -> ')}, for "
            f"{best['extra_calls_per_turn']:.3f} extra calls per turn"
        ),
        "predicted": best,
    }


def _toml(step: str, rec: dict[str, Any], hedge_cfg: dict[str, Any], max_extra: float) -> str:
    if not rec["hedge"]:
        return f"# do not hedge steps.{step}: remove its [steps.{step}.hedge] table\n"
    # the budget must allow the copies the pick expects (plus headroom for bursts)
    load = min(
        4.0, max(0.1, round(max(max_extra, rec["predicted"]["extra_calls_per_turn"]) * 1.5, 2))
    )
    lines = [
        f"[steps.{step}.hedge]",
        f"delay_ms = {rec['delay_ms']:g}",
        f"max_attempts = {rec['attempts']}",
        f"max_extra_load = {load:g}",
    ]
    if hedge_cfg.get("targets"):
        lines.append("targets = [" + ", ".join(json.dumps(t) for t in hedge_cfg["targets"]) + "]")
    return "\n".join(lines) + "\n"


def _validate(
    store: Store,
    run_id: int,
    step: str,
    hedge_cfg: dict[str, Any],
    calls: _Calls,
    deadline_ms: float,
    simulations: int,
    seed: int,
) -> dict[str, Any] | None:
    """Predicted vs observed for the delay the run used (None if the step was not hedged).

    Observed over every turn the step ran in (``include_failed``): the simulation
    predicts every execution, the ones a fail-closed step lost to its deadline too.
    """
    observed = hedge_stats(store, run_id, include_failed=True)["steps"].get(step)
    if not observed or not observed["n_armed"] or not hedge_cfg:
        return None
    delay = observed["mean_delay_ms"]
    attempts = int(hedge_cfg.get("max_attempts", 2))
    predicted = _simulate(calls, delay, attempts, deadline_ms, simulations, seed)
    fire_ci = wilson_interval(observed["n_fired"], observed["n_armed"])
    win_ci = (
        wilson_interval(observed["n_won"], observed["n_fired"]) if observed["n_fired"] else None
    )
    extra = observed["extra_calls_per_turn"]
    extra_ci = _extra_calls_ci(store, run_id, step)

    def inside(value: float | None, ci: Any) -> bool | None:
        if value is None or ci is None:
            return None
        return bool(ci[0] <= value <= ci[1])

    return {
        "delay_ms": delay,
        "attempts": attempts,
        "observed": {
            "n_armed": observed["n_armed"],
            "fire_rate": observed["fire_rate"],
            "fire_rate_ci95": fire_ci,
            "n_fired": observed["n_fired"],
            "win_rate": observed["win_rate"],
            "win_rate_ci95": win_ci,
            "extra_calls_per_turn": extra,
            "extra_calls_per_turn_ci95": extra_ci,
            "copies_sent_per_call": observed["copies_sent_per_call"],
            "n_fired_no_copy_sent": observed["n_fired_no_copy_sent"],
            "unsent": observed["unsent"],
        },
        "note": _unsent_note(observed),
        "predicted": predicted,
        "inside": {
            "fire_rate": inside(predicted["fire_rate"], fire_ci),
            "win_rate": inside(predicted["win_rate"], win_ci),
            "extra_calls_per_turn": inside(predicted["extra_calls_per_turn"], extra_ci),
        },
    }


def _unsent_note(observed: dict[str, Any]) -> str | None:
    """Why an observed win rate can sit below the prediction: fires whose copy was due but
    never sent (budget refused, breaker open, loop lag) count as lost fires, while the
    prediction sends every due copy. None when every fire sent a copy."""
    n = observed["n_fired_no_copy_sent"]
    if not n:
        return None
    why = ", ".join(f"{k} {v}" for k, v in observed["unsent"].items() if v)
    return (
        f"{n} of {observed['n_fired']} fires sent no copy ({why}): the observed win rate "
        "counts them as lost, the prediction assumes every due copy is sent"
    )


def _extra_calls_ci(store: Store, run_id: int, step: str) -> list[float] | None:
    """95% interval of the mean extra calls per execution, inside the values' own bounds
    (a count is never negative; the normal approximation's was, on a rare fire).

    When every execution sent 0 or 1 extra calls (the usual two attempts), the mean is a
    proportion: the Wilson score interval (Wilson, JASA 22(158), 1927). Otherwise the
    percentile bootstrap of the mean (Efron and Tibshirani 1993; 2,000 resamples, fixed
    seed), which stays within the smallest and largest count observed."""
    per_turn: dict[int | None, int] = {}
    cancelled = {t.id for t in store.turns(run_id) if t.status == "cancelled"}
    for c in store.calls(run_id):
        if c.step == step and c.turn_id not in cancelled:
            per_turn.setdefault(c.turn_id, 0)
            if c.attempt > 1 and c.outcome not in ("budget_exhausted", "suppressed"):
                per_turn[c.turn_id] += 1
    values = np.array(list(per_turn.values()), dtype=float)
    if len(values) < 2:
        return None
    if np.isin(values, (0.0, 1.0)).all():
        wilson = wilson_interval(int(values.sum()), len(values))
        assert wilson is not None  # len(values) >= 2
        return [round(wilson[0], 4), round(wilson[1], 4)]
    rng = np.random.default_rng(0)
    means = values[rng.integers(0, len(values), (2000, len(values)))].mean(axis=1)
    return [round(float(np.quantile(means, 0.025)), 4),
            round(float(np.quantile(means, 0.975)), 4)]  # fmt: skip
