"""Adapter for any OpenAI-compatible chat-completions server (OpenAI, Azure OpenAI,
llama.cpp's llama-server, vLLM, Ollama) over ``openai.AsyncOpenAI``.

Always streams on the wire with ``stream_options={"include_usage": True}`` so that
every call has a TTFT and chunk gaps; whether a step *settles* on the first token or
on the whole answer is the chain's business. ``reasoning_effort`` is sent as the
top-level Chat Completions parameter and the cap as ``max_completion_tokens``
(``max_tokens`` is deprecated and refused by reasoning models; see FIELD.md).

The client is built with ``max_retries=0``: chainrun decides what is retried or
hedged, in one place (the hedging engine), not the SDK behind its back.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx2
import openai

from chainrun.errors import (
    ConfigError,
    ProviderError,
    ProviderStatusError,
    ProviderTimeout,
    ProviderUnavailable,
)
from chainrun.providers.base import ChatRequest
from chainrun.timing import Chunk, Usage


def _retry_after_s(headers: Any) -> float | None:
    """``Retry-After`` (seconds form) or ``retry-after-ms`` from response headers, in s."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # HTTP-date form: not worth a parser here


def _stale_connection(e: BaseException) -> bool:
    """True when ``e`` came from reusing a keep-alive connection the server had closed."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, httpx2.RemoteProtocolError) and "without sending" in str(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _usage(u: Any) -> Usage | None:
    if u is None:
        return None
    details = getattr(u, "completion_tokens_details", None)
    prompt_details = getattr(u, "prompt_tokens_details", None)
    return Usage(
        input_tokens=getattr(u, "prompt_tokens", None),
        output_tokens=getattr(u, "completion_tokens", None),
        reasoning_tokens=getattr(details, "reasoning_tokens", None) if details else None,
        cached_input_tokens=getattr(prompt_details, "cached_tokens", None)
        if prompt_details
        else None,
    )


def normalise_chunk(raw: Any, nbytes: int = 0) -> Chunk:
    """Turn an ``openai`` ``ChatCompletionChunk`` into a :class:`~chainrun.timing.Chunk`.

    Handles: role-only first frames, ``delta.reasoning_content`` (llama.cpp, vLLM,
    DeepSeek) or ``delta.reasoning``, usage on its own chunk with empty ``choices`` or
    on the finish chunk, and llama.cpp's ``timings`` block.
    """
    extra = raw.model_extra or {}
    content = reasoning = role = finish = None
    if raw.choices:
        choice = raw.choices[0]
        delta = choice.delta
        content = delta.content
        role = delta.role
        dextra = getattr(delta, "model_extra", None) or {}
        reasoning = dextra.get("reasoning_content") or dextra.get("reasoning")
        finish = choice.finish_reason
    return Chunk(
        content=content,
        reasoning=reasoning if isinstance(reasoning, str) else None,
        role=role,
        finish_reason=finish,
        usage=_usage(getattr(raw, "usage", None)),
        model=raw.model or None,
        response_id=raw.id or None,
        server_timings=extra.get("timings"),
        nbytes=nbytes,
    )


class OpenAICompatProvider:
    """A provider backed by ``openai.AsyncOpenAI``.

    Args:
        name: the provider's name in the config.
        base_url: e.g. ``http://127.0.0.1:8080/v1``; None = the OpenAI default.
        api_key_env: name of the environment variable holding the key (never the key).
        max_connections: HTTP connection pool size.
        connect_timeout_s: connect timeout in s.

    Raises:
        ConfigError: ``api_key_env`` names a variable that is not set.
    """

    def __init__(
        self,
        name: str,
        base_url: str | None,
        api_key_env: str | None = None,
        max_connections: int = 100,
        connect_timeout_s: float = 5.0,
        http_client: httpx2.AsyncClient | None = None,
    ) -> None:
        self.name = name
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ConfigError(
                    f"providers.{name}.api_key_env: environment variable {api_key_env} is not set"
                )
        else:
            key = "not-needed"  # local servers ignore the key; the SDK insists on one
        parts = urlsplit(base_url or "https://api.openai.com/v1")
        self.base_url = base_url
        self.server_address: str | None = (
            f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        )
        self._connect_timeout_s = connect_timeout_s
        self._owns_http = http_client is None
        self._http = http_client or openai.DefaultAsyncHttpxClient(
            # keep idle connections for less than servers commonly do (5 s), so that
            # the client rarely reuses one the server is closing
            limits=httpx2.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=2.0,
            ),
            timeout=httpx2.Timeout(600.0, connect=connect_timeout_s),
        )
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=key, max_retries=0, http_client=self._http
        )

    def _params(self, request: ChatRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": request.model,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.max_output_tokens is not None:
            params["max_completion_tokens"] = request.max_output_tokens
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.reasoning_effort is not None:
            params["reasoning_effort"] = request.reasoning_effort
        if request.seed is not None:
            params["seed"] = request.seed
        if request.stop:
            params["stop"] = request.stop
        if request.json_schema is not None:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": request.json_schema},
            }
        if request.headers:
            params["extra_headers"] = request.headers
        return params

    async def _create(self, request: ChatRequest) -> Any:
        """Send the request; once more if a pooled keep-alive connection was stale.

        A server may close an idle or much-used keep-alive connection (llama.cpp's
        HTTP server caps requests per connection) just as the client reuses it; the
        request then fails with "Server disconnected without sending a response"
        before the server saw it. Sending it again on a fresh connection is safe and
        is what browsers do; any other failure is not retried here (hedging decides).
        """
        params = self._params(request)
        try:
            return await self.client.chat.completions.create(**params)
        except openai.APIConnectionError as e:
            if not _stale_connection(e):
                raise
            return await self.client.chat.completions.create(**params)

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        """Stream ``request``; yields normalised chunks; the response is closed in ``finally``.

        Raises:
            ProviderUnavailable: cannot connect.
            ProviderTimeout: the HTTP client timed out.
            ProviderStatusError: an HTTP error status (``retry_after_s`` from its headers).
        """
        try:
            stream = await self._create(request)
        except openai.APITimeoutError as e:
            raise ProviderTimeout(f"{self.name}: request timed out ({e})") from e
        except openai.APIConnectionError as e:
            where = self.base_url or "api.openai.com"
            raise ProviderUnavailable(f"cannot reach provider {self.name!r} at {where}") from e
        except openai.APIStatusError as e:
            raise ProviderStatusError(
                f"{self.name}: HTTP {e.status_code}: {e.message}",
                status=e.status_code,
                retry_after_s=_retry_after_s(e.response.headers),
            ) from e
        try:
            # bytes as received from the wire (httpx counts them as it reads): a cheap
            # attribute read per chunk instead of re-serialising every chunk to count it
            seen = 0
            async for raw in stream:
                total = stream.response.num_bytes_downloaded
                yield normalise_chunk(raw, nbytes=total - seen)
                seen = total
        except openai.APIError as e:
            raise ProviderError(f"{self.name}: stream failed: {e}") from e
        except httpx2.HTTPError as e:
            raise ProviderError(f"{self.name}: stream failed: {type(e).__name__}: {e}") from e
        finally:
            await stream.close()

    async def check(self) -> None:
        """Fail fast when the server cannot be reached at all (``GET {base_url}/models``).

        Only a connection failure counts: a server without a models endpoint, or one that
        wants a different key for it, is left for the first real call to judge.

        Raises:
            ProviderUnavailable: cannot connect (refused, DNS, connect timeout).
        """
        try:
            await self.client.models.list(timeout=self._connect_timeout_s + 5.0)
        except openai.APIConnectionError as e:
            where = self.base_url or "api.openai.com"
            raise ProviderUnavailable(f"cannot reach provider {self.name!r} at {where}") from e
        except openai.APIError:
            pass

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()
