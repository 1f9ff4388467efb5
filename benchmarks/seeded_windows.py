"""A new process's first turns with its hedge window seeded from the fleet's log, next to
one that learns its window from zero.

The lab answers on a bimodal path: TTFT 50-150 ms with probability 0.95, else 1-3 s
(every copy an independent draw). One hedged step (``delay = "p90"``, so the delay lies
on the fast path; a copy to a second target; ``min_samples`` 20, so the window warms up
after 20 answers; until then the warm-up delay, a third of the 10 s deadline). First a
"fleet" process logs ``--fleet-turns`` turns. Then, per round, two fresh processes
(chains) each run their first ``--turns`` turns, ``--concurrency`` at a time: one seeded
from the log (``SeedWindows``: the step's last 200 answers to the same servers and model
within 10 minutes), one not; the order alternates between rounds.

Reported per arm, over every round's turns: turn latency p50/p90/p99 with n and a 95%
interval; the same for the warm-up turns (the first ``min_samples`` = 20 turns of each
process by start order, before an unseeded window can give a delay); slow turns (over
1 s: a slow first answer that no copy rescued) among the warm-up turns and among the
rest, each a share with its Wilson 95% interval; the hedge delay of each process's
first turn; the calls hedged at a seeded delay (from ``hedge-stats``); copies sent per
turn.

Run: ``python benchmarks/seeded_windows.py [--turns 100] [--rounds 8] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common as c

from chainrun.analysis.summary import hedge_stats
from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.reads import SeedWindows
from chainrun.log.store import Store
from chainrun.statistics.intervals import pass_rate, summarize

SCENARIO = """name = "bimodal-seed"
seed = 11
n_tokens = 4
per_token_ms = 1

