"""Vector search: nearest product embeddings by cosine similarity.

Vectors live in ``product_embeddings`` (float32 BLOBs, one row per product and embedding
model), computed once per product text and reused across runs. Three backends find the
nearest ones, all exact (:data:`VECTOR_BACKENDS`):

* ``numpy``: a matrix product over the vectors held in memory (rows passing the filter
  selected first);
* ``sqlite-vec``: sqlite-vec's ``vec_distance_cosine`` over every vector passing the
  filter, in SQL (it needs ``pysqlite3-binary``: CPython's own sqlite3 here cannot load
  extensions, see Python's sqlite3 docs, ``enable_load_extension``);
* ``vec0``: KNN on a sqlite-vec ``vec0`` table built from the same vectors, with the
  category as partition key, price and stock as metadata columns and size filters
  oversampled (:mod:`chainrun.retrieval.vec0`): the one for large catalogues.

``auto`` (the default) is ``sqlite-vec`` when the extension loads, else ``numpy``. Every
backend applies the filter before the limit: while ``k`` products pass it, ``k`` come
back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils

from chainrun.errors import ProviderUnavailable
from chainrun.log.transactions import write_transaction
from chainrun.retrieval.catalog import (
    SAMPLE_CATALOG,
    all_products,
    catalog_version,
    ensure_catalog_tables,
    product_text,
)
from chainrun.retrieval.embeddings import Embedder
from chainrun.retrieval.filters import Filters
from chainrun.retrieval.hits import Hit
from chainrun.retrieval.keyword import query_terms
from chainrun.retrieval.reader import database_file, load_sqlite_vec, open_connection, reader_for
from chainrun.retrieval.vec0 import Vec0Index, scan_nearest

logger = logging.getLogger(__name__)

#: all-MiniLM-L6-v2 vectors of the sample catalogue, made by
#: ``python benchmarks/make_catalog.py --embeddings``: the default chain's first turn
#: then finds its vectors ready instead of embedding 285 products (about 10 s on 2 cores).
SAMPLE_VECTORS = SAMPLE_CATALOG.with_name("catalog.minilm.npz")

#: ``VectorIndex(backend=...)`` and ``retrieval.vector_backend`` values
VECTOR_BACKENDS = ("auto", "numpy", "sqlite-vec", "vec0")




def _log_failure(task: asyncio.Task[int]) -> None:
    # retrieve the exception so that asyncio does not warn; the next query retries
    if not task.cancelled() and task.exception() is not None:
        logger.warning("embedding the catalogue failed: %s", task.exception())


def text_hash(model: str, text: str) -> str:
    """Key of one stored vector: the embedding model and the exact text embedded."""
    return hashlib.sha1(f"{model}\n{text}".encode()).hexdigest()


def _row(pid: str, model: str, h: str, vec: np.ndarray) -> dict[str, Any]:
    return {
        "product_id": pid,
        "model": model,
        "text_hash": h,
        "dims": int(vec.shape[0]),
        "embedding": vec.astype("<f4").tobytes(),
    }


class VectorIndex:
    """The catalogue's vectors for one embedder, kept in step with the catalogue.

    Args:
        db: the database holding the catalogue tables.
        embedder: makes the vectors.
        batch_size: products per :meth:`Embedder.embed` call while indexing.
        backend: one of :data:`VECTOR_BACKENDS` (see the module docstring); ``auto``:
            ``sqlite-vec`` when the extension loads into ``db``, else ``numpy``.
        oversample: ``vec0`` only: candidates per result in the first KNN round when a
            size filter is applied after it (see :class:`~chainrun.retrieval.vec0.Vec0Index`).
        seeds: ``.npz`` files of precomputed vectors (keys ``model``, ``text_hashes``,
            ``vectors``) used instead of embedding when model and text match; default:
            the MiniLM vectors of the sample catalogue (:data:`SAMPLE_VECTORS`).

    Raises:
        ValueError: an unknown backend, or ``sqlite-vec``/``vec0`` when sqlite-vec
            cannot be loaded into ``db``'s connection.
    """

    def __init__(
        self,
        db: sqlite_utils.Database,
        embedder: Embedder,
        *,
        batch_size: int = 64,
        backend: str = "auto",
        oversample: int = 4,
        seeds: Sequence[Path] = (SAMPLE_VECTORS,),
    ) -> None:
        if backend not in VECTOR_BACKENDS:
            raise ValueError(
                f"unknown vector backend {backend!r}; expected one of {VECTOR_BACKENDS}"
            )
        self.db = db
        self.seeds = list(seeds)
        self.embedder = embedder
        self.batch_size = batch_size
        has_vec = backend != "numpy" and load_sqlite_vec(db)
        if backend in ("sqlite-vec", "vec0") and not has_vec:
            raise ValueError(
                f"vector backend {backend!r} needs sqlite-vec, which cannot be loaded into "
                "this database connection (packages sqlite-vec and pysqlite3-binary)"
            )
        #: the backend in use: ``numpy``, ``sqlite-vec`` or ``vec0``
        self.backend = ("sqlite-vec" if has_vec else "numpy") if backend == "auto" else backend
        self.vec0 = (
            Vec0Index(embedder.model, oversample=oversample) if self.backend == "vec0" else None
        )
        self._vec0_synced = False  # this process has brought the vec0 table up to date
        self._version: int | None = None
        self._build: asyncio.Task[int] | None = None
        self._stored = False  # vectors of this model exist (the SQL backends' readiness)
        self._ids: list[str] = []
        self._matrix = np.zeros((0, 0), np.float32)
        self._pos: dict[str, int] = {}
        self.reader = reader_for(db)

    @property
    def use_sqlite_vec(self) -> bool:
        """Whether searches run in SQL (``sqlite-vec`` or ``vec0``) rather than NumPy."""
        return self.backend != "numpy"

    def _current(self) -> bool:
        return self._version is not None and self._version == catalog_version(self.db)

    async def ensure(self) -> int:
        """Embed the products that are new or changed since their vector was made; wait.

        Cheap when the catalogue has not changed since the last call. A caller that is
        cancelled does not cancel the indexing (it is shared by every caller). Returns
        the number of products embedded by the refresh awaited (0 if none was needed).

        Raises:
            ProviderError: the embedder failed (vectors made so far are kept).
        """
        if self._current():
            return 0
        return await asyncio.shield(self._start())

    def ready_for_query(self) -> bool:
        """Whether vectors can answer now; starts a background refresh if one is due.

        True when the vectors are current, or when vectors of this model are stored
        (from an earlier run or load) while a refresh runs; False only while a
        catalogue is embedded for the first time.
        """
        if self._current():
            return True
        self._start()
        if not (self._ids or self._stored):
            self._load_matrix(self.embedder.model)
        return bool(self._ids or self._stored)

    def _start(self) -> asyncio.Task[int]:
        if self._build is None or self._build.done():
            self._build = asyncio.get_running_loop().create_task(
                self._refresh_current(), name="chainrun-vector-index"
            )
            self._build.add_done_callback(_log_failure)
        return self._build

    async def _refresh_current(self) -> int:
        version = catalog_version(self.db)
        n = await self._refresh()
        self._version = version
        return n

    async def aclose(self) -> None:
        """Cancel a refresh still running and wait for it to end."""
        task = self._build
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _refresh(self) -> int:
        ensure_catalog_tables(self.db)
        model = self.embedder.model
        products = all_products(self.db)
        texts = {p["id"]: product_text(p) for p in products}
        hashes = {pid: text_hash(model, t) for pid, t in texts.items()}
        stored = dict(
            self.db.execute(
                "select product_id, text_hash from product_embeddings where model = ?", [model]
            ).fetchall()
        )
        todo = [pid for pid in texts if stored.get(pid) != hashes[pid]]
        seeded = self._from_seeds(model, todo, hashes)
        self._write(seeded, gone=[pid for pid in stored if pid not in texts])
        done = {r["product_id"] for r in seeded}
        todo = [pid for pid in todo if pid not in done]
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start : start + self.batch_size]
            vectors = await self.embedder.embed([texts[pid] for pid in batch])
            # written per batch: an interrupted first indexing resumes where it stopped
            self._write(
                [_row(pid, model, hashes[pid], v) for pid, v in zip(batch, vectors, strict=True)]
            )
        if todo or seeded:
            logger.info("embedded %d products with %s (%d precomputed)", len(todo), model,
                        len(seeded))  # fmt: skip
        if self.vec0 is not None:
            await self._sync_vec0()
        self._load_matrix(model)
        return len(todo)

    async def _sync_vec0(self) -> None:
        """Bring the vec0 table in step (prices and stock change without re-embedding).

        On a file, on a thread with its own connection: the first build writes every
        vector again (about 2 s for 100,000 on 2 cores), which must not stall the loop.
        """
        vec0 = self.vec0
        assert vec0 is not None
        path = database_file(self.db)
        if path is None:
            n = vec0.sync(self.db)
        else:

            def sync() -> int:
                conn = open_connection(path)
                try:
                    return vec0.sync(conn)
                finally:
                    conn.close()

            job = asyncio.ensure_future(asyncio.to_thread(sync))
            try:
                n = await asyncio.shield(job)
            except asyncio.CancelledError:
                await asyncio.wait([job])  # the thread cannot be stopped: let it finish
                raise
        if n:
            logger.info("vec0 index %s: %d rows written", vec0.table, n)
        self._vec0_synced = True

    def _write(self, rows: list[dict[str, Any]], gone: Sequence[str] = ()) -> None:
        # BEGIN IMMEDIATE: a deferred transaction that reads (sqlite-utils reads the table's
        # schema) and then writes fails at once with "database is locked" when another
        # process wrote meanwhile; taking the write lock first waits (busy timeout)
        with write_transaction(self.db):
            if rows:
                self.db.table("product_embeddings").upsert_all(rows, pk=("product_id", "model"))
            for pid in gone:
                self.db.execute(
                    "delete from product_embeddings where product_id = ? and model = ?",
                    [pid, self.embedder.model],
                )
            if self.vec0 is not None:  # the vec0 rows change in the same transaction
                self.vec0.write_ids(self.db, [r["product_id"] for r in rows] + list(gone))

    def _from_seeds(
        self, model: str, todo: list[str], hashes: dict[str, str]
    ) -> list[dict[str, Any]]:
        """Rows for the ``todo`` products whose vector a seed file holds for the same text."""
        rows: list[dict[str, Any]] = []
        wanted = {hashes[pid]: pid for pid in todo}
        for path in self.seeds:
            if not wanted or not path.exists():
                continue
            with np.load(path) as seed:
                if str(seed["model"]) != model:
                    continue
                for h, vec in zip(seed["text_hashes"].tolist(), seed["vectors"], strict=True):
                    pid = wanted.pop(h, None)
                    if pid is not None:
                        rows.append(_row(pid, model, h, np.asarray(vec, dtype=np.float32)))
        return rows

    def _load_matrix(self, model: str) -> None:
        if self.backend != "numpy":  # the SQL backends read the vectors from the database
            self._stored = (
                self.db.execute(
                    "select 1 from product_embeddings where model = ? limit 1", [model]
                ).fetchone()
                is not None
            )
            return
        rows = self.db.execute(
            "select product_id, embedding from product_embeddings where model = ? "
            "order by product_id",
            [model],
        ).fetchall()
        matrix = (
            np.stack([np.frombuffer(r[1], dtype="<f4") for r in rows]).astype(np.float32)
            if rows
            else np.zeros((0, 0), np.float32)
        )
        ids = [r[0] for r in rows]
        # assigned together: a search on a worker thread reads one consistent snapshot
        self._ids, self._matrix, self._pos = ids, matrix, {pid: i for i, pid in enumerate(ids)}

    def nearest(
        self,
        vector: np.ndarray,
        k: int,
        filters: Filters | None = None,
        *,
        db: sqlite_utils.Database | None = None,
    ) -> list[Hit]:
        """The ``k`` products nearest ``vector`` (cosine) that pass ``filters``, best first.

        ``Hit.score`` is the cosine similarity (1 = same direction). The filter is applied
        before the limit: while ``k`` or more products pass it, ``k`` come back. ``db``:
        the connection to read with (default the index's own; :class:`VectorSearch`
        passes a worker thread's, see :mod:`chainrun.retrieval.reader`). Call
        :meth:`ensure` first.
        """
        conn = self.db if db is None else db
        f = filters or Filters()
        q = np.asarray(vector, dtype="<f4")
        if self.vec0 is not None and self._vec0_synced:
            return self.vec0.knn(conn, q, k, f)
        if self.use_sqlite_vec:  # also vec0 until this process has synced its table
            return scan_nearest(conn, self.embedder.model, q.tobytes(), k, f)
        where, params = f.sql("p")
        ids, matrix, pos = self._ids, self._matrix, self._pos  # one refresh's snapshot
        if not ids or k < 1:
            return []
        if where == "1":
            rows_idx = None
            sims = matrix @ q
        else:
            allowed = conn.execute(f"select p.id from products p where {where}", params)
            rows_idx = np.fromiter(
                (i for (pid,) in allowed if (i := pos.get(pid)) is not None), dtype=np.int64
            )
            rows_idx.sort()
            if rows_idx.size == 0:
                return []
            sims = matrix[rows_idx] @ q
        top = min(k, sims.shape[0])
        # the k best by partial selection (O(n)), then ordered; ties broken by id (ids are
        # sorted, so by row), as the SQL path's "order by d, product_id" does
        best = np.argpartition(-sims, top - 1)[:top] if top < sims.shape[0] else np.arange(top)
        cut = sims[best].min()
        best = np.flatnonzero(sims >= cut)  # every row tied with the k-th, in row order
        order = best[np.argsort(-sims[best], kind="stable")][:top]
        rows_of = order if rows_idx is None else rows_idx[order]
        return [
            Hit(ids[int(r)], float(sims[int(i)]), "vector")
            for r, i in zip(rows_of, order, strict=True)
        ]


class VectorSearch:
    """Embed the query and return the nearest products (see :class:`VectorIndex`).

    Never embeds the catalogue on a shopper's turn: until the first vectors exist it
    raises :class:`ProviderUnavailable` (a hybrid search then answers from its keyword
    half) while the index is built in the background. ``RetrievalStage.warm()`` at start-up
    builds it ahead of the first turn.
    """

    name = "vector"

    def __init__(self, index: VectorIndex) -> None:
        self.index = index

    async def search(self, query: str, k: int, *, filters: Filters | None = None) -> list[Hit]:
        if not query_terms(query):
            return []  # no content word ("anything in"): nearest neighbours would be noise
        if not self.index.ready_for_query():
            raise ProviderUnavailable(
                "the vector index is still being built (the catalogue is embedded once, "
                "then cached in the database); its first query comes a little later"
            )
        vector = (await self.index.embedder.embed([query]))[0]
        # the scan (SQL or NumPy) runs on a worker thread with its own connection
        return await self.index.reader.run(lambda db: self.index.nearest(vector, k, filters, db=db))
