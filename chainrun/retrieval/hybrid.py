"""Hybrid search: several searches run in parallel, merged by Reciprocal Rank Fusion.

RRF (Cormack, Clarke & Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and
individual Rank Learning Methods", SIGIR 2009): a document's fused score is

    RRF(d) = Σ over rankings r that contain d of 1 / (k + rank_r(d))

with ranks starting at 1 and k = 60 (the paper's constant, which damps the weight of the
very top ranks). Only ranks matter, so a bm25 score and a cosine similarity can be fused
without calibrating one against the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from chainrun.retrieval.base import Search
from chainrun.retrieval.filters import Filters
from chainrun.retrieval.hits import Hit, Hits

RRF_K = 60


def rrf_fuse(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Fuse ranked id lists by RRF; returns (id, score) best first.

    Ties keep the order in which ids were first met, going through the rankings in
    order and each ranking from its top. A repeat within one ranking counts once (at its
    best rank).

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"RRF k must be >= 1, got {k}")
    scores: dict[str, float] = {}
    for ranking in rankings:
        seen: set[str] = set()
        for rank, doc in enumerate(ranking, start=1):
            if doc in seen:
                continue
            seen.add(doc)
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
    first_met = {doc: i for i, doc in enumerate(scores)}
    return sorted(scores.items(), key=lambda item: (-item[1], first_met[item[0]]))


class HybridSearch:
    """Run ``searches`` concurrently (``asyncio.gather``) and fuse their rankings by RRF.

    Each component is asked for ``candidates`` hits (at least ``k``). If some components
    fail, the others are fused and the failures are noted in :attr:`Hits.errors`; if
    all fail, the first error is raised.

    Args:
        searches: the components, e.g. keyword (any term) and vector.
        rrf_k: the RRF constant (60 in Cormack et al. 2009).
        candidates: hits per component fed to the fusion.
    """

    name = "hybrid"

    def __init__(self, searches: Sequence[Search], *, rrf_k: int = RRF_K, candidates: int = 20):
        if not searches:
            raise ValueError("a hybrid search needs at least one component")
        self.searches = list(searches)
        self.rrf_k = rrf_k
        self.candidates = candidates

    async def search(self, query: str, k: int, *, filters: Filters | None = None) -> list[Hit]:
        depth = max(k, self.candidates)
        results = await asyncio.gather(
            *(s.search(query, depth, filters=filters) for s in self.searches),
            return_exceptions=True,
        )
        rankings: list[list[str]] = []
        errors: list[str] = []
        first_error: BaseException | None = None
        for search, result in zip(self.searches, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # CancelledError, KeyboardInterrupt: not ours to swallow
                errors.append(f"{search.name}: {type(result).__name__}: {result}")
                first_error = first_error or result
            else:
                rankings.append([h.id for h in result])
        if not rankings and first_error is not None:
            raise first_error
        fused = rrf_fuse(rankings, self.rrf_k)[:k]
        return Hits([Hit(doc, score, self.name) for doc, score in fused], errors)
