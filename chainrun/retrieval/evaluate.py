"""Retrieval quality: recall@k of a search or of the whole stage on labelled queries.

A query file (``evals/retrieval_queries.jsonl``) holds one JSON object per line::

    {"query": "rain jacket under 100", "expected": ["JKT-005", ...], "label": null}

``expected`` lists the in-stock products a person would expect for the query.
recall@k = |top k ∩ expected| / min(k, |expected|): capped at k so that a query with
more relevant products than slots can still score 1 (the "R-capped" recall of
TREC-style evaluations).
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from chainrun.errors import InputFileError
from chainrun.input_files import read_jsonl
from chainrun.retrieval.base import Search
from chainrun.retrieval.filters import parse_query


@dataclass(frozen=True)
class LabelledQuery:
    """A shopper's message and the product ids a person would expect for it."""

    query: str
    expected: tuple[str, ...]
    label: str | None = None


def load_queries(path: str | Path) -> list[LabelledQuery]:
    """Read a labelled query file (JSONL).

    Raises:
        InputFileError: unreadable file, bad JSON, or a line without ``query`` (a
            non-empty string) and ``expected`` (a non-empty list of ids).
    """
    p = Path(path)
    out = []
    for lineno, rec in read_jsonl(p, "query file"):
        query, expected = rec.get("query"), rec.get("expected")
        if not isinstance(query, str) or not query.strip():
            raise InputFileError(str(p), lineno, "expected a non-empty string 'query'")
        if (
            not isinstance(expected, list)
            or not expected
            or not all(isinstance(i, str) for i in expected)
        ):
            raise InputFileError(str(p), lineno, "expected 'expected': a non-empty list of ids")
        out.append(LabelledQuery(query, tuple(expected), rec.get("label")))
    if not out:
        raise InputFileError(str(p), None, "no queries in file")
    return out


def recall_at_k(retrieved: Sequence[str], expected: Sequence[str], k: int) -> float:
    """|top-k of ``retrieved`` ∩ ``expected``| / min(k, |expected|), in [0, 1]."""
    if not expected:
        raise ValueError("recall needs at least one expected id")
    hits = len(set(retrieved[:k]) & set(expected))
    return hits / min(k, len(set(expected)))


@dataclass(frozen=True)
class RecallReport:
    """Mean recall@k over queries, with the per-query values (in query order)."""

    name: str
    k: int
    mean: float
    per_query: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.per_query)


async def evaluate(
    name: str,
    ranked_ids: Callable[[LabelledQuery], Awaitable[Sequence[str]]],
    queries: Sequence[LabelledQuery],
    k: int,
) -> RecallReport:
    """recall@k of ``ranked_ids`` (query → ranked product ids) over ``queries``."""
    values = [recall_at_k(list(await ranked_ids(q)), q.expected, k) for q in queries]
    return RecallReport(name, k, statistics.fmean(values), tuple(values))


async def evaluate_search(
    search: Search, queries: Sequence[LabelledQuery], k: int, *, in_stock: bool = True
) -> RecallReport:
    """recall@k of one search, given the text and filters the stage would give it."""

    async def ranked(q: LabelledQuery) -> list[str]:
        parsed = parse_query(q.query, q.label, in_stock=in_stock)
        return [h.id for h in await search.search(parsed.text, k, filters=parsed.filters)]

    return await evaluate(search.name, ranked, queries, k)
