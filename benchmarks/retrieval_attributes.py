"""Recall and precision of the default retrieve stage with its attribute rules off and on.

The default stage (``keyword`` → ``hybrid`` → ``filter``, ``min_results = 4``, ``k = 8``)
on the sample catalogue for every labelled query of ``evals/retrieval_queries.jsonl``,
twice: ``attribute_rules = false`` (before: a product matches a word it negates, a
padding search adds products without the attribute named) and ``true`` (the default:
:mod:`chainrun.retrieval.attributes`). Per arm and query: recall@k (R-capped:
|found ∩ expected| / min(k, |expected|), :func:`chainrun.retrieval.evaluate.recall_at_k`)
and precision (|found ∩ expected| / |found|; a query that found nothing counts 0);
means over the queries with a 95% interval (t on the per-query values, n = queries),
the paired difference, and the products each arm handed over that were not expected.
No timing (no lock needed). The embedder is all-MiniLM-L6-v2 when installed, else the
hashing test embedder (said in the document).

Run: ``python benchmarks/retrieval_attributes.py [--queries FILE] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import _common as c
import sqlite_utils

from chainrun.retrieval import HashEmbedder, MiniLMEmbedder, RetrievalSettings, build_retriever
from chainrun.retrieval.catalog import ensure_sample_catalog
from chainrun.retrieval.evaluate import load_queries, recall_at_k

NAME = "retrieval_attributes"
QUERIES = Path(__file__).resolve().parent.parent / "evals" / "retrieval_queries.jsonl"
ARMS = {"before": False, "after": True}


def mean_ci(values: list[float]) -> dict[str, Any]:
    """Mean with a 95% t interval (Student; scipy's t quantile), n."""
    from scipy import stats as st

    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return {"mean": round(m, 4), "ci95": None, "n": n}
    half = st.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    half = float(half)
    return {"mean": round(m, 4), "ci95": [round(m - half, 4), round(m + half, 4)], "n": n}


async def run(queries_path: Path) -> dict[str, Any]:
    db = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(db)
    embedder = MiniLMEmbedder() if MiniLMEmbedder.available() else HashEmbedder()
    queries = load_queries(queries_path)
    per_arm: dict[str, dict[str, Any]] = {}
    for arm, flag in ARMS.items():
        settings = RetrievalSettings(attribute_rules=flag)
        retriever = build_retriever(settings, db, embedder=embedder)
        await retriever.warm()
        recalls, precisions, rows = [], [], []
        try:
            for q in queries:
                found = await retriever.retrieve(q.query, label=q.label)
                ids = found.ids
                right = len(set(ids) & set(q.expected))
                recalls.append(recall_at_k(ids, q.expected, settings.k))
                precisions.append(right / len(ids) if ids else 0.0)
                excluded = {i: why for s in found.searches for i, why in s.excluded.items()}
                rows.append({"query": q.query, "found": ids, "right": right,
                             "unexpected": [i for i in ids if i not in q.expected],
                             "excluded": excluded})  # fmt: skip
        finally:
            await retriever.aclose()
        per_arm[arm] = {"recall": mean_ci(recalls), "precision": mean_ci(precisions),
                        "recall_values": recalls, "precision_values": precisions,
                        "queries": rows}  # fmt: skip
    diffs = {}
    for metric in ("recall", "precision"):
        after, before = per_arm["after"][f"{metric}_values"], per_arm["before"][f"{metric}_values"]
        diffs[metric] = mean_ci([a - b for a, b in zip(after, before, strict=True)])
    return {"embedder": embedder.model, "n_queries": len(queries), "arms": per_arm,
            "after_minus_before": diffs}  # fmt: skip


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = [f"embedder {res['embedder']}, n = {res['n_queries']} queries"]
    for arm, v in res["arms"].items():
        rec, prec = v["recall"], v["precision"]
        lines.append(f"{arm:<7} recall@8 {rec['mean']:.3f} {rec['ci95']}  "
                     f"precision {prec['mean']:.3f} {prec['ci95']}")  # fmt: skip
    for metric, d in res["after_minus_before"].items():
        lines.append(f"after - before, {metric}: {d['mean']:+.4f} {d['ci95']}")
    for q_b, q_a in zip(res["arms"]["before"]["queries"], res["arms"]["after"]["queries"],
                        strict=True):  # fmt: skip
        if q_b["found"] != q_a["found"]:
            lines.append(f"  {q_a['query']!r}: right {q_b['right']} -> {q_a['right']} of "
                         f"{len(q_b['found'])} -> {len(q_a['found'])}; excluded "
                         f"{q_a['excluded']}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", default=str(QUERIES), help="labelled queries (JSONL)")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = c.new_document(NAME, argv or [], vars(args))
    doc["results"] = asyncio.run(run(Path(args.queries)))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
