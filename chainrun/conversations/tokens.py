"""Counting the tokens of history text: the server's own tokenizer, or an estimate.

llama.cpp's ``llama-server`` tokenizes with the served model's own vocabulary at
``POST /tokenize`` (body ``{"content": TEXT}``, answer ``{"tokens": [ids...]}``; the
server README, "POST /tokenize"). A provider whose server answers there (the embedded
local model, a llama-server you run) is counted exactly; any other is estimated by
script (:func:`estimate_tokens`): ASCII at :data:`CHARS_PER_TOKEN` characters a token
("one token generally corresponds to ~4 characters of text for common English text":
OpenAI Help Center, "What are tokens and how to count them?"), a CJK ideograph, hangul
syllable or emoji one token each, a kana half a token, a letter of another alphabet
(Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, ...) 0.45 of a token, an accented
Latin letter one token.
Four characters a token undercounts text that is not English by half or more; the
weights above were set from Gemma 3's tokenizer (``benchmarks/token_estimate.py``:
measured per script, the estimate's error is in ``benchmarks/README.md``) and round up
where it tokenizes finer, since the estimate guards a budget.

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

#: characters per token of ASCII text in the estimate (OpenAI Help Center, see the module text)
CHARS_PER_TOKEN = 4


def _char_tokens(o: int) -> float:
    """The estimate's tokens for one non-ASCII code point ``o`` (see the module text)."""
    if 0x3040 <= o <= 0x30FF:
        return 0.5  # kana: tokenizers join them (Gemma 3: 0.5 a kana or fewer)
    if (0x3400 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF
            or 0x1100 <= o <= 0x11FF or 0x3000 <= o <= 0x303F or 0xFF00 <= o <= 0xFFEF
            or 0x20000 <= o <= 0x2FFFF):  # fmt: skip
        return 1.0  # CJK ideographs, hangul, CJK punctuation, full-width forms
    if o >= 0x1F000 or 0x2600 <= o <= 0x27BF:
        return 1.0  # emoji and symbols
    if 0xFE00 <= o <= 0xFE0F or 0x200B <= o <= 0x200D:
        return 0.0  # variation selectors, zero-width joiners: part of the emoji before
    if o < 0x250:
        return 1.0  # accented Latin letters (Latin-1 and Latin Extended)
    return 0.45  # letters of other alphabets


def estimate_tokens(text: str) -> int:
    """The script-aware estimate of ``text``'s tokens, rounded up (0 for ""): ASCII at
    :data:`CHARS_PER_TOKEN` characters a token, other characters as the module text
    says (a CJK character or an emoji one token)."""
    if text.isascii():
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    ascii_chars = 0
    other = 0.0
    for ch in text:
        o = ord(ch)
        if o < 128:
            ascii_chars += 1
        else:
            other += _char_tokens(o)
    return math.ceil(ascii_chars / CHARS_PER_TOKEN + other)


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
