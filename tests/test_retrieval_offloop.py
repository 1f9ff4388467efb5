"""Catalogue reads leave the event loop, and filters hold at any catalogue size."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlite_utils
from conftest import ticks_while

from chainrun.retrieval import (
    Filters,
    FilterSearch,
    HashEmbedder,
    KeywordSearch,
    VectorIndex,
    VectorSearch,
)
from chainrun.retrieval.catalog import ensure_sample_catalog, synthetic_products, write_products
from chainrun.retrieval.reader import CatalogReader, database_file, load_sqlite_vec, reader_for

HAS_VEC = load_sqlite_vec(sqlite_utils.Database(memory=True))


@pytest.fixture
def file_db(tmp_path: Path) -> Iterator[sqlite_utils.Database]:
    d = sqlite_utils.Database(tmp_path / "cat.db")
    d.execute("pragma journal_mode = wal")
    ensure_sample_catalog(d)
    yield d
    reader_for(d).close()
    d.close()


@pytest.fixture
def mem_db() -> Iterator[sqlite_utils.Database]:
    d = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(d)
    yield d
    d.close()


async def test_reads_of_a_file_run_on_worker_threads(file_db: sqlite_utils.Database) -> None:
    reader = reader_for(file_db)
    assert reader.off_loop and database_file(file_db) == reader.path
    name = await reader.run(lambda db: threading.current_thread().name)
    assert name.startswith("chainrun-catalog")
    # each worker has its own connection, read-only
    with pytest.raises(Exception, match="readonly"):
        await reader.run(lambda db: db.execute("delete from products"))


async def test_in_memory_reads_stay_inline(mem_db: sqlite_utils.Database) -> None:
    reader = CatalogReader(mem_db)
    assert not reader.off_loop
    assert await reader.run(lambda db: threading.current_thread().name) == (
        threading.current_thread().name
    )


async def test_the_loop_runs_while_a_slow_read_does(file_db: sqlite_utils.Database) -> None:
    reader = reader_for(file_db)
    slow = (
        "with recursive c(x) as (select 1 union all select x + 1 from c where x < 3000000) "
        "select count(*) from c"
    )
    (count,), ticks = await ticks_while(reader.run(lambda db: db.execute(slow).fetchone()))
    assert count == 3_000_000
    assert ticks >= 2  # on the loop, the timer could not have fired during the query


async def test_searches_on_a_file_agree_with_in_memory(
    file_db: sqlite_utils.Database, mem_db: sqlite_utils.Database
) -> None:
    f = Filters(max_price=120, categories=("jackets", "coats"))
    for query, filters in (("waterproof jacket", None), ("warm coat", f)):
        a = await KeywordSearch(file_db, "any").search(query, 8, filters=filters)
        b = await KeywordSearch(mem_db, "any").search(query, 8, filters=filters)
        assert [h.id for h in a] == [h.id for h in b] and a
    a = await FilterSearch(file_db).search("", 8, filters=f)
    assert [h.id for h in a] == [h.id for h in await FilterSearch(mem_db).search("", 8, filters=f)]
    embedder = HashEmbedder()
    on_file = VectorIndex(file_db, embedder, backend="numpy", seeds=())
    in_mem = VectorIndex(mem_db, embedder, backend="numpy", seeds=())
    await on_file.ensure()
    await in_mem.ensure()
    a = await VectorSearch(on_file).search("rain jacket", 5, filters=f)
    b = await VectorSearch(in_mem).search("rain jacket", 5, filters=f)
    assert [h.id for h in a] == [h.id for h in b] and len(a) == 5


# -- filters before the limit, at scale ------------------------------------------------


@pytest.fixture(scope="module")
def big_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite_utils.Database]:
    d = sqlite_utils.Database(tmp_path_factory.mktemp("big") / "big.db")
    write_products(d, synthetic_products(3000, seed=1), source="synthetic")
    yield d
    reader_for(d).close()
    d.close()


def test_synthetic_products_are_deterministic() -> None:
    a, b = synthetic_products(400, seed=3), synthetic_products(400, seed=3)
    assert a == b and len({p.id for p in a}) == 400
    assert synthetic_products(400, seed=4) != a


def _matching(db: sqlite_utils.Database, f: Filters) -> set[str]:
    where, params = f.sql("p")
    return {r[0] for r in db.execute(f"select p.id from products p where {where}", params)}


@pytest.mark.parametrize("backend", ["numpy", "sqlite-vec", "vec0"])
async def test_a_filtered_vector_query_is_never_empty_while_products_match(
    big_db: sqlite_utils.Database, backend: str
) -> None:
    if backend != "numpy" and not HAS_VEC:
        pytest.skip("sqlite-vec cannot be loaded here")
    index = VectorIndex(big_db, HashEmbedder(), backend=backend, seeds=())
    await index.ensure()
    search = VectorSearch(index)
    prices = sorted(r[0] for r in big_db.execute("select price from products"))
    cheapest = prices[2]  # three products at most pass "max_price = cheapest"
    cases = [
        Filters(max_price=cheapest),
        Filters(categories=("bags",)),
        Filters(categories=("jackets",), min_price=prices[-40]),
        Filters(sizes=("XXL",), max_price=prices[len(prices) // 10]),
        Filters(sizes=("46", "W28"), categories=("shoes", "jeans", "bags")),
        Filters(sizes=("46",), max_price=prices[len(prices) // 20], in_stock=False),
        Filters(categories=("no-such-category",)),
    ]
    for f in cases:
        matching = _matching(big_db, f)
        hits = await search.search("warm winter coat", 8, filters=f)
        assert len(hits) == min(8, len(matching)), f
        assert {h.id for h in hits} <= matching
        sims = [h.score for h in hits]
        assert sims == sorted(sims, reverse=True)
    await index.aclose()


async def test_numpy_top_k_equals_a_full_sort(big_db: sqlite_utils.Database) -> None:
    embedder = HashEmbedder()
    index = VectorIndex(big_db, embedder, backend="numpy", seeds=())
    await index.ensure()
    q = (await embedder.embed(["linen shirt"]))[0]
    sims = index._matrix @ q
    full = [index._ids[i] for i in np.argsort(-sims, kind="stable")[:10]]
    assert [h.id for h in index.nearest(q, 10)] == full
    await index.aclose()
