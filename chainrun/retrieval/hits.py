"""What a search returns: ranked hits, and a list of them that notes partial failures."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hit:
    """One ranked result of one search.

    ``score`` is the search's own score, higher = better (its scale differs per search:
    negated bm25 for keyword, cosine similarity for vector, RRF sum for hybrid).
    """

    id: str
    score: float
    source: str


class Hits(list[Hit]):
    """A ranked list of hits that may note partial failures.

    ``errors`` names components that failed while others answered (a hybrid search whose
    vector half failed still returns its keyword half): the stage logs them.
    """

    def __init__(self, hits: list[Hit] | None = None, errors: list[str] | None = None) -> None:
        super().__init__(hits or [])
        self.errors: list[str] = list(errors or [])
