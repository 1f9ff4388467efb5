"""Retrieval at scale: per-search latency on a synthetic catalogue of 10,000 and 100,000 products.

Issue 13, target 3. For each size, a temporary SQLite file gets ``synthetic_products(n)``
(``chainrun.catalog``: variants of the 285 sample products, generated, never shipped)
and one vector per product for a 384-dimension embedding model (the size of MiniLM's):
the hashing embedder's vector of the product's base sample product plus Gaussian noise
(sigma 0.3 per unit vector), written with the text hash the index expects, so the index
is current without embedding 100,000 texts (this benchmark times searches, not
indexing). Queries are the 18 of ``evals/retrieval_queries.jsonl`` cycled, parsed as a
turn parses them (``parse_query``: filters for price, size and category, in stock).

Per size and search, one search at a time (``--searches`` each, default 200):

* ``keyword`` (FTS5 bm25, all terms), ``keyword_any`` (any term);
* ``vector_numpy`` (the index's NumPy scan: filter rows selected first, then the
  partial top-k), ``vector_sqlite_vec`` (sqlite-vec's ``vec_distance_cosine`` over every
  vector in SQL, filter in the same ``where``), both exact;
* ``hybrid`` (keyword_any + vector by reciprocal rank fusion, the default chain's search),
  on the index's default backend.

Each gives p50/p99 in ms with 95% order-statistic intervals and n, the share of searches
that came back empty, and ``empty_while_matching`` (a filtered search that answered fewer
than min(k, matching products) hits: must be 0). Then the loop's own lag while 40
hybrid searches run at once (a 5 ms timer; p99 and max), with the reads on worker
threads (``CatalogReader``, the default) and inline on the loop (as before issue 13).

Run: ``python benchmarks/retrieval_scale.py [--sizes 10000,100000] [--searches 200] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c
import numpy as np
import sqlite_utils

from chainrun import stats
from chainrun.catalog import (
    SAMPLE_CATALOG,
    product_text,
    read_catalog,
    synthetic_products,
    write_products,
)
from chainrun.retrieval import (
    Filters,
    HashEmbedder,
    HybridSearch,
    KeywordSearch,
    VectorIndex,
    VectorSearch,
    parse_query,
)
from chainrun.retrieval.base import Search
from chainrun.retrieval.reader import reader_for
from chainrun.retrieval.vector import _row, load_sqlite_vec, text_hash

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ROOT / "evals" / "retrieval_queries.jsonl"
DIMS = 384
NOISE = 0.3
K = 8
CANDIDATES = 20
CONCURRENT = 40


def queries() -> list[tuple[str, Filters]]:
    """The eval queries as a turn parses them: (search text, filters)."""
    out = []
    for line in QUERIES.read_text(encoding="utf-8").splitlines():
        if line.strip():
            parsed = parse_query(json.loads(line)["query"], None, in_stock=True)
            out.append((parsed.text, parsed.filters))
    return out


def build(path: Path, n: int, embedder: HashEmbedder, seed: int) -> float:
    """Write the synthetic catalogue and its vectors to ``path``; seconds taken."""
    t0 = time.perf_counter()
    db = sqlite_utils.Database(path)
    db.execute("pragma journal_mode = wal")
    products = synthetic_products(n, seed=seed)
    write_products(db, products, source=f"synthetic:{n}")
    base = read_catalog(SAMPLE_CATALOG)
    base_vecs = np.stack([embedder.vector(product_text(p.model_dump())) for p in base])
    base_vecs /= np.maximum(np.linalg.norm(base_vecs, axis=1, keepdims=True), 1e-9)
    rng = np.random.default_rng(seed)
    rows = []
    for i, p in enumerate(products):
        v = base_vecs[i % len(base)] + rng.normal(0.0, NOISE / np.sqrt(DIMS), DIMS)
        v = (v / np.linalg.norm(v)).astype(np.float32)
        h = text_hash(embedder.model, product_text(p.model_dump()))
        rows.append(_row(p.id, embedder.model, h, v))
        if len(rows) == 5000:
            db.table("product_embeddings").insert_all(rows, pk=("product_id", "model"))
            rows = []
    if rows:
        db.table("product_embeddings").insert_all(rows, pk=("product_id", "model"))
    db.close()
    return time.perf_counter() - t0


def matching_count(db: sqlite_utils.Database, f: Filters) -> int:
    where, params = f.sql("p")
    return int(db.execute(f"select count(*) from products p where {where}", params).fetchone()[0])


def summarize(times: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(times)}
    for p in (50, 99):
        out[f"p{p}_ms"] = round(stats.percentile(times, p), 3)
        ci = stats.quantile_ci(times, p)
        out[f"p{p}_ci95"] = None if ci is None else [round(ci[0], 3), round(ci[1], 3)]
    return out


async def time_search(
    search: Search, qs: list[tuple[str, Filters]], n: int, matching: list[int]
) -> dict[str, Any]:
    """``n`` searches one at a time, cycling the queries."""
    await search.search(qs[0][0], K, filters=qs[0][1])  # warm: threads, connections, pages
    times, empty, short = [], 0, 0
    for i in range(n):
        text, f = qs[i % len(qs)]
        t0 = time.perf_counter()
        hits = await search.search(text, K, filters=f)
        times.append((time.perf_counter() - t0) * 1000.0)
        empty += not hits
        # a filtered search must fill k while k products pass (keyword needs its terms too)
        if "vector" in search.name and len(hits) < min(K, matching[i % len(qs)]):
            short += 1
    return {**summarize(times), "share_empty": round(empty / n, 4), "empty_while_matching": short}


async def loop_lag_during(search: Search, qs: list[tuple[str, Filters]]) -> dict[str, Any]:
    """The loop's lag (5 ms timer) while ``CONCURRENT`` searches run at once, twice over."""
    lags: list[float] = []
    stop = False

    async def sampler() -> None:
        loop = asyncio.get_running_loop()
        while not stop:
            asked = loop.time() + 0.005
            await asyncio.sleep(0.005)
            lags.append(max(0.0, loop.time() - asked) * 1000.0)

    task = asyncio.create_task(sampler())
    t0 = time.perf_counter()
    for _ in range(2):
        await asyncio.gather(*(search.search(*_args(qs[i % len(qs)])) for i in range(CONCURRENT)))
    wall = (time.perf_counter() - t0) * 1000.0
    stop = True
    await task
    return {
        "searches": 2 * CONCURRENT,
        "wall_ms": round(wall, 1),
        "lag_n": len(lags),
        "lag_p99_ms": round(stats.percentile(lags, 99), 2) if lags else None,
        "lag_max_ms": round(max(lags), 2) if lags else None,
    }


