"""Adapter for any OpenAI-compatible chat-completions server (OpenAI, Azure OpenAI,
llama.cpp's llama-server, vLLM, Ollama) over ``openai.AsyncOpenAI``.

Always streams on the wire with ``stream_options={"include_usage": True}`` so that
every call has a TTFT and chunk gaps; whether a step *settles* on the first token or
on the whole answer is the chain's business. ``reasoning_effort`` is sent as the
top-level Chat Completions parameter and the cap as ``max_completion_tokens``
(``max_tokens`` is deprecated and refused by reasoning models; OpenAI API reference,
Chat Completions).

The client, its key, its pool and the error mapping are shared with the Responses
adapter (:mod:`chainrun.providers.openai_client`); Azure OpenAI deployments go through
the same class with an :class:`~chainrun.providers.openai_client.AzureTarget`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import httpx2
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from chainrun.errors import MalformedStream
from chainrun.providers.base import ChatRequest
from chainrun.providers.chat_sse import DONE, ChatSSEParser, tool_call_delta, usage_from_dict
from chainrun.providers.config import DEFAULT_TRANSPORT, Transport
from chainrun.providers.openai_client import OpenAIClientProvider
from chainrun.timing import Chunk, Usage, make_chunk

if TYPE_CHECKING:
    from chainrun.providers.aiohttp_transport import AiohttpTransport


def _usage(u: Any) -> Usage | None:
    """The SDK's ``CompletionUsage`` read by :func:`~chainrun.providers.chat_sse.usage_from_dict`
    (one reader of usage fields for both transports; ``model_dump`` keeps a server's
    extra fields such as DeepSeek's ``prompt_cache_hit_tokens``)."""
    if u is None:
        return None
    return usage_from_dict(u.model_dump() if hasattr(u, "model_dump") else u)


def normalise_chunk(raw: Any, nbytes: int = 0) -> Chunk:
    """Turn an ``openai`` ``ChatCompletionChunk`` into a :class:`~chainrun.timing.Chunk`.

    Handles: role-only first frames, ``delta.reasoning_content`` (llama.cpp, vLLM,
    DeepSeek) or ``delta.reasoning``, usage on its own chunk with empty ``choices`` or
    on the finish chunk, and llama.cpp's ``timings`` block. Called once per chunk, so
    it reads pydantic's extra fields directly (``__pydantic_extra__``, what
    ``model_extra`` returns) and builds the chunk with :func:`~chainrun.timing.make_chunk`.
    """
    content = reasoning = role = finish = tool_calls = None
    choices = raw.choices
    if choices:
        choice = choices[0]
        delta = choice.delta
        content = delta.content
        role = delta.role
        if delta.tool_calls:
            tool_calls = tuple(
                tool_call_delta(
                    getattr(c, "index", None), c.id,
                    c.function.name if c.function else None,
                    c.function.arguments if c.function else None,
                )
                for c in delta.tool_calls
            )  # fmt: skip
        dextra = getattr(delta, "__pydantic_extra__", None)
        if dextra:
            reasoning = dextra.get("reasoning_content") or dextra.get("reasoning")
            if not isinstance(reasoning, str):
                reasoning = None
        finish = choice.finish_reason
    usage = getattr(raw, "usage", None)
    extra = getattr(raw, "__pydantic_extra__", None)
    return make_chunk(
        content,
        reasoning,
        role,
        finish,
        None if usage is None else _usage(usage),
        raw.model or None,
        raw.id or None,
        extra.get("timings") if extra else None,
        nbytes,
        tool_calls,
    )


class OpenAICompatProvider(OpenAIClientProvider):
    """A Chat Completions provider backed by ``openai.AsyncOpenAI`` (or ``AsyncAzureOpenAI``).

    Constructor arguments and errors: see
    :class:`~chainrun.providers.openai_client.OpenAIClientProvider`, plus:

    Args:
        transport: the HTTP client of the streamed calls: ``httpx`` (the ``openai``
            client's request path on httpx2 and chainrun's pools) or ``aiohttp``
            (:mod:`chainrun.providers.aiohttp_transport`: the same request, less CPU a
            call); None = :data:`DEFAULT_TRANSPORT`, or ``httpx`` when ``http_client``
            is given. The startup check and ``GET /props`` always go through httpx2.

    Raises:
        ValueError: ``transport = "aiohttp"`` with an ``http_client`` (an httpx2 client).
    """

    def __init__(self, *args: Any, transport: Transport | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if transport is None:
            transport = "httpx" if not self._owns_http else DEFAULT_TRANSPORT
        elif transport == "aiohttp" and not self._owns_http:
            raise ValueError(f"provider {self.name!r}: an http_client is an httpx2 client; "
                             "transport 'aiohttp' takes none")  # fmt: skip
        self.transport: Transport = transport
        self._aio: AiohttpTransport | None = None
        if transport == "aiohttp":
            from chainrun.providers.aiohttp_transport import AiohttpTransport

            self._aio = AiohttpTransport(
                self.name, self.max_connections, self._connect_timeout_s, self._read_timeout_s
            )
        #: (the client's base URL, as text, the path and query, headers, whether the
        #: model is in the path) of :meth:`_aio_request`, built at its first call
        self._aio_target: tuple[Any, str, str, dict[str, str], bool] | None = None

    #: llama-server's per-request ``cache_prompt`` switch, sent with every request when
    #: not None (False: the server neither reuses nor keeps a cached prompt prefix, so
    #: every call's TTFT includes the whole prompt). OpenAI's API has no such switch (it
    #: caches prefixes of 1,024+ tokens on its own) and refuses unknown parameters: set
    #: it only for a llama-server.
    cache_prompt: bool | None = None
    #: send a request's ``sampling`` (llama.cpp server sampler fields) in its body;
    #: OpenAI's API refuses unknown fields (HTTP 400), so only a llama-server gets them
    #: (set by the provider factory: the embedded local model, or ``sampling_fields``)
    sampling_fields: bool = False

    def _params(self, request: ChatRequest, slot: int | None = None) -> dict[str, Any]:
        """The request body for ``request``; ``slot``: the llama-server slot it names
        (``id_slot``, with ``cache_prompt`` true unless the provider sets it)."""
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
        if request.sampling and self.sampling_fields:
            params.update(request.sampling)
        if request.json_schema is not None:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": request.json_schema},
            }
        if request.tools:
            params["tools"] = [{"type": "function", "function": t} for t in request.tools]
            if request.tool_choice is not None:
                params["tool_choice"] = request.tool_choice
        if request.headers:
            params["extra_headers"] = request.headers
        if self.cache_prompt is not None:
            params["cache_prompt"] = self.cache_prompt
        key = self.prompt_cache_key(request)
        if key is not None:
            params["prompt_cache_key"] = key
        if slot is not None:
            params["id_slot"] = slot
            params.setdefault("cache_prompt", True)
        return params

    #: parse the stream in the ``openai`` client (its SSE decoder and a
    #: ``ChatCompletionChunk`` model per chunk, then :func:`normalise_chunk`) instead of
    #: :class:`~chainrun.providers.chat_sse.ChatSSEParser`: the same chunks, more CPU;
    #: kept as the oracle the parser is tested against and for benchmarks/scale.py's
    #: comparison (``--sdk-sse``)
    sdk_sse: bool = False

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        """Stream ``request``; yields normalised chunks; the response is closed in ``finally``.

        The request (its body, auth, headers, HTTP status errors) goes through the
        ``openai`` client; the body's bytes are parsed by
        :class:`~chainrun.providers.chat_sse.ChatSSEParser` as they arrive
        (the SDK's per-chunk models were a third of the loop at 1,000 streams).

        Raises:
            ProviderUnavailable: cannot connect.
            ProviderTimeout: the HTTP client timed out.
            ProviderStatusError: an HTTP error status (``retry_after_s`` from its headers).
            RequestRejected: HTTP 400 naming a parameter, or 401/403/404.
            StreamError: the server reported an error inside the stream
                (:class:`ContextLengthExceeded` when the prompt does not fit).
            MalformedStream: a stream event whose data is not a JSON object.
            ProviderError: the stream failed after it started.
        """
        table = self.slot_table if self.affinity == "slot" else None
        slot = table.acquire(request.cache_key, request.cache_owner) if table else None
        try:
            params = self._params(request, slot)
            if self.sdk_sse:
                stream = self._sdk_chunks(params)
            elif self._aio is not None:
                url, headers = self._aio_request(params)
                stream = self._aio.stream(url, headers, params, where=self.where)
            else:
                stream = self._stream(params)
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    yield chunk
        finally:
            if table is not None and slot is not None:
                table.release(slot)

    async def _stream(self, params: dict[str, Any]) -> AsyncGenerator[Chunk, None]:
        """:meth:`chunks` of the request body ``params``, parsed by chainrun's parser."""
        sdk_stream = await self._send(self._post_stream, params)
        response: httpx2.Response = sdk_stream.response  # its SSE iterator is never started
        parser = ChatSSEParser(self.name)
        body = response.aiter_bytes()
        done = False
        try:
            # bytes as received from the wire (httpx counts them as it reads): the first
            # chunk parsed from a read carries the bytes received since the last chunk
            seen = 0
            async for part in body:
                total = response.num_bytes_downloaded
                for item in parser.feed(part, total - seen):
                    if item is DONE:
                        done = True
                        break
                    seen = total
                    yield item
                if done:
                    break
        except httpx2.HTTPError as e:
            raise self._error(e, streaming=True) from e
        finally:
            try:
                if done:  # read the body's end so that the connection is reused
                    await _drain(body)
            finally:
                await body.aclose()
                await response.aclose()

    async def aclose(self) -> None:
        """Close the HTTP clients this provider built (httpx2's, and aiohttp's if made)."""
        try:
            if self._aio is not None:
                await self._aio.aclose()
        finally:
            await super().aclose()

    def _aio_request(self, params: dict[str, Any]) -> tuple[str, dict[str, str]]:
        """(URL, headers) of a streamed ``POST /chat/completions`` as the ``openai`` client
        sends it: its base URL (with Azure's ``/deployments/MODEL`` when the client names
        no deployment) and query (Azure's ``api-version``), its default and auth headers,
        then the request's own (``extra_headers``, taken out of ``params``)."""
        base = self.client.base_url
        target = self._aio_target
        if target is None or target[0] is not base:  # built once; again after repoint()
            query = {k: v for k, v in self.client.default_query.items() if isinstance(v, str)}
            suffix = "chat/completions" + (f"?{urlencode(query)}" if query else "")
            headers: dict[str, Any] = {**self.client.default_headers, **self.client.auth_headers}
            clean = {k: v for k, v in headers.items() if isinstance(v, str)}
            per_model = self.azure is not None and "/deployments" not in base.path
            target = self._aio_target = (base, str(base), suffix, clean, per_model)
        _, prefix, suffix, common, per_model = target
        if per_model:  # Azure without a deployment: the request's model names it
            prefix += f"deployments/{quote(str(params['model']), safe='')}/"
        extra = params.pop("extra_headers", None)
        return prefix + suffix, {**common, **extra} if extra else common

    async def _post_stream(self, **params: Any) -> openai.AsyncStream[Any]:
        """``POST /chat/completions`` through the client's own request path (auth, Azure's
        deployment URLs, headers, status errors) as ``chat.completions.create`` sends
        it, without ``create``'s walk over the parameters against their TypedDicts
        (``async_maybe_transform``: identity for the plain JSON chainrun builds, and
        about 0.5 ms a call at 1,000 in flight)."""
        headers = params.pop("extra_headers", None)
        return await self.client.post(
            "/chat/completions",
            body=params,
            options={"headers": headers} if headers else {},
            cast_to=ChatCompletion,
            stream=True,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )

    async def _sdk_chunks(self, params: dict[str, Any]) -> AsyncGenerator[Chunk, None]:
        """:meth:`chunks` through the SDK's own stream parsing (see :attr:`sdk_sse`);
        the body fields ``create`` has no parameter for go in its ``extra_body``."""
        extra = {k: params.pop(k) for k in _NOT_SDK_PARAMS if k in params}
        if extra:
            params["extra_body"] = extra
        stream = await self._send(self.client.chat.completions.create, params)
        try:
            seen = 0
            async for raw in stream:
                total = stream.response.num_bytes_downloaded
                yield normalise_chunk(raw, nbytes=total - seen)
                seen = total
        except (openai.APIError, httpx2.HTTPError) as e:
            raise self._error(e, streaming=True) from e
        except ValueError as e:  # a "data:" line that is not JSON
            raise MalformedStream(f"{self.name}: malformed stream line ({e})") from e
        finally:
            await stream.close()


#: body fields of llama-server's that ``chat.completions.create`` takes no parameter for
_NOT_SDK_PARAMS = ("cache_prompt", "id_slot", "repeat_penalty", "repeat_last_n",
                   "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                   "top_k", "min_p")

#: s to wait for the rest of a body after ``[DONE]`` (the SDK's ``_DRAIN_TIMEOUT``)
DRAIN_TIMEOUT_S = 0.1


async def _drain(body: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (HTTP/1.1 reuses a connection only once its body was
    read to the end), for at most :data:`DRAIN_TIMEOUT_S`; errors there are not the call's."""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in body:
                pass
    except (TimeoutError, httpx2.HTTPError):
        pass
