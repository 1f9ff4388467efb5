"""Keyword search: SQLite FTS5 ranked by bm25 over the ``products_fts`` index.

User text never reaches FTS5 as syntax: :func:`fts_query` keeps word tokens only, drops
stop words and quotes each term, so "under 100?" or ``"AND (`` cannot raise an FTS5
syntax error. Two modes: ``all`` (every term must match: precise, may find few) and
``any`` (bm25-ranked OR: broad, the keyword half of hybrid search).
"""

from __future__ import annotations

import re
from typing import Literal

import sqlite_utils

from chainrun.retrieval.filters import Filters
from chainrun.retrieval.hits import Hit
from chainrun.retrieval.reader import CatalogReader, reader_for

#: Words that carry no product meaning in a shopper's message.
STOP_WORDS = frozenset(
    """a about all also am an and any anything are as at be best buy can could do does for from
    get give go going good got great have help hello hi how i idea ideas im in is it its just
    like looking looks may me might my need needs nice of on one options or please really
    recommend recommendation s search searching sell shall shop should show some something
    suggest that the there these thing things this to very want wanted wear wearing what which
    will with would you your yours
    those them they ones either both else instead available""".split()
)

#: bm25() column weights, in the order of ``migrations.FTS_COLUMNS``
#: (title, description, category, colours, tags): a title or tag match counts most.
BM25_WEIGHTS = (10.0, 1.0, 4.0, 2.0, 5.0)

_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)

Mode = Literal["all", "any"]


def query_terms(text: str) -> list[str]:
    """Lower-case word tokens of ``text`` minus stop words, in order, without repeats."""
    terms = [t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS]
    return list(dict.fromkeys(t for t in terms if len(t) > 1 or t.isdigit()))


def fts_query(text: str, mode: Mode = "all") -> str | None:
    """An FTS5 MATCH expression for ``text`` (None when no term is left).

    Each term is double-quoted (a string in FTS5 syntax, so no operator or column
    filter can sneak in; the porter tokenizer still stems it) and joined with AND
    (``mode="all"``) or OR (``"any"``).
    """
    terms = query_terms(text)
    if not terms:
        return None
    joiner = " AND " if mode == "all" else " OR "
    return joiner.join('"' + t.replace('"', '""') + '"' for t in terms)


class KeywordSearch:
    """FTS5 bm25 search over title, description, category, colours and tags.

    Args:
        db: the database holding the catalogue tables.
        mode: ``"all"`` terms must match, or ``"any"``.
        name: the name used in logs and config (default ``keyword`` / ``keyword_any``).
        reader: runs the query off the event loop (default: ``db``'s shared reader).
    """

    def __init__(
        self,
        db: sqlite_utils.Database,
        mode: Mode = "all",
        name: str | None = None,
        *,
        reader: CatalogReader | None = None,
    ):
        self.db = db
        self.mode = mode
        self.name = name or ("keyword" if mode == "all" else "keyword_any")
        self.reader = reader or reader_for(db)

    async def search(self, query: str, k: int, *, filters: Filters | None = None) -> list[Hit]:
        match = fts_query(query, self.mode)
        if match is None:
            return []
        where, params = (filters or Filters()).sql("p")
        weights = ", ".join(str(w) for w in BM25_WEIGHTS)
        # CROSS JOIN keeps the FTS5 scan the outer loop: with a plain JOIN and a category
        # filter SQLite ran the MATCH once per product of the category (10,000 products:
        # 670 ms a query instead of 6; benchmarks/retrieval_scale.py)
        sql = f"""
            select p.id, bm25(products_fts, {weights}) as rank
            from products_fts cross join products p on p.rowid = products_fts.rowid
            where products_fts match ? and {where}
            order by rank, p.id
            limit ?
            """
        args = [match, *params, k]
        rows = await self.reader.run(lambda db: db.execute(sql, args).fetchall())
        # bm25() is lower-is-better; negate so that every search's score is higher-is-better
        return [Hit(r[0], -float(r[1]), self.name) for r in rows]
