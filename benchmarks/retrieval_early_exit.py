"""Early exit in the retrieve stage: the time it saves and the recall it costs.

The default retrieve stage (searches ``keyword`` → ``hybrid`` → ``filter``, stop at
``min_results = 4``, hand over ``k = 8``) runs on the sample catalogue for every labelled
query of ``evals/retrieval_queries.jsonl``, in two arms:

* ``early_exit``: as configured; a query the keyword search answers never embeds the
  query nor runs the hybrid search.
* ``every_search``: ``early_exit = false``: every search runs and the merged list is cut
  to k.

The arms alternate query by query (which goes first flips every round) so that drift of
a shared machine falls on both alike. Reported per arm: n, median and p90 of the stage's
wall time in ms (with distribution-free 95% intervals where n allows, see
``chainrun.statistics.intervals.summarize``), mean searches run, the share of queries that stopped
early, and recall@k; the medians split by where the early-exit arm stopped (the saving
sits in the queries the keyword search answers); then the speed-up and the recall cost
of exiting early (paired, on the same queries). The embedder is all-MiniLM-L6-v2
(NumPy) when installed, else the hashing test embedder (said in the document).

Run: ``python benchmarks/retrieval_early_exit.py [--rounds 20] [--embedder auto] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _common as c
import sqlite_utils

from chainrun.retrieval import HashEmbedder, MiniLMEmbedder, RetrievalSettings, build_retriever
from chainrun.retrieval.catalog import ensure_sample_catalog
from chainrun.retrieval.embeddings import Embedder
from chainrun.retrieval.evaluate import load_queries, recall_at_k
from chainrun.statistics.intervals import summarize

NAME = "retrieval_early_exit"
QUERIES = Path(__file__).resolve().parent.parent / "evals" / "retrieval_queries.jsonl"
ARMS = {"early_exit": True, "every_search": False}


def pick_embedder(choice: str) -> Embedder:
    if choice == "minilm" or (choice == "auto" and MiniLMEmbedder.available()):
        return MiniLMEmbedder()
    return HashEmbedder()


async def run(rounds: int, embedder: Embedder) -> dict[str, Any]:
    db = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(db)
    queries = load_queries(QUERIES)
    retrievers = {
        arm: build_retriever(RetrievalSettings(early_exit=flag), db, embedder=embedder)
        for arm, flag in ARMS.items()
    }
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    searches_run: dict[str, list[int]] = {arm: [] for arm in ARMS}
    stopped: dict[str, list[str | None]] = {arm: [] for arm in ARMS}
    recalls: dict[str, list[float]] = {arm: [] for arm in ARMS}
    k = RetrievalSettings().k
    t_start = time.perf_counter()
    try:
        for retriever in retrievers.values():
            await retriever.warm()
        for q in queries:  # warm-up pass (not timed): first-use costs, caches
            for retriever in retrievers.values():
                await retriever.retrieve(q.query, label=q.label)
        for rnd in range(rounds):
            order = list(ARMS) if rnd % 2 == 0 else list(reversed(ARMS))
            for q in queries:
                for arm in order:
                    t0 = time.perf_counter()
                    result = await retrievers[arm].retrieve(q.query, label=q.label)
                    times[arm].append((time.perf_counter() - t0) * 1000.0)
                    searches_run[arm].append(len(result.searches))
                    stopped[arm].append(result.stopped_after)
                    if rnd == 0:  # retrieval is deterministic: recall once per query
                        recalls[arm].append(recall_at_k(result.ids, q.expected, k))
    finally:
        for retriever in retrievers.values():
            await retriever.aclose()
    arms: dict[str, Any] = {}
    for arm in ARMS:
        arms[arm] = {
            "time": summarize(times[arm]),
            "mean_ms": c.r(statistics.fmean(times[arm]), 3),
            "mean_searches_run": c.r(statistics.fmean(searches_run[arm]), 2),
            # share of turns that skipped at least one search, and where they stopped
            "share_stopped_early": c.r(statistics.fmean(s is not None for s in stopped[arm]), 3),
            "stopped_after": {
                str(name): stopped[arm].count(name) for name in dict.fromkeys(stopped[arm])
            },
            f"recall_at_{k}": c.r(statistics.fmean(recalls[arm]), 3),
        }
    # where the early-exit arm stops is a property of the query: split the timings by it
    by_stop: dict[str, Any] = {}
    for stop in dict.fromkeys(stopped["early_exit"]):
        picked = [i for i, s in enumerate(stopped["early_exit"]) if s == stop]
        by_stop[str(stop)] = {
            "n": len(picked),
            **{f"{arm}_p50_ms": c.r(c.median([times[arm][i] for i in picked]), 3) for arm in ARMS},
        }
    ee, ev = arms["early_exit"], arms["every_search"]
    paired_recall = [
        a - b for a, b in zip(recalls["early_exit"], recalls["every_search"], strict=True)
    ]
    return {
        "n_queries": len(queries),
        "arms": arms,
        "speedup_median": c.r(ev["time"]["p50_ms"] / ee["time"]["p50_ms"], 2),
        "speedup_p90": c.r(ev["time"]["p90_ms"] / ee["time"]["p90_ms"], 2),
        "by_early_exit_stop": by_stop,
        "speedup_mean": c.r(ev["mean_ms"] / ee["mean_ms"], 2),
        "recall_cost": c.r(ev[f"recall_at_{k}"] - ee[f"recall_at_{k}"], 3),
        "queries_losing_recall": sum(1 for d in paired_recall if d < 0),
        "queries_gaining_recall": sum(1 for d in paired_recall if d > 0),
        "wall_s": c.elapsed(t_start),
    }


def summary(doc: dict[str, Any]) -> str:
    res, p = doc["results"], doc["parameters"]
    k = p["settings"]["k"]
    lines = [
        f"\nembedder {p['embedder']}, {res['n_queries']} queries x {p['rounds']} rounds, "
        f"searches {p['settings']['searches']}, min_results {p['settings']['min_results']}",
        f"{'arm':<14}{'n':>6}{'p50 ms':>10}{'p90 ms':>10}{'searches':>10}{'stopped':>9}"
        f"{'recall@' + str(k):>11}",
    ]
    for arm, a in res["arms"].items():
        t = a["time"]
        lines.append(
            f"{arm:<14}{t['n']:>6}{c.fmt(t['p50_ms'], '.2f'):>10}{c.fmt(t['p90_ms'], '.2f'):>10}"
            f"{a['mean_searches_run']:>10.2f}{a['share_stopped_early']:>9.2f}"
            f"{a[f'recall_at_{k}']:>11.3f}"
        )
    for stop, g in res["by_early_exit_stop"].items():
        lines.append(
            f"  queries stopping after {stop:<8} n={g['n']:<4} p50 {g['early_exit_p50_ms']:.2f} ms "
            f"with early exit vs {g['every_search_p50_ms']:.2f} ms running every search"
        )
    lines.append(
        f"early exit: {res['speedup_mean']}x faster on the mean, "
        f"{res['speedup_median']}x at the median, {res['speedup_p90']}x at "
        f"the p90; recall cost {res['recall_cost']:+.3f} ({res['queries_losing_recall']} of "
        f"{res['n_queries']} queries lose recall)"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="timed passes over the queries")
    ap.add_argument("--embedder", choices=["auto", "minilm", "hash"], default="auto")
    c.add_common_options(ap)
    args = ap.parse_args(argv)
    embedder = pick_embedder(args.embedder)
    settings = RetrievalSettings()
    doc = c.new_document(
        NAME,
        argv,
        {
            "rounds": args.rounds,
            "embedder": embedder.model,
            "queries": str(QUERIES.relative_to(QUERIES.parent.parent)),
            "settings": settings.model_dump(mode="json", exclude={"embedding"}),
        },
    )
    doc["results"] = asyncio.run(run(args.rounds, embedder))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
