"""A guard on a bimodal classifier: copies every 1 s, then the delay and attempts that
``chainrun advise`` picks from a run of the guard's logged calls.

Scenario ``bimodal-guard`` (a shared endpoint's warm and cold paths):
0.1-0.3 s with probability 0.5, else 3-19 s, drawn
per request; the guard step settles on the whole answer (``stream = false``) within a
3 s deadline, ``on_failure = "closed"``.

1. ``every_1s``: copies every 1 s, 3 attempts (the field result: about 7/8 in time;
   predicted 1 - 0.5^3 = 0.875 with 1.75 calls per check).
2. ``learn``: one call per check (no hedge), ``--learn-turns`` checks: the log ``advise``
   reads (half the calls are cut by the deadline: censored).
3. ``advise``: ``chainrun.analysis.advise.advise`` on the learn run with ``--max-extra-calls``.
4. ``advised``: ``--turns`` checks with the picked delay and attempts (predicted for copies
   every 0.35 s and 8 attempts: 1 - 0.5^8 = 0.996 in time, 0.99 extra calls per check).
5. ``validation``: ``advise`` on the every_1s run, whose predicted fire rate, win rate and
   extra calls for the delay it used must fall inside that run's own 95% intervals.

Run: ``python benchmarks/guard_advise.py [--turns 1000] [--learn-turns 300]
[--max-extra-calls 1.0] [--concurrency 50] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from typing import Any

import _common as c

from chainrun.analysis.advise import advise_from_log
from chainrun.analysis.summary import hedge_stats
from chainrun.lab import LabServer

DEADLINE_S = 3.0


def guard_step(hedge: dict[str, Any] | None) -> dict[str, Any]:
    step: dict[str, Any] = {
        "max_output_tokens": 8,
        "deadline_s": DEADLINE_S,
        "stream": False,
        "on_failure": "closed",
    }
    if hedge:
        step["hedge"] = hedge
    return step


def _mean_ci(values: list[int]) -> tuple[float, list[float]]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = 1.959964 * sd / math.sqrt(n) if n else 0.0
    return round(mean, 4), [round(mean - half, 4), round(mean + half, 4)]


async def run_mode(
    lab: LabServer, store: Any, label: str, hedge: dict[str, Any] | None, turns: int,
    concurrency: int,
) -> dict[str, Any]:  # fmt: skip
    attempts = (hedge or {}).get("max_attempts", 1)
    config = c.one_step_config(
        lab.base_url, guard_step(hedge), max_connections=max(100, concurrency * attempts * 2)
    )
    messages = [f"check {i} ({label}): is this message safe?" for i in range(turns)]
    t0 = time.perf_counter()
    async with c.LagSampler() as lag, c.open_chain(config, store, label) as chain:
        await c.drive_turns(chain, messages, concurrency=concurrency, lag=lag)
        run_id = chain.run_id
    assert run_id is not None
    steps = store.steps(run_id)
    calls = store.calls(run_id)
    extra: dict[int | None, int] = {s.turn_id: 0 for s in steps}
    for call in calls:
        if call.attempt > 1 and call.outcome not in ("budget_exhausted", "suppressed"):
            extra[call.turn_id] += 1
    n = len(steps)
    ok = sum(1 for s in steps if s.status == "ok")
    mean_extra, extra_ci = _mean_ci(list(extra.values()))
    # every check, the refused ones too: they are where every attempt lost (the guard
    # fails closed), so completed turns alone would bias the fire and win rates
    stats = hedge_stats(store, run_id, include_failed=True)["steps"].get(c.STEP, {})
    return {
        "run_id": run_id,
        "hedge": hedge,
        "n": n,
        "in_time": ok,
        "in_time_share": round(ok / n, 4),
        "in_time_ci95": c.wilson(ok, n),
        "extra_calls_per_check": mean_extra,
        "extra_calls_per_check_ci95": extra_ci,
        "fire_rate": stats.get("fire_rate"),
        "win_rate": stats.get("win_rate"),
        "budget_exhausted": stats.get("budget_exhausted"),
        "wall_s": c.elapsed(t0),
    }


def _brief(advice: dict[str, Any]) -> dict[str, Any]:
    keep = ("n_calls", "n_censored", "deadline_s", "max_extra_calls", "baseline",
            "recommendation", "toml", "validation")  # fmt: skip
    out = {k: advice[k] for k in keep}
    out["n_candidates"] = len(advice["candidates"])
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    doc = c.new_document(
        "guard_advise",
        sys.argv[1:],
        {
            "turns": args.turns,
            "learn_turns": args.learn_turns,
            "concurrency": args.concurrency,
            "max_extra_calls": args.max_extra_calls,
            "scenario": "bimodal-guard",
            "deadline_s": DEADLINE_S,
            "stream": False,
            "seed": args.seed,
        },
    )
    res: dict[str, Any] = {}
    with LabServer("bimodal-guard", seed=args.seed) as lab, c.temp_store() as store:
        every = {"delay_ms": 1000, "max_attempts": 3, "max_extra_load": 2.0}
        res["every_1s"] = await run_mode(lab, store, "every_1s", every, args.turns,
                                         args.concurrency)  # fmt: skip
        res["learn"] = await run_mode(lab, store, "learn", None, args.learn_turns,
                                      args.concurrency)  # fmt: skip
        advice = advise_from_log(
            store, res["learn"]["run_id"], c.STEP, max_extra_calls=args.max_extra_calls,
            simulations=args.simulations, seed=args.seed,
        )  # fmt: skip
        res["advise"] = _brief(advice)
        rec = advice["recommendation"]
        if rec["hedge"]:
            picked = {
                "delay_ms": rec["delay_ms"],
                "max_attempts": rec["attempts"],
                # the budget must not refuse the copies the pick relies on
                "max_extra_load": max(2.0, rec["attempts"] - 1.0),
            }
            res["advised"] = await run_mode(lab, store, "advised", picked, args.turns,
                                            args.concurrency)  # fmt: skip
            res["advised"]["predicted"] = rec["predicted"]
        check = advise_from_log(store, res["every_1s"]["run_id"], c.STEP, max_extra_calls=2.0,
                       simulations=args.simulations, seed=args.seed)  # fmt: skip
        res["validation"] = check["validation"]
    doc["results"] = res
    return doc


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = [f"\nguard on bimodal-guard, deadline {DEADLINE_S:g} s"]
    for name in ("every_1s", "learn", "advised"):
        m = res.get(name)
        if m is None:
            continue
        h = m["hedge"] or {}
        lines.append(
            f"{name:9} d={h.get('delay_ms', '-')!s:>6} k={h.get('max_attempts', 1):>2} "
            f"n={m['n']:>5} "
            f"in time {m['in_time_share']:.4f} {c.fmt_ci(m['in_time_ci95'])}  extra calls/check "
            f"{m['extra_calls_per_check']:.3f} {c.fmt_ci(m['extra_calls_per_check_ci95'])}"
        )
    rec = res["advise"]["recommendation"]
    lines.append(f"advise on the learn run: {rec['reason']}")
    lines.append(res["advise"]["toml"])
    v = res["validation"]
    if v:
        lines.append(f"validation on every_1s (d={v['delay_ms']} ms): inside = {v['inside']}")
    return "\n".join(lines)


#: command-line options: (flag, type, default, help)
OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    ("--turns", int, 1000, "checks per measured mode"),
    ("--learn-turns", int, 300, "checks advise learns from"),
    ("--concurrency", int, 50, "checks in flight"),
    ("--max-extra-calls", float, 1.0, "advise's budget of extra calls per check"),
    ("--simulations", int, 20000, "advise's resampled turns per candidate"),
    ("--seed", int, 0, "the lab's RNG seed and advise's"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, kind, default, text in OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=f"{text} ({default})")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    c.finish(asyncio.run(run(args)), as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