def _args(q: tuple[str, Filters]) -> tuple[str, int]:
    return q[0], K


async def run_size(path: Path, n: int, searches: int, embedder: HashEmbedder) -> dict[str, Any]:
    db = sqlite_utils.Database(path)
    qs = queries()
    matching = [matching_count(db, f) for _, f in qs]
    has_vec = load_sqlite_vec(db)
    out: dict[str, Any] = {"products": n, "queries": len(qs), "sqlite_vec": has_vec}
    numpy_index = VectorIndex(db, embedder, use_sqlite_vec=False, seeds=())
    t0 = time.perf_counter()
    embedded = await numpy_index.ensure()
    out["index_load_s"] = round(time.perf_counter() - t0, 2)
    assert embedded == 0, "the vectors should be current"
    kw_any = KeywordSearch(db, "any")
    searches_by_name: dict[str, Search] = {
        "keyword": KeywordSearch(db, "all"),
        "keyword_any": kw_any,
        "vector_numpy": _named(VectorSearch(numpy_index), "vector_numpy"),
    }
    vec_index = None
    if has_vec:
        vec_index = VectorIndex(db, embedder, use_sqlite_vec=True, seeds=())
        await vec_index.ensure()
        searches_by_name["vector_sqlite_vec"] = _named(VectorSearch(vec_index), "vector_sqlite_vec")
    default_index = vec_index or numpy_index
    hybrid = HybridSearch([kw_any, VectorSearch(default_index)], candidates=CANDIDATES)
    searches_by_name["hybrid"] = hybrid
    out["hybrid_vector_backend"] = default_index.backend
    results: dict[str, Any] = {}
    for name, search in searches_by_name.items():
        results[name] = await time_search(search, qs, searches, matching)
    out["searches"] = results
    # the loop while 40 hybrid searches run at once: reads on worker threads vs inline
    out["loop_lag_off_loop"] = await loop_lag_during(hybrid, qs)
    reader = reader_for(db)
    saved = reader.path
    reader.path = None  # inline on the loop, as before issue 13
    try:
        out["loop_lag_inline"] = await loop_lag_during(hybrid, qs)
    finally:
        reader.path = saved
    await asyncio.to_thread(reader.close)
    for index in (numpy_index, vec_index):
        if index is not None:
            await index.aclose()
    db.close()
    return out


class _named:
    """A search under another name (to report two backends of one search side by side)."""

    def __init__(self, search: Search, name: str) -> None:
        self._search = search
        self.name = name

    async def search(self, query: str, k: int, *, filters: Filters | None = None) -> list[Any]:
        return await self._search.search(query, k, filters=filters)


def summary(doc: dict[str, Any]) -> str:
    lines = []
    for size, res in doc["results"]["sizes"].items():
        lines.append(
            f"\n{size} products (build {res['build_s']} s, index load "
            f"{res['index_load_s']} s, hybrid on {res['hybrid_vector_backend']})"
        )
        head = f"  {'search':<18} {'n':>4} {'p50 ms':>8} {'p99 ms':>8}"
        lines.append(f"{head} {'empty':>6} {'short':>5}")
        for name, s in res["searches"].items():
            lines.append(
                f"  {name:<18} {s['n']:>4} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} "
                f"{s['share_empty']:>6.3f} {s['empty_while_matching']:>5}"
            )
        for key in ("loop_lag_off_loop", "loop_lag_inline"):
            lag = res[key]
            lines.append(f"  {key}: {lag['searches']} hybrid searches, {CONCURRENT} at once: "
                         f"wall {lag['wall_ms']} ms, loop lag p99 {lag['lag_p99_ms']} ms, "
                         f"max {lag['lag_max_ms']} ms (n {lag['lag_n']})")  # fmt: skip
    lines.append(f"\npeak RSS {doc['results']['peak_rss_mb']} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="catalogue sizes (products)")
    parser.add_argument("--searches", type=int, default=200, help="searches per search kind")
    parser.add_argument("--seed", type=int, default=0)
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    doc = c.new_document(
        "retrieval_scale",
        sys.argv[1:] if argv is None else argv,
        {
            "sizes": sizes,
            "searches": args.searches,
            "k": K,
            "dims": DIMS,
            "noise": NOISE,
            "candidates": CANDIDATES,
            "concurrent": CONCURRENT,
            "seed": args.seed,
        },
    )
    embedder = HashEmbedder(DIMS)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="chainrun-retrieval-scale-") as tmp:
        for n in sizes:
            path = Path(tmp) / f"catalog-{n}.db"
            build_s = build(path, n, embedder, args.seed)
            res = asyncio.run(run_size(path, n, args.searches, embedder))
            results[str(n)] = {"build_s": round(build_s, 1), **res}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    doc["results"] = {"sizes": results, "peak_rss_mb": round(peak, 1)}
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main()
