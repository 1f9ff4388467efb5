"""The retrieve stage: searches in priority order, merged, with early exit.

The stage runs the configured searches one after another (cheapest and most precise
first, by config), merges their hits keeping the first-seen order and dropping repeats,
and **stops as soon as it holds ``min_results`` products**: a message that a keyword
search answers well never pays for embedding the query. Every search is logged (name,
ms, hits, new hits, error) with the point where the stage stopped (``stopped_after``).

A failing search fails open: its error is logged and the next search runs. A search
with a configured fallback is hedged rather than timed out (:func:`hedged_search`): it
gets a head start, then the fallback is enlisted once, and the first answer wins, so a
slow but valid primary can still win.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlite_utils

from chainrun.errors import ConfigError
from chainrun.hedging import ErrorInfo, HedgePolicy, Hedger
from chainrun.retrieval.attributes import query_attributes, why_excluded
from chainrun.retrieval.base import RetrievalResult, Search, SearchLog
from chainrun.retrieval.catalog import catalog_version, ensure_catalog_tables, get_products
from chainrun.retrieval.categories import CategoryVocabulary
from chainrun.retrieval.embeddings import Embedder, build_embedder
from chainrun.retrieval.filters import Filters, FilterSearch, parse_query
from chainrun.retrieval.followup import colours_named, price_order
from chainrun.retrieval.hits import Hit
from chainrun.retrieval.hybrid import RRF_K, HybridSearch
from chainrun.retrieval.keyword import KeywordSearch
from chainrun.retrieval.reader import reader_for
from chainrun.retrieval.settings import EMBEDDING_SEARCHES, SEARCH_NAMES, RetrievalSettings
from chainrun.retrieval.vector import VectorIndex, VectorSearch

#: status the fallback hedger gives every search error: listed as non-fatal, so a
#: primary that fails starts its fallback at once (a different search, not a copy of
#: the failed one, so the rule that errors are not hedged, gRPC's gRFC A6, does not apply)
_SEARCH_ERROR = "search_error"


@dataclass(frozen=True)
class HedgedAnswer:
    """What :func:`hedged_search` returns.

    ``hedged``: None (the primary answered before the fallback was due),
    ``"primary_won"`` (the fallback was enlisted but the primary answered first),
    ``"fallback_won"`` (the primary was silent past the head start and the fallback
    answered first), ``"fallback_after_error"`` (the primary failed) or
    ``"primary_circuit_open"`` (the primary failed repeatedly and is skipped for a while).
    """

    hits: list[Hit]
    answered_by: str
    hedged: str | None


def fallback_hedger(
    primary: str,
    fallback: str,
    *,
    delay_ms: float,
    max_extra_load: float = 1.0,
    deadline_s: float | None = None,
) -> Hedger[list[Hit]]:
    """A :class:`~chainrun.hedging.Hedger` racing ``primary`` against ``fallback``.

    Two attempts at most: the primary at 0, the fallback at ``delay_ms`` (or at once if
    the primary fails). Keep one per call site: it holds the latency window, the load
    budget and the circuit breakers of that search.
    """
    policy = HedgePolicy(
        delay_ms=delay_ms,
        max_attempts=2,
        deadline_s=deadline_s,
        non_fatal=frozenset({_SEARCH_ERROR}),
        max_extra_load=max_extra_load,
    )
    return Hedger(policy, [primary, fallback])


def _search_error(exc: BaseException) -> ErrorInfo:
    return ErrorInfo(_SEARCH_ERROR)


async def hedged_search(
    primary: Search,
    fallback: Search,
    query: str,
    k: int,
    *,
    filters: Filters | None,
    hedger: Hedger[list[Hit]],
) -> HedgedAnswer:
    """Race ``primary`` against ``fallback`` through the hedging engine.

    The primary gets a head start of the hedger's delay; if it has not answered by then
    the fallback starts (once), and the first to answer wins; the loser is cancelled.
    A primary error starts the fallback at once.

    Raises:
        Exception: the error of the last search that failed when neither answered.
    """
    by_target = {primary.name: primary, fallback.name: fallback}

    async def attempt(info: Any) -> list[Hit]:
        return await by_target[info.target].search(query, k, filters=filters)

    outcome = await hedger.run(attempt, classify_error=_search_error)
    hits = outcome.result()
    winner = next(a for a in outcome.attempts if a.number == outcome.winner)
    primary_attempts = [a for a in outcome.attempts if a.target == primary.name and a.sent]
    hedged: str | None
    if winner.target == primary.name:
        hedged = "primary_won" if outcome.fired else None
    elif not primary_attempts:
        hedged = "primary_circuit_open"
    elif any(a.outcome == "error" for a in primary_attempts):
        hedged = "fallback_after_error"
    else:
        hedged = "fallback_won"
    return HedgedAnswer(list(hits), winner.target, hedged)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


#: the name a search among the products an earlier turn showed is logged under
EARLIER_RESULTS = "earlier_results"

#: products each search looks at when the query asks for a price order (the k cheapest
#: are taken from those found): enough for a category of the sample catalogue
PRICE_ORDER_CANDIDATES = 50

class RetrievalStage:
    """The retrieve stage over a set of named searches (see the module docstring).

    Args:
        settings: order, ``min_results``, ``k``, fallbacks.
        db: the database holding the catalogue.
        searches: search name → search; every name in ``settings.searches`` and
            ``settings.fallbacks`` must be there.
        index: the vector index behind the vector searches, if any (for :meth:`warm`).
        embedder: closed by :meth:`aclose` if it has an ``aclose``.

    Raises:
        ValueError: a configured search is missing from ``searches``.
    """

    def __init__(
        self,
        settings: RetrievalSettings,
        db: sqlite_utils.Database,
        searches: Mapping[str, Search],
        *,
        index: VectorIndex | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        needed = [*settings.searches, *settings.fallbacks.values()]
        missing = [n for n in needed if n not in searches]
        if missing:
            raise ValueError(f"no search named {missing[0]!r} was given")
        self.settings = settings
        self.db = db
        self.reader = reader_for(db)
        self.searches = dict(searches)
        self.index = index
        self.embedder = embedder
        self._vocabulary: tuple[int, CategoryVocabulary] | None = None
        self.hedgers = {
            name: fallback_hedger(
                name,
                fallback,
                delay_ms=settings.hedge_delay_ms,
                max_extra_load=settings.hedge_max_extra_load,
            )
            for name, fallback in settings.fallbacks.items()
        }

    async def warm(self) -> int:
        """Embed the catalogue now if a vector search needs it (a no-op otherwise).

        Also embeds one word, so that the model is loaded (or the server connection
        open) before the first turn. Returns the number of products embedded. Call at
        start-up: the first turn then finds the vectors ready.

        Raises:
            ProviderError: the embedder failed.
        """
        if self.index is None:
            return 0
        n = await self.index.ensure()
        await self.index.embedder.embed(["warm-up"])  # load the model / open the connection
        return n

    async def aclose(self) -> None:
        """Stop background indexing, hedge shadows, the embedder's client and the
        catalogue reader's threads (a later search starts them again)."""
        if self.index is not None:
            await self.index.aclose()
        await asyncio.to_thread(self.reader.close)
        for hedger in self.hedgers.values():
            await hedger.aclose()
        close = getattr(self.embedder, "aclose", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> RetrievalStage:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run_one(
        self, name: str, text: str, filters: Filters, k: int
    ) -> tuple[list[Hit], SearchLog]:
        t0 = time.perf_counter()
        log = SearchLog(name=name, ms=0.0, n=0, answered_by=name)
        hits: list[Hit] = []
        try:
            fallback = self.settings.fallbacks.get(name)
            if fallback is None:
                hits = await self.searches[name].search(text, k, filters=filters)
            else:
                answer = await hedged_search(
                    self.searches[name],
                    self.searches[fallback],
                    text,
                    k,
                    filters=filters,
                    hedger=self.hedgers[name],
                )
                hits, log.answered_by, log.hedged = answer.hits, answer.answered_by, answer.hedged
            partial = getattr(hits, "errors", None)
            if partial:
                log.error = "partial: " + "; ".join(partial)
        except Exception as e:  # fail open: one search failing must not fail the turn
            log.error = _error_text(e)
            hits = []
        log.ms = (time.perf_counter() - t0) * 1000.0
        log.n = len(hits)
        log.ids = [h.id for h in hits]
        return hits, log

    async def _products(self, ids: list[str]) -> list[dict[str, Any]]:
        """The catalogue rows of ``ids`` (off the event loop)."""
        return await self.reader.run(lambda db: get_products(db, ids))

    async def vocabulary(self) -> CategoryVocabulary:
        """The category vocabulary of the catalogue searched (its categories, the
        settings' ``category_synonyms``, the built-in words that point to them), built
        again when the catalogue is reloaded
        (:func:`chainrun.retrieval.catalog.catalog_version`)."""
        synonyms = self.settings.category_synonyms

        def read(db: sqlite_utils.Database) -> tuple[int, list[str] | None]:
            version = catalog_version(db)
            if self._vocabulary is not None and self._vocabulary[0] == version:
                return version, None
            rows = db.execute("select distinct category from products").fetchall()
            return version, [r[0] for r in rows]

        version, categories = await self.reader.run(read)
        if categories is not None:
            self._vocabulary = (version, CategoryVocabulary.for_catalogue(categories, synonyms))
        assert self._vocabulary is not None
        return self._vocabulary[1]

    async def retrieve(self, query: str, *, label: str | None = None) -> RetrievalResult:
        """Products for the shopper's ``query`` (and the classify ``label``, if known).

        Never raises for a failing search (its error is in ``searches``); an empty
        result means nothing was found. A query asking for the cheapest (or dearest)
        first (:func:`~chainrun.retrieval.followup.price_order`) has each search look at
        up to :data:`PRICE_ORDER_CANDIDATES` products and gets the ``k`` cheapest (or
        dearest) of those found, in price order.
        """
        t0 = time.perf_counter()
        s = self.settings
        vocabulary = await self.vocabulary()
        parsed = parse_query(
            query, label, in_stock=not s.include_out_of_stock, vocabulary=vocabulary
        )
        order, text = price_order(parsed.text)
        text = text.strip(" ,.?!;:")  # "rain jackets? cheapest" searches "rain jackets"
        # what a product must be (and not say it is not): "waterproof boots" keeps no
        # "Not waterproof" suede, a padding search no boots that are not waterproof
        asked = query_attributes(text) if s.attribute_rules else None
        text = asked.search_text if asked is not None else text
        k = s.k if order is None else max(s.k, PRICE_ORDER_CANDIDATES)
        found: dict[str, str] = {}  # id → the search that found it first (insertion order)
        logs: list[SearchLog] = []
        stopped_after: str | None = None
        for i, name in enumerate(s.searches):
            hits, log = await self._run_one(name, text, parsed.filters, k)
            if asked is not None and (fresh := [h.id for h in hits if h.id not in found]):
                rows = await self._products(fresh)
                log.excluded = {p["id"]: why for p in rows
                                if (why := why_excluded(p, asked)) is not None}  # fmt: skip
            if log.excluded:
                hits = [h for h in hits if h.id not in log.excluded]
                log.n = len(hits)
            for hit in hits:
                if hit.id not in found:
                    found[hit.id] = log.answered_by or name
                    log.new += 1
            logs.append(log)
            if s.early_exit and len(found) >= s.min_results and i < len(s.searches) - 1:
                stopped_after = name  # early exit: the later searches never run
                break
        ids = list(found)[: s.k] if order is None else list(found)
        products = await self.reader.run(lambda db: get_products(db, ids))
        if order is not None:  # by price, then as found (sorted() is stable)
            products = sorted(products, key=lambda p: float(p["price"]),
                              reverse=order == "price_desc")[: s.k]  # fmt: skip
        items = [{**p, "source": found[p["id"]]} for p in products]
        return RetrievalResult(
            items=items,
            searches=logs,
            stopped_after=stopped_after,
            filters=parsed.filters,
            query=text,
            ms=(time.perf_counter() - t0) * 1000.0,
            price_order=order,
        )

    async def retrieve_within(
        self, ids: Sequence[str], message: str, query: str | None = None
    ) -> RetrievalResult:
        """The products ``ids`` (those an earlier turn showed, in the order shown) that
        the follow-up ``message`` asks for: narrowed by the sizes and prices it names
        (:func:`~chainrun.retrieval.filters.parse_query`, in stock unless
        ``include_out_of_stock``) and by its colours (a product with a colour holding
        each named colour word: "navy" finds "navy stripe"), in price order when it
        asks for the cheapest or dearest first
        (:func:`~chainrun.retrieval.followup.price_order`), else in the order shown; at
        most ``k``. No search runs: the one :class:`SearchLog` is
        :data:`EARLIER_RESULTS`. An empty result means none of them fits. ``query``:
        the follow-up's standalone query, logged as the result's ``query`` without its
        price-order words (default: the message).
        """
        t0 = time.perf_counter()
        parsed = parse_query(message, None, in_stock=not self.settings.include_out_of_stock)
        order, _ = price_order(parsed.text)
        text = price_order(parse_query(query or message).text)[1].strip(" ,.?!;:")
        colours = colours_named(message)
        # the products were found by the earlier turn's search: its categories hold
        filters = dataclasses.replace(parsed.filters, categories=())
        wanted = list(dict.fromkeys(ids))
        products = await self.reader.run(lambda db: get_products(db, wanted))

        def has_colours(p: dict[str, Any]) -> bool:
            words = {w.replace("gray", "grey") for c in p.get("colours") or []
                     for w in str(c).lower().split()}  # fmt: skip
            return all(c in words for c in colours)

        kept = [p for p in products if filters.matches(p) and has_colours(p)]
        if order is not None:  # by price, then as shown (sorted() is stable)
            kept = sorted(kept, key=lambda p: float(p["price"]), reverse=order == "price_desc")
        kept = kept[: self.settings.k]
        ms = (time.perf_counter() - t0) * 1000.0
        log = SearchLog(name=EARLIER_RESULTS, ms=ms, n=len(kept), new=len(kept),
                        answered_by=EARLIER_RESULTS, ids=[p["id"] for p in kept])  # fmt: skip
        return RetrievalResult(
            items=[{**p, "source": EARLIER_RESULTS} for p in kept],
            searches=[log],
            stopped_after=None,
            filters=filters,
            query=text,
            ms=ms,
            price_order=order,
            within=wanted,
            colours=colours,
        )


def build_searches(
    names: Iterable[str],
    db: sqlite_utils.Database,
    *,
    index: VectorIndex | None = None,
    rrf_k: int = RRF_K,
    candidates: int = 20,
) -> dict[str, Search]:
    """The searches called ``names`` (see ``settings.SEARCH_NAMES``), built on ``db``.

    ``vector`` and ``hybrid`` need ``index``. A hybrid search brings its components
    (``keyword_any``, ``vector``) along.

    Raises:
        ValueError: an unknown name, or a vector search without an index.
    """
    wanted = set(names)
    unknown = wanted - set(SEARCH_NAMES)
    if unknown:
        raise ValueError(f"unknown search {sorted(unknown)[0]!r}; expected one of {SEARCH_NAMES}")
    if wanted & EMBEDDING_SEARCHES and index is None:
        raise ValueError("vector and hybrid searches need a vector index")
    out: dict[str, Search] = {}
    if "keyword" in wanted:
        out["keyword"] = KeywordSearch(db, "all")
    if wanted & {"keyword_any", "hybrid"}:
        out["keyword_any"] = KeywordSearch(db, "any")
    if index is not None and wanted & EMBEDDING_SEARCHES:
        out["vector"] = VectorSearch(index)
    if "hybrid" in wanted:
        out["hybrid"] = HybridSearch(
            [out["keyword_any"], out["vector"]], rrf_k=rrf_k, candidates=candidates
        )
    if "filter" in wanted:
        out["filter"] = FilterSearch(db)
    return out


def build_retriever(
    settings: RetrievalSettings | None,
    db: sqlite_utils.Database,
    *,
    embedder: Embedder | None = None,
    searches: Mapping[str, Search] | None = None,
) -> RetrievalStage:
    """The retrieve stage for ``settings`` (None: the defaults) over the catalogue in ``db``.

    Args:
        embedder: for vector and hybrid searches; default: the one
            ``settings.embedding`` describes (built only if a search needs it).
        searches: searches to use instead of the built ones, by name (tests).

    Creates the catalogue tables if needed; does not load a catalogue (see
    :func:`chainrun.retrieval.catalog.ensure_sample_catalog`) nor embed it (see
    :meth:`RetrievalStage.warm`).

    Raises:
        ConfigError: the embedding settings are incomplete, or ``vector_backend`` asks
            for sqlite-vec where it cannot be loaded.
    """
    settings = settings or RetrievalSettings()
    ensure_catalog_tables(db)
    given = dict(searches or {})
    wanted = (set(settings.searches) | set(settings.fallbacks.values())) - set(given)
    index = None
    if wanted & EMBEDDING_SEARCHES:
        embedder = embedder or build_embedder(settings.embedding)
        try:
            index = VectorIndex(
                db,
                embedder,
                batch_size=settings.embedding.batch_size,
                backend=settings.vector_backend,
                oversample=settings.vector_oversample,
            )
        except ValueError as e:
            raise ConfigError(f"retrieval.vector_backend: {e}") from None
    built = build_searches(
        wanted, db, index=index, rrf_k=settings.rrf_k, candidates=settings.candidates
    )
    return RetrievalStage(settings, db, {**built, **given}, index=index, embedder=embedder)