[latency]
model = "bimodal"
fast_p = 0.95
fast_range_s = [0.05, 0.15]
slow_range_s = [1.0, 3.0]
"""
#: turns before a window of its own can give the delay (the step's ``min_samples``)
WARMUP = 20
#: ms: a turn slower than this waited for a slow first answer (the lab's slow mode starts
#: at 1 s; a copy sent at the p90 delay answers within about 0.3 s)
SLOW_MS = 1000.0


def config(base_url: str) -> Any:
    providers = {name: {"base_url": base_url, "max_connections": 200}
                 for name in ("primary", "backup")}  # fmt: skip
    step = {"provider": "primary", "prompt": "{message}", "stream": True,
            "max_output_tokens": 8, "deadline_s": 10.0,
            "hedge": {"delay": "p90", "targets": ["backup"], "min_samples": 20,
                      "max_extra_load": 0.5}}  # fmt: skip
    return config_from_dict({"order": ["answer"], "answer_step": "answer",
                             "providers": providers, "steps": {"answer": step}},
                            source="benchmark")  # fmt: skip


async def arm(cfg: Any, store: Store, n: int, concurrency: int, seeded: bool,
              label: str) -> tuple[int, list[float]]:  # fmt: skip
    """One fresh chain (a new process's state) running its first ``n`` turns; its run id
    and the turns' latencies (ms, in the order the turns started)."""
    seed = SeedWindows() if seeded else None
    lag = c.LagSampler()
    async with Chain(cfg, store=store, kind="replay", label=label, seed_windows=seed,
                     quiet=True) as chain, lag:  # fmt: skip
        results = await c.drive_turns(chain, [f"m{i}" for i in range(n)],
                                      concurrency=concurrency, lag=lag)  # fmt: skip
        run_id = chain.run_id
    assert run_id is not None
    return run_id, [r.duration_ms for r in sorted(results, key=lambda r: r.index)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100, help="first turns per process")
    parser.add_argument("--rounds", type=int, default=8, help="seeded/unseeded pairs")
    parser.add_argument("--fleet-turns", type=int, default=300, help="turns logged first")
    parser.add_argument("--concurrency", type=int, default=4, help="turns in flight")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    params = {"turns": args.turns, "rounds": args.rounds, "fleet_turns": args.fleet_turns,
              "concurrency": args.concurrency, "scenario": SCENARIO,
              "hedge": "delay p90, min_samples 20, one copy to a second target"}  # fmt: skip
    doc = c.new_document("seeded_windows", sys.argv[1:] if argv is None else argv, params)
    with tempfile.TemporaryDirectory(prefix="chainrun-seeded-") as tmp:
        scenario = Path(tmp) / "bimodal-seed.toml"
        scenario.write_text(SCENARIO, encoding="utf-8")
        with LabServer(scenario) as lab, Store.open(Path(tmp) / "log.db") as store:
            cfg = config(lab.base_url)
            asyncio.run(arm(cfg, store, args.fleet_turns, args.concurrency, False, "fleet"))
            times: dict[str, list[float]] = {"seeded": [], "unseeded": []}
            warmup: dict[str, list[float]] = {"seeded": [], "unseeded": []}
            first_delay: dict[str, list[float | None]] = {"seeded": [], "unseeded": []}
            seeded_calls, copies = {"seeded": 0, "unseeded": 0}, {"seeded": 0, "unseeded": 0}
            for r in range(args.rounds):
                order = ("seeded", "unseeded") if r % 2 == 0 else ("unseeded", "seeded")
                for name in order:
                    run_id, ms = asyncio.run(arm(cfg, store, args.turns, args.concurrency,
                                                 name == "seeded", f"{name}-{r}"))  # fmt: skip
                    times[name] += ms
                    warmup[name] += ms[:WARMUP]
                    first = min(store.steps(run_id), key=lambda st: st.turn_id or 0)
                    first_delay[name].append(first.hedge_delay_ms)
                    st = hedge_stats(store, run_id)["steps"].get("answer", {})
                    seeded_calls[name] += st.get("n_seeded_delay", 0)
                    copies[name] += st.get("copies_sent", 0)
    n_turns = args.turns * args.rounds
    keep = ("n", "p50_ms", "p50_ci", "p90_ms", "p90_ci", "p99_ms", "p99_ci")

    def slow(values: list[float]) -> dict[str, Any]:
        rate = pass_rate(sum(v > SLOW_MS for v in values), len(values))
        return {"n": rate["n"], "slow": rate["passed"], "share": rate["pass_rate"],
                "share_ci": rate["pass_rate_ci"]}  # fmt: skip

    doc["results"] = {
        name: {
            "turn_ms": {k: v for k, v in summarize(times[name]).items() if k in keep},
            "warmup_turns_ms": {k: v for k, v in summarize(warmup[name]).items() if k in keep},
            "slow_turns": {
                "over_ms": SLOW_MS,
                "warmup": slow(warmup[name]),
                "after_warmup": slow(
                    [v for i, v in enumerate(times[name]) if i % args.turns >= WARMUP]
                ),
            },
            "first_turn_hedge_delay_ms": first_delay[name],
            "calls_hedged_at_a_seeded_delay": seeded_calls[name],
            "copies_per_turn": round(copies[name] / n_turns, 4),
        }
        for name in ("seeded", "unseeded")
    }
    c.finish(doc, as_json=args.json, summary=_summary, out=args.out)


def _summary(doc: dict[str, Any]) -> str:
    lines = [f"arm       all turns p50 / p99 ms (n)   warm-up (first {WARMUP}) p99 ms (n)  "
             f"slow > {SLOW_MS:g} ms: warm-up | after   first delay ms  copies/turn"]  # fmt: skip
    for name, r in doc["results"].items():
        t, w, sl = r["turn_ms"], r["warmup_turns_ms"], r["slow_turns"]
        delays = sorted(d for d in r["first_turn_hedge_delay_ms"] if d is not None)
        mid = delays[len(delays) // 2] if delays else None
        lines.append(
            f"{name:<9} {t['p50_ms']} / {t['p99_ms']} ({t['n']})   {w['p99_ms']} ({w['n']})   "
            f"{sl['warmup']['slow']}/{sl['warmup']['n']} | "
            f"{sl['after_warmup']['slow']}/{sl['after_warmup']['n']}   {mid}   "
            f"{r['copies_per_turn']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
