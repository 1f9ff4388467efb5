"""Retrieval at scale: per-search latency on a synthetic catalogue of 10,000 and 100,000 products.

Issue 13, target 3. For each size, a temporary SQLite file gets ``synthetic_products(n)``
(``chainrun.retrieval.catalog``: variants of the 285 sample products, generated, never shipped)
and one vector per product for a 384-dimension embedding model (the size of MiniLM's):
the hashing embedder's vector of the product's base sample product plus Gaussian noise
(sigma 0.3 per unit vector), written with the text hash the index expects, so the index
is current without embedding 100,000 texts (this benchmark times searches, not
indexing). Queries are the 18 of ``evals/retrieval_queries.jsonl`` cycled, parsed as a
turn parses them (``parse_query``: filters for price, size and category, in stock).

The ``sized`` query set is the same 18, each with a size filter added: a size that
products passing the query's other filters have in stock, in turn the most common, the
median and the rarest one, so that the size filter, which vec0 applies after its KNN,
is exercised from unselective to selective.

Per size and search, one search at a time (``--searches`` each, default 400: enough for
a p99 interval):

* ``keyword`` (FTS5 bm25, all terms), ``keyword_any`` (any term);
* ``vector_numpy`` (the index's NumPy scan: filter rows selected first, then the
  partial top-k), ``vector_sqlite_vec`` (sqlite-vec's ``vec_distance_cosine`` over every
  vector in SQL, filter in the same ``where``), ``vector_vec0`` (KNN on a sqlite-vec
  ``vec0`` table: category partitions, price/stock metadata, size filters oversampled;
  ``chainrun.retrieval.vec0``), all exact; each also on the ``sized`` queries
  (``…_sized``);
* ``hybrid_<backend>`` (keyword_any + vector by reciprocal rank fusion, the default
  chain's search) on each vector backend.

Each gives p50/p99 in ms with 95% order-statistic intervals and n, the share of searches
that came back empty, and for vector and hybrid searches ``short_of_k``: searches that
answered fewer than min(k, products passing the filter) hits (must be 0; every query
filters on stock, ``constrained`` of them on price, size or category too). vec0's
build time and its KNN rounds per query (oversampling growth) and exact fallbacks are
reported. Then the loop's own lag while 40 hybrid searches run at once (a 5 ms timer;
p99 and max), with the reads on worker threads (``CatalogReader``, the default) and
inline on the loop (as before issue 13).

Run: ``python benchmarks/retrieval_scale.py [--sizes 10000,100000] [--searches 400] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
from chainrun.retrieval.catalog import (
    SAMPLE_CATALOG,
    product_text,
    read_catalog,
    synthetic_products,
    write_products,
)
from chainrun.retrieval.reader import load_sqlite_vec, reader_for
from chainrun.retrieval.vector import _row, text_hash
from chainrun.statistics import intervals as stats

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ROOT / "evals" / "retrieval_queries.jsonl"
DIMS = 384
NOISE = 0.3
K = 8
CANDIDATES = 20
CONCURRENT = 40
#: vector backends compared (chainrun.retrieval.vector.VECTOR_BACKENDS less "auto")
BACKENDS = ("numpy", "sqlite-vec", "vec0")


def queries() -> list[tuple[str, Filters]]:
    """The eval queries as a turn parses them: (search text, filters)."""
    out = []
    for line in QUERIES.read_text(encoding="utf-8").splitlines():
        if line.strip():
            parsed = parse_query(json.loads(line)["query"], None, in_stock=True)
            out.append((parsed.text, parsed.filters))
    return out


def sized_queries(
    db: sqlite_utils.Database, qs: list[tuple[str, Filters]]
) -> list[tuple[str, Filters]]:
    """``qs`` with a size filter each: the most common, median or rarest size (in turn)
    in stock among the products passing the query's own filters."""
    out = []
    for i, (text, f) in enumerate(qs):
        where, params = f.sql("p")
        rows = db.execute(
            f"""select upper(ps.size) s
            from products p join product_sizes ps on ps.product_id = p.id
            where {where} and ps.stock > 0 group by s order by count(*) desc, s""",
            params,
        )
        sizes = [r[0] for r in rows]
        pick = sizes[[0, len(sizes) // 2, len(sizes) - 1][i % 3]] if sizes else "M"
        out.append((text, dataclasses.replace(f, sizes=(pick,))))
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
    times, empty, short, constrained = [], 0, 0, 0
    # a filtered search must fill k while k products pass (keyword needs its terms too)
    checked = search.name.startswith(("vector", "hybrid"))
    for i in range(n):
        text, f = qs[i % len(qs)]
        t0 = time.perf_counter()
        hits = await search.search(text, K, filters=f)
        times.append((time.perf_counter() - t0) * 1000.0)
        empty += not hits
        constrained += f.constrains
        short += checked and len(hits) < min(K, matching[i % len(qs)])
    out = {**summarize(times), "share_empty": round(empty / n, 4), "constrained": constrained}
    return {**out, "short_of_k": short if checked else None}


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
    sets = {"": queries()}
    sets["_sized"] = sized_queries(db, sets[""])
    matching = {key: [matching_count(db, f) for _, f in qs] for key, qs in sets.items()}
    has_vec = load_sqlite_vec(db)
    out: dict[str, Any] = {"products": n, "queries": len(sets[""]), "sqlite_vec": has_vec}
    indexes: dict[str, VectorIndex] = {}
    for backend in BACKENDS if has_vec else ("numpy",):
        index = VectorIndex(db, embedder, backend=backend, seeds=())
        t0 = time.perf_counter()
        embedded = await index.ensure()  # numpy: loads the matrix; vec0: builds the table
        out[f"index_ready_s_{backend}"] = round(time.perf_counter() - t0, 2)
        assert embedded == 0, "the vectors should be current"
        indexes[backend] = index
    kw_any = KeywordSearch(db, "any")
    plain: dict[str, Search] = {"keyword": KeywordSearch(db, "all"), "keyword_any": kw_any}
    for backend, index in indexes.items():
        name = backend.replace("-", "_")
        plain[f"vector_{name}"] = _named(VectorSearch(index), f"vector_{name}")
    for backend, index in indexes.items():
        name = f"hybrid_{backend.replace('-', '_')}"
        plain[name] = _named(
            HybridSearch([kw_any, VectorSearch(index)], candidates=CANDIDATES), name
        )
    vec0 = indexes["vec0"].vec0 if "vec0" in indexes else None
    runs = [(name, search, "") for name, search in plain.items()]
    for backend, index in indexes.items():
        name = f"vector_{backend.replace('-', '_')}_sized"
        runs.append((name, _named(VectorSearch(index), name), "_sized"))
    results: dict[str, Any] = {}
    for name, search, key in runs:
        before = vec0.stats.copy() if vec0 is not None else None
        res = await time_search(search, sets[key], searches, matching[key])
        if vec0 is not None and before is not None and "vec0" in name:
            used = vec0.stats - before  # KNN rounds (oversampling growth), exact fallbacks
            res["vec0_rounds_per_search"] = round(used["rounds"] / max(1, used["queries"]), 3)
            res["vec0_exact_scans"] = used["exact_scans"]
            res["vec0_exact_fallbacks"] = used["exact_fallbacks"]
        results[name] = res
    out["searches"] = results
    auto = "sqlite-vec" if has_vec else "numpy"  # the "auto" backend, as a chain builds it
    hybrid = HybridSearch([kw_any, VectorSearch(indexes[auto])], candidates=CANDIDATES)
    out["loop_lag_hybrid_backend"] = auto
    qs = sets[""]
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
    for index in indexes.values():
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
        ready = ", ".join(
            f"{k.removeprefix('index_ready_s_')} {v} s"
            for k, v in res.items()
            if k.startswith("index_ready_s_")
        )
        lines.append(f"\n{size} products (build {res['build_s']} s; index ready: {ready})")
        head = f"  {'search':<24} {'n':>4} {'p50 ms':>8} {'p99 ms':>8}"
        lines.append(f"{head} {'empty':>6} {'short of k':>10}")
        for name, s in res["searches"].items():
            short = "-" if s["short_of_k"] is None else f"{s['short_of_k']} of {s['n']}"
            lines.append(
                f"  {name:<24} {s['n']:>4} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} "
                f"{s['share_empty']:>6.3f} {short:>10}"
            )
        for name, s in res["searches"].items():
            if "vec0_rounds_per_search" in s:
                lines.append(f"  {name}: {s['vec0_rounds_per_search']} KNN rounds per search, "
                             f"{s['vec0_exact_scans']} exact scans (few pass), "
                             f"{s['vec0_exact_fallbacks']} exact fallbacks")  # fmt: skip
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
    parser.add_argument("--searches", type=int, default=400, help="searches per search kind")
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
