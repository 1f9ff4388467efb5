"""KNN on a sqlite-vec ``vec0`` virtual table, with the search filters kept exact.

The scan backends (:class:`~chainrun.retrieval.vector.VectorIndex` with ``numpy`` or
``sqlite-vec``) compute a distance for every product passing the filter; at 100,000
products that is 20-30 ms at the median and hundreds of ms at the p99 on a busy 2-core
machine (benchmarks/README.md, "Retrieval at scale"). ``vec0`` stores the vectors in
chunks and answers ``embedding MATCH ? AND k = ?`` with an exact brute-force KNN inside
SQLite (sqlite-vec 0.1.x has no approximate index; its quantised ``bit``/``int8``
columns, the approximate route, are not used here). What makes it fast is where the
filters go:

* ``category`` is the table's **partition key**: a query for one category reads only
  that category's chunks. A filter naming several categories runs one KNN per category
  and merges them (the k best of a union are among the k best of each part).
* ``price`` and ``stock`` are **metadata columns**, filtered inside the KNN (``price <=
  ?``, ``price >= ?``, ``stock > 0``): the k rows come back from the matching ones.
* A **size** filter ("size M in stock") has no vec0 column (stock per size is a table of
  its own): it is applied after the KNN, so the KNN is **oversampled**: ``k × factor``
  candidates. When fewer than k of them pass, the products passing the filter are
  counted (up to :data:`SCAN_BELOW`): if fewer pass than that, the exact scan over just
  those answers (a few thousand distances at most). Else one more KNN round fetches as
  many candidates as the share that passed says k needs (×1.5), if that is at most
  :data:`MAX_GROWN_K` (a vec0 KNN slows down with k); if it is more, or the second
  round is short too, the exact filtered scan answers.

Every candidate is checked against ``Filters.sql`` on ``products`` before it is returned
(so a vec0 row not yet synced after a catalogue load is never recommended against the
filter), and a result is accepted only while it is provably the k best: a candidate
counts when its distance is within the *frontier*, the smallest k-th distance among
the partitions that returned a full ``k`` (a partition that returned fewer has no
more rows). Hence a filtered query is never short of k while k products pass it.

The table (one per embedding model, :func:`table_name`) is built lazily from
``product_embeddings`` and kept in step with it: rows are rewritten in the same
transaction as the embeddings they copy (:meth:`Vec0Index.write_ids`), and
:meth:`Vec0Index.sync` re-checks every row's signature (text hash, category, price,
stock) after each catalogue refresh, so a price or stock change reaches the metadata.

Vectors are unit length (every :class:`~chainrun.retrieval.embeddings.Embedder`
normalises), so the table uses sqlite-vec's L2 distance d, which ranks as cosine does,
and reports cosine similarity ``1 - d²/2``; L2 was 25% faster than ``distance_metric=cosine``
here (sqlite-vec 0.1.9's PyPI build has no SIMD: 37 vs 47 ms for an unfiltered k = 8
over 100,000 384-dimension vectors, measured 2026-11-30).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import sqlite_utils

from chainrun.log.transactions import write_transaction
from chainrun.retrieval.filters import Filters
from chainrun.retrieval.hits import Hit

__all__ = [
    "CHUNK_SIZE",
    "MAX_GROWN_K",
    "SCAN_BELOW",
    "VEC0_MAX_K",
    "Vec0Index",
    "scan_nearest",
    "table_name",
]

#: sqlite-vec's largest ``k`` per KNN query (0.1.9: "k value in knn query too large,
#: provided 5000 and the limit is 4096")
VEC0_MAX_K = 4096
#: when fewer products than this pass a filter that the first KNN round could not fill,
#: the exact scan over them answers: 4,096 distances of 384 dimensions take about 4 ms
#: here (an unfiltered scan of 100,000 took about 100 ms, measured 2026-11-30)
SCAN_BELOW = 4096
#: vectors per vec0 chunk: each partition (category) allocates whole chunks, so the
#: default 1,024 would reserve 1.5 MB per category of 384-dimension vectors even for the
#: 285-product sample; 128 queried as fast at 100,000 products (measured 2026-11-30)
CHUNK_SIZE = 128
#: the most candidates per partition a second KNN round may fetch; beyond it the exact
#: filtered scan answers instead (a vec0 KNN costs more the larger k:
#: see benchmarks/README.md, "Retrieval at scale")
MAX_GROWN_K = 512
#: ids per ``IN (...)`` list (SQLite's default limit on parameters is far higher; this
#: keeps each statement small)
_BATCH = 500
#: a row's signature: when it differs from the vec0 row's, the row is rewritten
_SIG = "e.text_hash || '|' || p.category || '|' || p.price || '|' || p.stock"
_DIMS = re.compile(r"embedding\s+float\[(\d+)\]")


def table_name(model: str) -> str:
    """The vec0 table holding ``model``'s vectors: ``product_vec0_`` + 12 hex digits."""
    return "product_vec0_" + hashlib.sha1(model.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class _Candidate:
    id: str
    distance: float


class Vec0Index:
    """The vec0 table of one embedding model's vectors (see the module docstring).

    Args:
        model: the embedder's model id (rows of ``product_embeddings`` with this model).
        oversample: candidates per result in the first round when a size filter is
            applied after the KNN (``k × oversample``, at most :data:`VEC0_MAX_K`).

    Every method takes the connection to use, with sqlite-vec loaded: writes on the
    index's own connection, queries on a worker thread's (``CatalogReader``).
    ``stats`` counts ``queries``, KNN ``rounds``, ``exact_scans`` (few products pass)
    and ``exact_fallbacks`` (still short at the KNN limit); a Counter, approximate when
    several threads query at once.
    """

    def __init__(self, model: str, *, oversample: int = 4) -> None:
        if oversample < 1:
            raise ValueError(f"oversample must be >= 1, got {oversample}")
        self.model = model
        self.oversample = oversample
        self.table = table_name(model)
        self.stats: Counter[str] = Counter()

    # -- building and keeping in step -----------------------------------------------------

    def dims(self, db: sqlite_utils.Database) -> int | None:
        """The table's vector size, or None when the table does not exist."""
        row = db.execute(
            "select sql from sqlite_master where type = 'table' and name = ?", [self.table]
        ).fetchone()
        if row is None:
            return None
        m = _DIMS.search(row[0])
        return int(m.group(1)) if m else None

    def _create(self, db: sqlite_utils.Database, dims: int) -> None:
        db.execute(
            f"""create virtual table "{self.table}" using vec0(
                product_id text primary key,
                embedding float[{dims}],
                category text partition key,
                price float,
                stock integer,
                +sig text,
                chunk_size={CHUNK_SIZE}
            )"""
        )

    def write_ids(self, db: sqlite_utils.Database, ids: list[str]) -> None:
        """Rewrite the rows of ``ids`` from ``product_embeddings`` and ``products``.

        A product without a vector of this model (or no longer in the catalogue) loses
        its row. No-op until :meth:`sync` has created the table. Call inside the
        transaction that writes the embeddings, so both change together.
        """
        dims = self.dims(db)
        if dims is None or not ids:
            return
        for start in range(0, len(ids), _BATCH):
            batch = ids[start : start + _BATCH]
            db.conn.executemany(
                f'delete from "{self.table}" where product_id = ?', [(i,) for i in batch]
            )
            marks = ",".join("?" * len(batch))
            db.execute(
                f"""insert into "{self.table}"(product_id, embedding, category, price, stock, sig)
                select e.product_id, e.embedding, p.category, cast(p.price as real),
                       cast(p.stock as integer), {_SIG}
                from product_embeddings e join products p on p.id = e.product_id
                where e.model = ? and e.dims = ? and e.product_id in ({marks})""",
                [self.model, dims, *batch],
            )

    def sync(self, db: sqlite_utils.Database) -> int:
        """Make the table match ``product_embeddings`` and ``products``; rows rewritten.

        Creates the table on first use (its size from the stored vectors; 0 rows when
        there are none yet) and recreates it if the vectors changed size. Compares
        each row's signature (text hash, category, price, stock), so only changed,
        new and removed products are written. Runs in one write transaction: call
        it with a connection that may write (not a ``query_only`` reader).
        """
        with write_transaction(db):
            row = db.execute(
                "select dims from product_embeddings where model = ? limit 1", [self.model]
            ).fetchone()
            if row is None:
                return 0
            dims = int(row[0])
            have = self.dims(db)
            if have is not None and have != dims:
                db.execute(f'drop table "{self.table}"')
                have = None
            if have is None:
                self._create(db, dims)
            expected = dict(
                db.execute(
                    f"""select e.product_id, {_SIG}
                    from product_embeddings e join products p on p.id = e.product_id
                    where e.model = ? and e.dims = ?""",
                    [self.model, dims],
                ).fetchall()
            )
            stored = dict(db.execute(f'select product_id, sig from "{self.table}"').fetchall())
            changed = [pid for pid, sig in expected.items() if stored.get(pid) != sig]
            changed += [pid for pid in stored if pid not in expected]
            self.write_ids(db, changed)
        return len(changed)

    # -- querying -------------------------------------------------------------------------

    def knn(
        self, db: sqlite_utils.Database, vector: np.ndarray, k: int, filters: Filters | None
    ) -> list[Hit]:
        """The ``k`` products nearest ``vector`` that pass ``filters``, best first.

        ``Hit.score`` is the cosine similarity. Exact: the same products as a full scan
        (ties at equal distance may order differently). Never fewer than
        min(k, products passing ``filters``) while every product has a vec0 row.
        """
        f = filters or Filters()
        self.stats["queries"] += 1
        if k < 1:
            return []
        q = np.asarray(vector, dtype="<f4").tobytes()
        fetch = min(k * self.oversample if f.sizes else k, VEC0_MAX_K)
        for second in (False, True):
            self.stats["rounds"] += 1
            candidates, frontier = self._candidates(db, q, fetch, f)
            passing = self._passing(db, [c.id for c in candidates], f)
            sure = [c for c in candidates if c.id in passing and c.distance <= frontier]
            if len(sure) >= k or math.isinf(frontier):
                return [Hit(c.id, 1.0 - c.distance * c.distance / 2.0, "vector") for c in sure[:k]]
            if second:
                break
            if _count_passing(db, f, SCAN_BELOW) < SCAN_BELOW:
                self.stats["exact_scans"] += 1  # few pass: scan just those
                return scan_nearest(db, self.model, q, k, f)
            # many pass, few of them near: fetch what the share that passed says k needs
            n_pass = sum(c.id in passing for c in candidates)
            need = math.inf if n_pass == 0 else math.ceil(1.5 * k * len(candidates) / n_pass)
            if need > min(MAX_GROWN_K, VEC0_MAX_K):
                break
            fetch = int(need)
        self.stats["exact_fallbacks"] += 1
        return scan_nearest(db, self.model, q, k, f)

    def _candidates(
        self, db: sqlite_utils.Database, q: bytes, fetch: int, f: Filters
    ) -> tuple[list[_Candidate], float]:
        """Up to ``fetch`` nearest rows per partition, merged by (distance, id), and the
        frontier: the smallest last distance among partitions that returned ``fetch``
        rows (inf when every partition returned all it has)."""
        meta, params = "", []
        if f.max_price is not None:
            meta += " and price <= ?"
            params.append(float(f.max_price))
        if f.min_price is not None:
            meta += " and price >= ?"
            params.append(float(f.min_price))
        if f.in_stock and not f.sizes:  # with sizes, stock is checked per size (Filters.sql)
            meta += " and stock > 0"
        base = f'select product_id, distance from "{self.table}" where embedding match ? and k = ?'
        out: list[_Candidate] = []
        frontier = math.inf
        for category in f.categories or (None,):
            if category is None:
                rows = db.execute(base + meta, [q, fetch, *params]).fetchall()
            else:
                sql = base + " and category = ?" + meta
                rows = db.execute(sql, [q, fetch, category, *params]).fetchall()
            out.extend(_Candidate(r[0], float(r[1])) for r in rows)
            if len(rows) >= fetch:
                frontier = min(frontier, float(rows[-1][1]))
        out.sort(key=lambda c: (c.distance, c.id))
        return out, frontier

    @staticmethod
    def _passing(db: sqlite_utils.Database, ids: list[str], f: Filters) -> set[str]:
        where, params = f.sql("p")
        passing: set[str] = set()
        for start in range(0, len(ids), _BATCH):
            batch = ids[start : start + _BATCH]
            marks = ",".join("?" * len(batch))
            rows = db.execute(
                f"select p.id from products p where p.id in ({marks}) and {where}",
                [*batch, *params],
            )
            passing.update(r[0] for r in rows)
        return passing


def _count_passing(db: sqlite_utils.Database, f: Filters, cap: int) -> int:
    """Products passing ``f``, counted up to ``cap``."""
    where, params = f.sql("p")
    sql = f"select count(*) from (select 1 from products p where {where} limit ?)"
    return int(db.execute(sql, [*params, cap]).fetchone()[0])


def scan_nearest(db: sqlite_utils.Database, model: str, q: bytes, k: int, f: Filters) -> list[Hit]:
    """sqlite-vec's exact scan: the ``k`` vectors of ``model`` nearest ``q`` (float32
    bytes) among the products passing ``f`` (filters in the same SQL ``where``), best
    first by cosine distance, ties by product id; ``Hit.score`` is 1 - distance."""
    where, params = f.sql("p")
    rows = db.execute(
        f"""
        select e.product_id, vec_distance_cosine(e.embedding, ?) as d
        from product_embeddings e join products p on p.id = e.product_id
        where e.model = ? and {where}
        order by d, e.product_id
        limit ?
        """,
        [q, model, *params, k],
    ).fetchall()
    return [Hit(r[0], 1.0 - float(r[1]), "vector") for r in rows]
