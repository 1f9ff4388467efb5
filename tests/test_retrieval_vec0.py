"""The vec0 vector backend: exact KNN with filters, kept in step with the catalogue."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import numpy as np
import pytest
import sqlite_utils

from chainrun.errors import ConfigError
from chainrun.retrieval import (
    Filters,
    HashEmbedder,
    RetrievalSettings,
    VectorIndex,
    VectorSearch,
    build_retriever,
)
from chainrun.retrieval import vec0 as vec0_module
from chainrun.retrieval.catalog import (
    SAMPLE_CATALOG,
    Product,
    ensure_sample_catalog,
    product_text,
    read_catalog,
    synthetic_products,
    write_products,
)
from chainrun.retrieval.hits import Hit
from chainrun.retrieval.reader import load_sqlite_vec, reader_for
from chainrun.retrieval.vec0 import table_name
from chainrun.retrieval.vector import _row, text_hash

pytestmark = pytest.mark.skipif(
    not load_sqlite_vec(sqlite_utils.Database(memory=True)),
    reason="sqlite-vec cannot be loaded (needs the sqlite-vec and pysqlite3-binary packages)",
)


@pytest.fixture(scope="module")
def big_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite_utils.Database]:
    """The 3,000-product synthetic catalogue of tests/test_retrieval_offloop.py, on a file."""
    d = sqlite_utils.Database(tmp_path_factory.mktemp("vec0") / "big.db")
    d.execute("pragma journal_mode = wal")
    write_products(d, synthetic_products(3000, seed=1), source="synthetic")
    yield d
    reader_for(d).close()
    d.close()


@pytest.fixture(scope="module")
def indexes(big_db: sqlite_utils.Database) -> dict[str, VectorIndex]:
    """A NumPy (the reference: a full scan) and a vec0 index of ``big_db``, built."""
    embedder = HashEmbedder()
    out = {b: VectorIndex(big_db, embedder, backend=b, seeds=()) for b in ("numpy", "vec0")}

    async def build() -> None:
        for index in out.values():
            await index.ensure()

    asyncio.run(build())
    return out


def _matching(db: sqlite_utils.Database, f: Filters) -> set[str]:
    where, params = f.sql("p")
    return {r[0] for r in db.execute(f"select p.id from products p where {where}", params)}


def _same_ranking(a: list[Hit], b: list[Hit]) -> None:
    """Same length and scores; the same products except where scores tie at the cut."""
    assert len(a) == len(b)
    assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-5)
    if a:
        cut = min(h.score for h in a) + 1e-5
        assert {h.id for h in a if h.score > cut} == {h.id for h in b if h.score > cut}


def _random_filters(db: sqlite_utils.Database, n: int, seed: int) -> list[Filters]:
    rng = random.Random(seed)
    categories = [r[0] for r in db.execute("select distinct category from products")]
    sizes = [r[0] for r in db.execute("select distinct upper(size) from product_sizes")]
    prices = sorted(r[0] for r in db.execute("select price from products"))
    out = []
    for _ in range(n):
        lo = rng.choice([None, prices[rng.randrange(len(prices))]])
        hi = rng.choice([None, prices[rng.randrange(len(prices))]])
        if lo is not None and hi is not None and lo > hi:
            lo, hi = hi, lo
        out.append(
            Filters(
                min_price=lo,
                max_price=hi,
                categories=tuple(rng.sample(categories, rng.choice([0, 0, 1, 2, 3]))),
                sizes=tuple(rng.sample(sizes, rng.choice([0, 0, 1, 2]))),
                in_stock=rng.random() < 0.8,
            )
        )
    return out


async def test_vec0_ranks_as_the_exact_scan_under_any_filter(
    big_db: sqlite_utils.Database, indexes: dict[str, VectorIndex]
) -> None:
    numpy_index, vec0_index = indexes["numpy"], indexes["vec0"]
    embedder = numpy_index.embedder
    texts = ["warm winter coat", "linen shirt", "running shoes", "leather bag", "silk dress"]
    vectors = await embedder.embed(texts)
    filters = [None, Filters(), *_random_filters(big_db, 60, seed=7)]
    for i, f in enumerate(filters):
        q = vectors[i % len(texts)]
        for k in (1, 8, 30):
            got = vec0_index.nearest(q, k, f)
            _same_ranking(got, numpy_index.nearest(q, k, f))
            matching = _matching(big_db, f or Filters())
            assert len(got) == min(k, len(matching)), f
            assert {h.id for h in got} <= matching


async def test_when_few_products_pass_the_exact_scan_over_them_answers(
    big_db: sqlite_utils.Database, indexes: dict[str, VectorIndex]
) -> None:
    index = indexes["vec0"]
    assert index.vec0 is not None
    prices = sorted(r[0] for r in big_db.execute("select price from products"))
    # about one product in 25 has size 46 in stock; under the 20% price cut, a handful
    f = Filters(sizes=("46",), max_price=prices[len(prices) // 5])
    matching = _matching(big_db, f)
    assert 8 < len(matching) < 60
    q = (await index.embedder.embed(["smart leather shoes"]))[0]
    before = index.vec0.stats.copy()
    hits = index.nearest(q, 8, f)
    used = index.vec0.stats - before
    assert used["exact_scans"] == 1 and used["rounds"] == 1  # no growth rounds first
    assert len(hits) == 8 and {h.id for h in hits} <= matching
    _same_ranking(hits, indexes["numpy"].nearest(q, 8, f))
    # a size most products have in stock: k x oversample candidates hold k in one round
    common = Filters(sizes=("ONE SIZE", "M", "40"))
    before = index.vec0.stats.copy()
    assert len(index.nearest(q, 8, common)) == 8
    assert index.vec0.stats["rounds"] - before["rounds"] == 1
    assert index.vec0.stats["exact_scans"] == before["exact_scans"]


# sizes that about one product in five has in stock
_SOME_SIZES = Filters(sizes=("46", "30", "44", "26"))


async def test_a_size_filter_grows_the_candidates_until_k_pass(
    big_db: sqlite_utils.Database,
    indexes: dict[str, VectorIndex],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = indexes["vec0"]
    assert index.vec0 is not None
    monkeypatch.setattr(vec0_module, "SCAN_BELOW", 100)  # the filter passes more than that
    matching = _matching(big_db, _SOME_SIZES)
    assert 300 < len(matching) < 1500
    q = (await index.embedder.embed(["running shoes"]))[0]
    before = index.vec0.stats.copy()
    hits = index.nearest(q, 20, _SOME_SIZES)  # 80 candidates hold 16 that pass
    used = index.vec0.stats - before
    assert used["rounds"] == 2 and used["exact_scans"] == used["exact_fallbacks"] == 0
    assert len(hits) == 20 and {h.id for h in hits} <= matching
    _same_ranking(hits, indexes["numpy"].nearest(q, 20, _SOME_SIZES))


async def test_past_the_grown_knn_limit_the_exact_scan_answers(
    big_db: sqlite_utils.Database,
    indexes: dict[str, VectorIndex],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = indexes["vec0"]
    assert index.vec0 is not None
    monkeypatch.setattr(vec0_module, "SCAN_BELOW", 100)
    monkeypatch.setattr(vec0_module, "MAX_GROWN_K", 64)
    q = (await index.embedder.embed(["running shoes"]))[0]
    before = index.vec0.stats.copy()
    # too few of 120 candidates pass: 30 need more than 64
    hits = index.nearest(q, 30, _SOME_SIZES)
    used = index.vec0.stats - before
    assert used["exact_fallbacks"] == 1 and used["rounds"] == 1
    assert len(hits) == 30 and {h.id for h in hits} <= _matching(big_db, _SOME_SIZES)
    _same_ranking(hits, indexes["numpy"].nearest(q, 30, _SOME_SIZES))


async def test_vec0_searches_run_off_the_loop_on_the_file(
    big_db: sqlite_utils.Database, indexes: dict[str, VectorIndex]
) -> None:
    index = indexes["vec0"]
    assert reader_for(big_db).off_loop
    f = Filters(categories=("coats", "jackets"), max_price=150)
    hits = await VectorSearch(index).search("warm winter coat", 8, filters=f)
    assert len(hits) == 8 and {h.id for h in hits} <= _matching(big_db, f)
    rows = big_db.execute(f'select count(*) from "{table_name(index.embedder.model)}"')
    assert rows.fetchone()[0] == 3000  # every embedded product has its vec0 row


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs + (0.0,) * (8 - len(xs)), dtype=np.float32)
    return v / np.linalg.norm(v)


async def test_a_partition_s_far_candidates_wait_for_the_near_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """k best of a union: a far category cannot fill k while a near one is unexplored."""
    db = sqlite_utils.Database(memory=True)
    products = [
        Product(id=f"A{i}", title=f"coat {i}", category="coats", price=50,
                sizes={"S": 1} if i <= 4 else {"M": 1})
        for i in range(1, 7)
    ] + [
        Product(id=f"B{i}", title=f"bag {i}", category="bags", price=50, sizes={"M": 1})
        for i in range(1, 5)
    ]  # fmt: skip
    write_products(db, products, source="test")
    embedder = HashEmbedder(8)
    near = {f"A{i}": _unit(1, 0.1 * i) for i in range(1, 5)}  # closest, but no M
    mid = {"A5": _unit(1, 1.0), "A6": _unit(1, 1.1)}  # size M, cosine about 0.7
    far = {f"B{i}": _unit(0.2, 1, 0.1 * i) for i in range(1, 5)}  # size M, cosine about 0.2
    rows = [
        _row(p.id, embedder.model, text_hash(embedder.model, product_text(p.model_dump())), v)
        for p in products
        for v in [{**near, **mid, **far}[p.id]]
    ]
    db.table("product_embeddings").insert_all(rows, pk=("product_id", "model"))
    index = VectorIndex(db, embedder, backend="vec0", oversample=1, seeds=())
    assert await index.ensure() == 0  # the vectors above are current
    monkeypatch.setattr(vec0_module, "SCAN_BELOW", 2)  # no shortcut: six products pass
    f = Filters(categories=("coats", "bags"), sizes=("M",))
    hits = index.nearest(_unit(1), 2, f)
    assert [h.id for h in hits] == ["A5", "A6"]
    assert index.vec0 is not None and index.vec0.stats["rounds"] >= 2
    await index.aclose()
    db.close()


# -- kept in step with the catalogue -----------------------------------------------------


@pytest.fixture
def sample_db() -> Iterator[sqlite_utils.Database]:
    d = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(d)
    yield d
    d.close()


async def test_price_and_stock_changes_reach_the_vec0_metadata(
    sample_db: sqlite_utils.Database,
) -> None:
    index = VectorIndex(sample_db, HashEmbedder(), backend="vec0", seeds=())
    await index.ensure()
    q = (await index.embedder.embed(["waterproof rain jacket"]))[0]
    f = Filters(max_price=60, categories=("jackets",))
    first = index.nearest(q, 3, f)
    assert len(first) == 3
    top = first[0].id
    # reload: the top product now costs 500 and a sold-out jacket is back in stock
    products = read_catalog(SAMPLE_CATALOG)
    sold_out = next(p for p in products if p.category == "jackets" and p.stock == 0)
    changed = [
        p.model_copy(update={"price": 500.0}) if p.id == top
        else p.model_copy(update={"price": 10.0, "stock": 5}) if p.id == sold_out.id
        else p
        for p in products
    ]  # fmt: skip
    write_products(sample_db, changed, source="edited")
    assert await index.ensure() == 0  # nothing re-embedded: the texts are the same
    after = index.nearest(q, 50, f)
    assert top not in {h.id for h in after}
    assert sold_out.id in {h.id for h in after}
    # the vec0 row carries the new price (not only the post-filter's check)
    row = sample_db.execute(
        f'select price from "{index.vec0.table}" where product_id = ?',
        [top],  # type: ignore[union-attr]
    ).fetchone()
    assert row == (500.0,)
    # a product removed from the catalogue leaves the table
    write_products(sample_db, [p for p in changed if p.id != sold_out.id], source="smaller")
    await index.ensure()
    assert sold_out.id not in {h.id for h in index.nearest(q, 300, Filters(in_stock=False))}
    n = sample_db.execute(f'select count(*) from "{index.vec0.table}"').fetchone()[0]  # type: ignore[union-attr]
    assert n == len(products) - 1
    await index.aclose()


async def test_before_its_first_sync_vec0_answers_by_the_exact_scan(
    sample_db: sqlite_utils.Database,
) -> None:
    embedder = HashEmbedder()
    await VectorIndex(sample_db, embedder, backend="numpy", seeds=()).ensure()  # vectors only
    index = VectorIndex(sample_db, embedder, backend="vec0", seeds=())
    q = (await embedder.embed(["linen shirt"]))[0]
    f = Filters(categories=("shirts",))
    assert index.vec0 is not None and index.vec0.dims(sample_db) is None  # no table yet
    early = index.nearest(q, 5, f)
    assert index.vec0.stats["queries"] == 0 and len(early) == 5
    await index.ensure()
    assert index.vec0.dims(sample_db) == embedder.dims
    _same_ranking(index.nearest(q, 5, f), early)
    assert index.vec0.stats["queries"] == 1
    await index.aclose()


# -- selected by config ------------------------------------------------------------------


async def test_vector_backend_is_chosen_in_the_retrieval_settings(
    sample_db: sqlite_utils.Database,
) -> None:
    for backend in ("auto", "numpy", "sqlite-vec", "vec0"):
        settings = RetrievalSettings(searches=["vector"], vector_backend=backend)
        async with build_retriever(settings, sample_db, embedder=HashEmbedder()) as r:
            assert r.index is not None
            assert r.index.backend == ("sqlite-vec" if backend == "auto" else backend)
    with pytest.raises(ValueError, match="vector_backend"):
        RetrievalSettings(vector_backend="faiss")  # type: ignore[arg-type]


async def test_vec0_without_sqlite_vec_is_a_config_error(
    sample_db: sqlite_utils.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    import chainrun.retrieval.vector as vector

    monkeypatch.setattr(vector, "load_sqlite_vec", lambda db: False)
    settings = RetrievalSettings(searches=["vector"], vector_backend="vec0")
    with pytest.raises(ConfigError, match=r"retrieval.vector_backend: .*'vec0' needs sqlite-vec"):
        build_retriever(settings, sample_db, embedder=HashEmbedder())
    auto = build_retriever(
        RetrievalSettings(searches=["vector"]), sample_db, embedder=HashEmbedder()
    )
    assert auto.index is not None and auto.index.backend == "numpy"
    await auto.aclose()
