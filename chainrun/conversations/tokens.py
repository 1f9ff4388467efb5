"""Counting the tokens of history text: the server's own tokenizer, or an estimate.

llama.cpp's ``llama-server`` tokenizes with the served model's own vocabulary at
``POST /tokenize`` (body ``{"content": TEXT}``, answer ``{"tokens": [ids...]}``; the
server README, "POST /tokenize"). A provider whose server answers there (the embedded
local model, a llama-server you run) is counted exactly; any other is estimated at
:data:`CHARS_PER_TOKEN` characters a token ("one token generally corresponds to ~4
characters of text for common English text": OpenAI Help Center, "What are tokens and
how to count them?"), rounded up.

Counts are cached by text (a conversation's earlier turns are counted again on every
later turn), so each turn is sent to the tokenizer once.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Protocol

import httpx2

__all__ = [
    "CHARS_PER_TOKEN",
    "EstimateCounter",
    "ServerTokenizer",
    "TokenCounter",
    "estimate_tokens",
    "server_root",
]

#: characters per token of the estimate (OpenAI Help Center, see the module text)
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """``ceil(len(text) / CHARS_PER_TOKEN)`` (0 for "")."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


class TokenCounter(Protocol):
    """Counts a text's tokens; ``method`` says how (``"tokenizer"`` or ``"estimate"``)."""

    method: str

    async def count(self, text: str) -> int: ...

    async def aclose(self) -> None: ...


class EstimateCounter:
    """The character estimate (:func:`estimate_tokens`); no I/O."""

    method = "estimate"

    async def count(self, text: str) -> int:
        return estimate_tokens(text)

    async def aclose(self) -> None:
        pass


def server_root(base_url: str) -> str:
    """The server's root URL from an OpenAI-compatible ``base_url`` (``.../v1`` dropped):
    ``http://127.0.0.1:8080/v1`` → ``http://127.0.0.1:8080``."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class ServerTokenizer:
    """Counts with llama-server's ``POST /tokenize`` at ``root``.

    A text the server cannot count (an error, a timeout, an answer of another shape) is
    estimated instead, and ``failures`` counts those; :meth:`probe` tells at start-up
    whether the server tokenizes at all.

    Args:
        root: the server's root URL (see :func:`server_root`).
        timeout_s: per request, in s (a count sits on the turn's critical path).
        cache_size: texts whose count is kept (least recently used dropped first).
        transport: the HTTP transport (None: the network; a test passes
            ``httpx2.MockTransport``).
    """

    method = "tokenizer"

    def __init__(
        self,
        root: str,
        *,
        timeout_s: float = 2.0,
        cache_size: int = 4096,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = root.rstrip("/") + "/tokenize"
        self._client = httpx2.AsyncClient(timeout=timeout_s, transport=transport)
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._cache_size = cache_size
        self.failures = 0

    async def _tokenize(self, text: str) -> int | None:
        try:
            r = await self._client.post(self.url, json={"content": text})
            tokens = r.json().get("tokens") if r.status_code == 200 else None
        except (httpx2.HTTPError, ValueError, AttributeError):
            return None
        return len(tokens) if isinstance(tokens, list) else None

    async def probe(self) -> bool:
        """Whether the server answers ``/tokenize`` with a token list."""
        return await self._tokenize("probe") is not None

    async def count(self, text: str) -> int:
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        n = await self._tokenize(text)
        if n is None:
            self.failures += 1
            return estimate_tokens(text)  # not cached: the server may answer next time
        self._cache[text] = n
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return n

    async def aclose(self) -> None:
        await self._client.aclose()


async def counter_for(base_url: str | None, method: str = "auto") -> TokenCounter:
    """The counter for a provider at ``base_url``: its server's tokenizer when ``method``
    is ``"auto"`` and the server answers ``/tokenize``, else the estimate. The caller
    closes it (``aclose``)."""
    if method != "auto" or base_url is None:
        return EstimateCounter()
    tokenizer = ServerTokenizer(server_root(base_url))
    if await tokenizer.probe():
        return tokenizer
    await tokenizer.aclose()
    return EstimateCounter()
