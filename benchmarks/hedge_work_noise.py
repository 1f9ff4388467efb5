"""Where hedging stops paying: a p95 hedge on answers whose latency is mostly work.

Dean and Barroso, "The Tail at Scale" (CACM 56(2), 2013): split a call's latency into the work
W the request carries (generated tokens x time per token; both copies carry the same W)
and serving noise N drawn per copy. The primary answers at W + N1, a copy sent at d
answers at d + W + N2, so **the copy wins only when N1 - N2 > d**: W cancels out.

The lab's ``work-noise`` scenario fixes W by a hash of the request content (20-200
tokens at 10 ms: 0.2-2 s, varied across turns by the message) and draws N per request
(lognormal, median 30 ms, sigma 0.3). The step settles on the whole answer
(``stream = false``) so that W is part of its latency; the hedge delay d is the p95 of
the step's own latency window, and every loser is left to finish unseen
(``shadow_fraction = 1.0``) so that time saved per win is measured. The back-off
(``min_win_rate``, on by default) is turned off here: this measures the hedge itself;
``tests/test_hedging_advisor.py`` shows the back-off on the same W + N model.

* ``low_noise``: the built-in scenario. The p95 is reached by long answers, N1 - N2 is
  tens of ms while d is ~2 s: the hedge fires on long answers and (almost) never wins.
* ``noisy``: the same W with large noise (median 300 ms, sigma 1.2 by default): now a
  slow primary is slow because of N1, and the copy does win.

Run: ``python benchmarks/hedge_work_noise.py [--turns 1000] [--concurrency 20] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from collections import Counter, defaultdict
from typing import Any

import _common as c

from chainrun.lab import LabServer, load_scenario
from chainrun.lab.scenarios import Scenario, WorkNoise
from chainrun.log.rows import SENT_OUTCOMES, WINNER_OUTCOMES, CallRow, StepRow

EXPLANATION = (
    "The primary answers at W + N1 and a copy sent at d at d + W + N2 (W: the work the "
    "request carries, the same for both copies; N: serving noise drawn per copy), so the "
    "copy wins only when N1 - N2 > d (Dean and Barroso, 'The Tail at Scale'). "
    "With little noise the p95 delay d is reached by long answers (large W), not by slow "
    "servers: the hedge fires on long answers and the copy, carrying the same W, loses. "
    "With large noise a primary over d is usually slow because of N1, and the copy wins."
)


def predicted(scenario: Scenario, n: int = 100_000, seed: int = 1) -> dict[str, Any]:
    """Monte Carlo of the W + N model for ``scenario`` (a work_noise one): d = p95 of W + N.

    W uniform over the scenario's token range (the lab's hash spreads requests about
    evenly) times the per-token time; N1, N2 independent lognormal draws. Returns the
    fire rate (P(W + N1 > d)), win rate (P(N1 - N2 > d | fired)), mean time saved per win
    (N1 - N2 - d, ms) and d (ms). Client and HTTP overhead are not modelled.
    """
    lat = scenario.latency
    assert isinstance(lat, WorkNoise)
    rng = random.Random(seed)

    def noise() -> float:
        return lat.noise.median_ms * math.exp(lat.noise.sigma * rng.gauss(0.0, 1.0))

    def work() -> float:
        return rng.randint(lat.tokens_min, lat.tokens_max) * lat.per_token_ms

    total = sorted(work() + noise() for _ in range(n))
    d = total[math.ceil(0.95 * n) - 1]
    fires, saved = 0, []
    for _ in range(n):
        w, n1, n2 = work(), noise(), noise()
        if w + n1 > d:
            fires += 1
            if n1 - n2 > d:
                saved.append(n1 - n2 - d)
    return {
        "delay_ms": round(d, 1),
        "fire_rate": round(fires / n, 4),
        "win_rate": round(len(saved) / fires, 4) if fires else None,
        "time_saved_per_win_ms": c.r(sum(saved) / len(saved)) if saved else None,
        "n_simulated": n,
    }


def hedged_step(args: argparse.Namespace) -> dict[str, Any]:
    return {
        # the longest answer is 200 tokens: never cap it (W must be the scenario's)
        "max_output_tokens": 256,
        "deadline_s": args.deadline_s,
        "stream": False,
        "on_failure": "open",
        "hedge": {
            "delay": args.delay,
            "max_attempts": 2,
            "shadow_fraction": 1.0,
            "min_samples": args.min_samples,
            "max_extra_load": args.max_extra_load,
            # the hedge's own economics, every fire: the back-off (on by default) would
            # stop arming the low-noise step after 30 losing fires
            "min_win_rate": 0.0,
        },
    }


def analyse(steps: list[StepRow], calls: list[CallRow]) -> dict[str, Any]:
    """Per-turn analysis from the log: W of fired turns, the N1 - N2 > d rule, shadow waits.

    N is read as each call's own client-side TTFT (request sent to first token), d as the
    copy's actual start offset; W as output tokens of the turn's answer.
    """
    by_turn: dict[int | None, dict[int, CallRow]] = defaultdict(dict)
    for call in calls:
        by_turn[call.turn_id][call.attempt] = call
    armed_tokens, fired_tokens = [], []
    agree = checked = 0
    margins, winner_ms = [], []
    # how long the step went on after its winner answered, for races with and without
    # losers (all losers are shadows here): should be ~0 either way, shadows finish unseen
    # (before commit abe3a47 the chain waited for them: the step took the slower attempt)
    waits: dict[str, list[float]] = {"with_losers": [], "without_losers": []}
    for s in steps:
        attempts = by_turn.get(s.turn_id, {})
        winner = next((a for a in attempts.values() if a.outcome in WINNER_OUTCOMES), None)
        if winner is None:
            continue
        done_at = winner.started_offset_ms + (winner.duration_ms or 0.0)
        winner_ms.append(done_at)
        wait = max(0.0, s.duration_ms - done_at)
        sent = sum(1 for a in attempts.values() if a.outcome in SENT_OUTCOMES)
        waits["with_losers" if sent > 1 else "without_losers"].append(wait)
        if s.hedge_delay_ms is None:
            continue
        tokens = winner.output_tokens
        armed_tokens.append(tokens)
        if not s.hedge_fired:
            continue
        fired_tokens.append(tokens)
        first, copy = attempts.get(1), attempts.get(2)
        if first is None or copy is None or first.ttft_ms is None or copy.ttft_ms is None:
            continue
        margin = first.ttft_ms - copy.ttft_ms - copy.started_offset_ms
        margins.append(margin)
        checked += 1
        agree += (margin > 0) == bool(s.hedge_won)
    return {
        "output_tokens_mean_armed": c.r(_mean(armed_tokens)),
        "output_tokens_mean_fired": c.r(_mean(fired_tokens)),
        "n_armed": len(armed_tokens),
        "n_fired": len(fired_tokens),
        "rule": {
            "n_checked": checked,
            "agreement": round(agree / checked, 4) if checked else None,
            "n1_minus_n2_minus_d_p50_ms": c.r(c.median(margins)),
            "n1_minus_n2_minus_d_max_ms": c.r(max(margins, default=None)),
        },
        "winner_answered_p50_ms": c.r(c.median(winner_ms)),
        "winner_answered_p99_ms": c.r(c.quantile(winner_ms, 99)),
        "step_wait_after_winner_ms": {
            k: {
                "n": len(v),
                "p50": c.r(c.median(v)),
                "p99": c.r(c.quantile(v, 99)),
                "max": c.r(max(v, default=None)),
            }
            for k, v in waits.items()
        },
    }


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


async def run_variant(name: str, scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    # the message varies per turn, so the lab's content hash varies W across turns
    messages = [f"turn {i}: describe the linen shirt and how it fits" for i in range(args.turns)]
    with LabServer(scenario) as lab, c.temp_store() as store:
        config = c.one_step_config(
            lab.base_url, hedged_step(args), max_connections=max(100, args.concurrency * 4)
        )
        async with c.LagSampler() as lag, c.open_chain(config, store, name) as chain:
            driven = await c.drive_turns(chain, messages, concurrency=args.concurrency, lag=lag)
            run_id = chain.run_id
        assert run_id is not None
        steps = store.steps(run_id)
        calls = store.calls(run_id)
        stats = c.step_hedge_stats(store, run_id)
    lat = scenario.latency
    assert isinstance(lat, WorkNoise)
    keys = ("n", "n_armed", "n_fired", "n_won", "fire_rate", "win_rate",
            "time_saved_per_win_ms", "n_saved_measured", "extra_calls_per_turn",
            "budget_exhausted", "mean_delay_ms")  # fmt: skip
    hedge = {k: stats.get(k) for k in keys}
    hedge["n_warmup"] = hedge["n"] - hedge["n_armed"] if hedge["n"] is not None else None
    hedge["fire_rate_ci95"] = c.wilson(hedge["n_fired"] or 0, hedge["n_armed"] or 0)
    hedge["win_rate_ci95"] = c.wilson(hedge["n_won"] or 0, hedge["n_fired"] or 0)
    return {
        "scenario": {
            "noise_median_ms": lat.noise.median_ms,
            "noise_sigma": lat.noise.sigma,
            "per_token_ms": lat.per_token_ms,
            "tokens": [lat.tokens_min, lat.tokens_max],
        },
        "hedge": hedge,
        "predicted": predicted(scenario),
        "analysis": analyse(steps, calls),
        "turn_status": dict(Counter(t.status for t in driven)),
        "client_lag": c.lag_report(driven, calls, lag, args.concurrency),
        "wall_s": c.elapsed(t0),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    params = {
        "turns": args.turns,
        "concurrency": args.concurrency,
        "delay": args.delay,
        "min_samples": args.min_samples,
        "max_attempts": 2,
        "shadow_fraction": 1.0,
        "max_extra_load": args.max_extra_load,
        "deadline_s": args.deadline_s,
        "stream": False,
        "noisy_median_ms": args.noisy_median_ms,
        "noisy_sigma": args.noisy_sigma,
        "seed": args.seed,
    }
    doc = c.new_document("hedge_work_noise", sys.argv[1:], params)
    base = load_scenario("work-noise", seed=args.seed)
    variants = {
        "low_noise": base,
        "noisy": load_scenario(
            "work-noise",
            seed=args.seed,
            median_ms=args.noisy_median_ms,
            sigma=args.noisy_sigma,
        ),
    }
    results: dict[str, Any] = {}
    for name, scenario in variants.items():
        results[name] = await run_variant(name, scenario, args)
    results["explanation"] = EXPLANATION
    doc["results"] = results
    return doc


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = [
        "",
        f"p95 hedge on a non-streamed step, W = tokens x 10 ms (20-200 tokens), shadows 100% "
        f"(turns={doc['parameters']['turns']}, concurrency={doc['parameters']['concurrency']})",
        f"{'variant':10} {'noise':>12} {'d ms':>7} {'fire rate':>15} {'win rate':>15} "
        f"{'saved/win ms':>16} {'extra/turn':>10} {'refused':>7} {'warm-up':>7}",
    ]
    for name in ("low_noise", "noisy"):
        v = res[name]
        h, p, sc = v["hedge"], v["predicted"], v["scenario"]
        lines.append(
            f"{name:10} {sc['noise_median_ms']:>5g}ms s{sc['noise_sigma']:<4g} "
            f"{c.fmt(h['mean_delay_ms'], '.0f'):>7} "
            f"{c.fmt(h['fire_rate'])} (n={h['n_armed']:<4}) "
            f"{c.fmt(h['win_rate'])} (n={h['n_fired']:<3}) "
            f"{c.fmt(h['time_saved_per_win_ms'], '.0f'):>6} (n={h['n_saved_measured']:<3}) "
            f"{c.fmt(h['extra_calls_per_turn']):>10} {h['budget_exhausted']:>7} "
            f"{h['n_warmup']:>7}"
        )
        lines.append(
            f"{'':10} {'predicted':>12} {p['delay_ms']:>7.0f} {p['fire_rate']:>15.3f} "
            f"{c.fmt(p['win_rate']):>15} {c.fmt(p['time_saved_per_win_ms'], '.0f'):>16}"
        )
    lines.append("")
    for name in ("low_noise", "noisy"):
        a = res[name]["analysis"]
        rule = a["rule"]
        lines.append(
            f"{name}: mean answer {c.fmt(a['output_tokens_mean_armed'], '.0f')} tokens, "
            f"{c.fmt(a['output_tokens_mean_fired'], '.0f')} when the hedge fired; "
            f"rule N1 - N2 > d agrees with the outcome in "
            f"{c.fmt(rule['agreement'])} of {rule['n_checked']} fires "
            f"(median N1 - N2 - d = {c.fmt(rule['n1_minus_n2_minus_d_p50_ms'], '.0f')} ms); "
            f"turns lagging > 100 ms: {res[name]['client_lag']['share_turns_lagging']:.1%}"
        )
        h = res[name]["hedge"]
        w, wo = (
            a["step_wait_after_winner_ms"]["with_losers"],
            a["step_wait_after_winner_ms"]["without_losers"],
        )
        lines.append(
            f"  win rate 95% CI {c.fmt_ci(h['win_rate_ci95'])}; the step went on after its winner "
            f"answered: median {c.fmt(w['p50'], '.0f')} ms / max {c.fmt(w['max'], '.0f')} ms "
            f"with shadow losers (n={w['n']}), median {c.fmt(wo['p50'], '.0f')} ms without "
            f"(n={wo['n']})"
        )
    lines.append("\n" + res["explanation"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=1000, help="turns per variant (1000)")
    parser.add_argument("--concurrency", type=int, default=20, help="turns in flight (20)")
    parser.add_argument("--delay", default="p95", help="hedge delay percentile (p95)")
    parser.add_argument("--min-samples", type=int, default=20, help="window warm-up (20)")
    parser.add_argument(
        "--max-extra-load",
        type=float,
        default=1.0,
        help="hedge budget (1.0: never refuses at a p95 delay; the budget is not measured here)",
    )
    parser.add_argument("--deadline-s", type=float, default=60.0, help="step deadline (60 s)")
    parser.add_argument("--noisy-median-ms", type=float, default=300.0, help="noisy N median")
    parser.add_argument("--noisy-sigma", type=float, default=1.2, help="noisy N sigma (1.2)")
    parser.add_argument("--seed", type=int, default=0, help="the lab's RNG seed (0)")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = asyncio.run(run(args))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
