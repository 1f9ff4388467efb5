"""The default chain (four model steps and retrieve) against the lab at 10, 100 and 1,000
concurrent turns in one process.

One lab server (``lognormal`` scenario, median ``--median-ms``) in its own process
serves every model call; the chain logs to a temporary SQLite file through the store's
writer thread. The retrieve step embeds with ``--embedding`` (``hash`` by default, so the
figures are chainrun's and not the MiniLM model's CPU). For each concurrency level N
(ascending), ``max(N, --min-turns)`` turns run with N in flight (a closed loop: a
finished turn starts the next), messages cycled from the commerce replay set. The
chain is opened (catalogue indexed) and warmed by one turn (not counted) before the
level's clock, lag sampler and the lab's request log start.

Per level: ``turns_per_s`` (completed turns / wall s), ``loop_lag_p99_ms`` (how late a
10 ms timer wakes up, p99 over the level; with n and a 95% interval), ``peak_rss_mb``
(the process's peak resident set so far: ``ru_maxrss``; levels run ascending so it is
the peak up to this level), ``log_rows_per_s`` (turn + step + call rows written / wall s),
``turns_logged`` (turns of the level's run in the log; every turn must be there once:
``turns_logged_once`` checks ids and inputs), ``added_ms_per_call`` (the median of the
client's call ``duration_ms`` minus the median of the lab's own request time
``finished_at - received_at`` from its request log: what the client side (the
``openai`` client, chainrun, loopback and the shared loop's queueing) adds to a call).

Run: ``python benchmarks/scale.py [--levels 10,100,1000] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from typing import Any

import _common as c

from chainrun import stats
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.replay import load_requests

REPLAY = "replays/commerce-12.jsonl"


def peak_rss_mb() -> float:
    """The process's peak resident set size in MB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


async def level(
    lab: LabServer, store: Any, n_flight: int, n_turns: int, messages: list[str], embedding: str
) -> dict[str, Any]:
    """Run ``n_turns`` turns with ``n_flight`` in flight; the level's figures."""
    config = config_from_dict(
        {
            "providers": {"local": {"base_url": lab.base_url, "max_connections": 4 * n_flight}},
            "steps": {"retrieve": {"retrieval": {"embedding": {"backend": embedding}}}},
        },
        source="benchmark",
    )
    msgs = [f"{messages[i % len(messages)]} [{i}]" for i in range(n_turns)]
    async with c.open_chain(config, store, f"scale-{n_flight}") as chain:
        warm = await chain.run_turn("warm-up")  # first-use work stays out of the level
        lab.reset()
        async with c.LagSampler(interval_s=0.01) as lag:
            t0 = time.perf_counter()
            results = await c.drive_turns(chain, msgs, concurrency=n_flight, lag=lag)
            wall = time.perf_counter() - t0
        run_id = chain.run_id
    assert run_id is not None
    turns = [t for t in store.turns(run_id) if t.id != warm.turn_id]
    steps = [x for x in store.steps(run_id) if x.turn_id != warm.turn_id]
    calls = [x for x in store.calls(run_id) if x.turn_id != warm.turn_id]
    lab_ms = [
        (r["finished_at"] - r["received_at"]) * 1000.0
        for r in lab.requests()
        if r["finished_at"] is not None
    ]
    client_ms = [x.duration_ms for x in calls if x.duration_ms is not None]
    lags = [ms for _, ms in lag.samples]
    lag_ci = stats.quantile_ci(lags, 99)
    ids = [t.turn_id for t in results]
    once = len(set(ids)) == len(ids) == len(turns) and sorted(t.input for t in turns) == sorted(
        msgs
    )
    return {
        "concurrency": n_flight,
        "turns": n_turns,
        "wall_s": round(wall, 3),
        "turns_per_s": c.r(n_turns / wall, 2),
        "loop_lag_p99_ms": c.r(stats.percentile(lags, 99), 2),
        "loop_lag_p99_ci": [c.r(lag_ci[0], 2), c.r(lag_ci[1], 2)] if lag_ci else None,
        "loop_lag_n": len(lags),
        "peak_rss_mb": c.r(peak_rss_mb(), 1),
        "log_rows_per_s": c.r((len(turns) + len(steps) + len(calls)) / wall, 1),
        "turns_logged": len(turns),
        "turns_logged_once": once,
        "statuses": {s: sum(1 for t in turns if t.status == s) for s in {t.status for t in turns}},
        "turn_p50_ms": c.r(statistics.median(r.duration_ms for r in results), 1),
        "calls": len(calls),
        "client_call_p50_ms": c.r(statistics.median(client_ms), 2) if client_ms else None,
        "lab_request_p50_ms": c.r(statistics.median(lab_ms), 2) if lab_ms else None,
        "added_ms_per_call": c.r(statistics.median(client_ms) - statistics.median(lab_ms), 2)
        if client_ms and lab_ms
        else None,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(x) for x in args.levels.split(",")]
    params = {
        "levels": levels,
        "min_turns": args.min_turns,
        "scenario": "lognormal",
        "median_ms": args.median_ms,
        "n_tokens": args.tokens,
        "chain": "default (classify, retrieve, compose, validate, critique) on the lab",
        "loop_lag_timer_ms": 10,
        "embedding": args.embedding,
    }
    doc = c.new_document("scale", sys.argv[1:], params)
    messages = [r.message for r in load_requests(REPLAY)]
    out: dict[str, Any] = {}
    with (
        LabServer("lognormal", median_ms=args.median_ms, n_tokens=args.tokens) as lab,
        c.temp_store() as store,
    ):
        for n in levels:
            out[str(n)] = await level(
                lab, store, n, max(n, args.min_turns), messages, args.embedding
            )
    doc["results"] = out
    return doc


def summary(doc: dict[str, Any]) -> str:
    lines = [
        "",
        f"{'in flight':>9} {'turns':>6} {'turns/s':>8} {'lag p99':>8} {'RSS MB':>7} "
        f"{'rows/s':>8} {'added/call':>10} {'logged':>7}",
    ]
    for row in doc["results"].values():
        lines.append(
            f"{row['concurrency']:>9} {row['turns']:>6} {row['turns_per_s']:>8.1f} "
            f"{row['loop_lag_p99_ms']:>8.1f} {row['peak_rss_mb']:>7.1f} "
            f"{row['log_rows_per_s']:>8.0f} {c.fmt(row['added_ms_per_call'], '.2f'):>10} "
            f"{row['turns_logged']:>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="10,100,1000", help="turns in flight (10,100,1000)")
    parser.add_argument("--min-turns", type=int, default=100, help="turns per level at least")
    parser.add_argument("--median-ms", type=float, default=100.0, help="lab median TTFT (100)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer (16)")
    parser.add_argument(
        "--embedding",
        default="hash",
        choices=["hash", "minilm"],
        help="the retrieve step's embedder: hash (default: chainrun's own cost, no model "
        "CPU) or minilm (the default chain's, whose model runs on the same 2 cores)",
    )
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = asyncio.run(run(args))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
