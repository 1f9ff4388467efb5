"""The search protocol and the result types of retrieval.

A search is anything with a ``name`` and ``async search(query, k, *, filters=None)``
returning at most ``k`` :class:`Hit` s, best first. Keyword (FTS5 bm25), vector, filter
and hybrid (RRF) searches all implement it, and so do the fakes in the tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from chainrun.retrieval.filters import Filters
from chainrun.retrieval.hits import Hit


class Retriever(Protocol):
    """What the retrieve step needs: :class:`~chainrun.retrieval.stage.RetrievalStage`, or a
    test double."""

    async def retrieve(self, query: str, *, label: str | None = None) -> Any: ...


class Search(Protocol):
    """A ranked search over the catalogue."""

    @property
    def name(self) -> str: ...

    async def search(self, query: str, k: int, *, filters: Filters | None = None) -> list[Hit]:
        """At most ``k`` hits for ``query``, best first, each passing ``filters``.

        Raises:
            ChainrunError: the search could not answer (e.g. the embedder is unavailable).
        """
        ...


@dataclass
class SearchLog:
    """What one search of a retrieve stage did. Times in ms.

    ``n`` counts its hits, ``new`` those not already found by an earlier search;
    ``hedged`` is None when no fallback was raced, else why and how the race ended
    (``"primary_won"``, ``"fallback_won"``, ``"fallback_after_error"``).
    """

    name: str
    ms: float
    n: int
    new: int = 0
    error: str | None = None
    hedged: str | None = None
    #: the search (primary or its fallback) whose hits were used
    answered_by: str | None = None
    #: hit ids in rank order
    ids: list[str] = field(default_factory=list)
    #: hits dropped as not fitting the query, id → why ("negates waterproof", "lacks
    #: linen": :func:`chainrun.retrieval.attributes.why_excluded`); in ``ids``, not in ``n``
    excluded: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ms"] = round(self.ms, 3)
        if not self.excluded:
            del d["excluded"]
        return d


@dataclass
class RetrievalResult:
    """The outcome of one retrieve stage.

    Attributes:
        items: merged products in first-seen order (at most ``k``); each a product dict
            (id, title, description, category, colours, sizes, price in EUR, stock, tags)
            plus ``source``, the search that found it first.
        searches: one :class:`SearchLog` per search run, in the order run.
        stopped_after: the search after which the stage stopped early (it had
            ``min_results``), or None when every configured search ran.
        filters: the structured filters parsed from the message and label.
        query: the text the searches were given (the message without filter phrases).
        ms: the whole stage, in ms.
        price_order: ``price_asc`` / ``price_desc`` when the query asked for the
            cheapest or dearest first (the items are then in that order), else None.
        within: the products searched among (an earlier turn's, in the order shown),
            or None when the catalogue was searched.
        colours: the colour words the products were narrowed by (``within`` only).
    """

    items: list[dict[str, Any]]
    searches: list[SearchLog]
    stopped_after: str | None
    filters: Filters
    query: str = ""
    ms: float = 0.0
    price_order: str | None = None
    within: list[str] | None = None
    colours: tuple[str, ...] = ()

    @property
    def ids(self) -> list[str]:
        return [item["id"] for item in self.items]

    def as_json(self) -> dict[str, Any]:
        """The ``chainrun retrieve --json`` document (also stored in the step's ``detail``).

        Keys: ``query``, ``price_order``, ``filters``, ``results`` (merged items, each
        with ``id``), ``searches`` (each with ``name``, ``ms``, ``n``, ``new``, ``error``,
        ``hedged``, ``ids``), ``stopped_after`` and ``ms``; a search among an earlier
        turn's products adds ``within`` (their ids) and ``colours``.
        """
        doc: dict[str, Any] = {
            "query": self.query,
            "price_order": self.price_order,
            "filters": self.filters.as_json(),
            "results": self.items,
            "searches": [s.as_json() for s in self.searches],
            "stopped_after": self.stopped_after,
            "ms": round(self.ms, 3),
        }
        if self.within is not None:
            doc["within"] = list(self.within)
            doc["colours"] = list(self.colours)
        return doc

    def prompt_text(self) -> str:
        """The items as the compose step's prompt gets them (see :func:`format_for_prompt`)."""
        return format_for_prompt(self.items)


def _price(item: dict[str, Any]) -> str:
    """The item's price as its shop writes it: in its ``currency`` (default EUR) and the
    catalogue's ``locale`` (default :data:`chainrun.money.DEFAULT_LOCALE`)."""
    from chainrun.money import DEFAULT_LOCALE, format_money

    return format_money(item["price"], item.get("currency") or "EUR",
                        item.get("locale") or DEFAULT_LOCALE)  # fmt: skip


def format_for_prompt(items: list[dict[str, Any]]) -> str:
    """A compact list for a prompt: one line per product, "" when there is none; the
    price in the item's currency and its catalogue's locale (:func:`chainrun.money.
    format_money`: ``€49.95`` by default, ``CHF 1'299.00`` for a ``de_CH`` catalogue).

    ``- [JKT-005] Women's City Drizzle Packable Rain Jacket | jackets | €49.95 |
    yellow | in stock: S, M, L``
    """
    lines = []
    for item in items:
        parts = [
            f"- [{item['id']}] {item['title']}",
            str(item.get("category", "")),
            _price(item),
        ]
        if item.get("colours"):
            parts.append("/".join(item["colours"]))
        sizes = item.get("sizes") or {}
        in_stock = [s for s, n in sizes.items() if n > 0]
        if sizes:
            parts.append("in stock: " + ", ".join(in_stock) if in_stock else "sold out")
        lines.append(" | ".join(p for p in parts if p))
    return "\n".join(lines)
