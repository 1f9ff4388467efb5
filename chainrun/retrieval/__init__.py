"""Retrieval over the product catalogue: keyword, vector, filter and hybrid searches
behind one protocol, and a retrieve stage that stops early.

Modules: ``base`` (the :class:`Search` protocol, :class:`Hit`, :class:`RetrievalResult`,
:func:`format_for_prompt`), ``keyword`` (FTS5 bm25), ``vector`` (embeddings, NumPy,
sqlite-vec scan or vec0 backends), ``vec0`` (sqlite-vec ``vec0`` KNN with exact
filters), ``reader`` (catalogue reads on worker threads), ``embeddings`` (MiniLM in
NumPy, OpenAI-compatible endpoint, hashing), ``filters`` (price/size/category parsed
from the message), ``hybrid`` (reciprocal rank fusion), ``stage`` (priority order, early
exit, hedged fallbacks), ``settings``.

Typical use::

    from chainrun.retrieval.catalog import ensure_sample_catalog
    from chainrun.retrieval import RetrievalSettings, build_retriever

    ensure_sample_catalog(store.db)
    retriever = build_retriever(RetrievalSettings(), store.db)
    await retriever.warm()                     # embed the catalogue once (cached in the db)
    found = await retriever.retrieve("waterproof jacket under 100", label="product_search")
    found.items, found.searches, found.stopped_after, found.as_json(), found.prompt_text()
"""

from chainrun.retrieval.base import (
    RetrievalResult,
    Retriever,
    Search,
    SearchLog,
    format_for_prompt,
)
from chainrun.retrieval.embeddings import (
    Embedder,
    HashEmbedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    build_embedder,
)
from chainrun.retrieval.filters import (
    Filters,
    FilterSearch,
    ParsedQuery,
    parse_filters,
    parse_query,
)
from chainrun.retrieval.hits import Hit, Hits
from chainrun.retrieval.hybrid import HybridSearch, rrf_fuse
from chainrun.retrieval.keyword import KeywordSearch, fts_query
from chainrun.retrieval.settings import SEARCH_NAMES, EmbeddingSettings, RetrievalSettings
from chainrun.retrieval.stage import (
    HedgedAnswer,
    RetrievalStage,
    build_retriever,
    build_searches,
    fallback_hedger,
    hedged_search,
)
from chainrun.retrieval.vec0 import Vec0Index
from chainrun.retrieval.vector import VECTOR_BACKENDS, VectorIndex, VectorSearch

__all__ = [
    "SEARCH_NAMES",
    "VECTOR_BACKENDS",
    "Embedder",
    "EmbeddingSettings",
    "FilterSearch",
    "Filters",
    "HashEmbedder",
    "HedgedAnswer",
    "Hit",
    "Hits",
    "HybridSearch",
    "KeywordSearch",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "ParsedQuery",
    "RetrievalResult",
    "RetrievalSettings",
    "RetrievalStage",
    "Retriever",
    "Search",
    "SearchLog",
    "Vec0Index",
    "VectorIndex",
    "VectorSearch",
    "build_embedder",
    "build_retriever",
    "build_searches",
    "fallback_hedger",
    "format_for_prompt",
    "fts_query",
    "hedged_search",
    "parse_filters",
    "parse_query",
    "rrf_fuse",
]
