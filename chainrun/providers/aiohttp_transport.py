"""Chat Completions streams on aiohttp, with chainrun's own mapping of its errors.

A provider with ``transport = "aiohttp"`` sends its streamed ``POST /chat/completions``
on an ``aiohttp.ClientSession`` and feeds the body's bytes, as they arrive, to
chainrun's parser (:class:`~chainrun.providers.chat_sse.ChatSSEParser`): no ``openai``
request path and no httpx2 per call. On the same lab bytes this costs less CPU per
streamed call than the ``openai`` client on httpx2 (benchmarks/transport_cpu.py,
benchmarks/README.md "CPU per streamed call by transport").

The ``openai`` SDK ships an aiohttp transport of its own (``openai.DefaultAioHttpClient``,
a fork of httpx-aiohttp vendored as ``openai/_vendor/httpx_aiohttp``); it is not used
because it turns ``aiohttp.ServerDisconnectedError`` and ``aiohttp.ClientOSError`` (a
server that closes or resets the connection) into ``httpx.ConnectTimeout``, so a dropped
stream would be logged as a connect timeout. Here every aiohttp exception is mapped by
:func:`map_aiohttp_error` to the chainrun error the httpx2 path gives for the same fault
(tests/test_transport_faults.py runs each fault on a real loopback server on both):

=============================================  ==========================================
fault                                          chainrun error (``error_type``)
=============================================  ==========================================
connection refused, DNS, TLS handshake         :class:`~chainrun.errors.ProviderUnavailable`
                                               (``unavailable``)
closed or reset before a response              ``unavailable`` (after one resend when a
                                               reused keep-alive connection was closed)
no connection or no byte within a timeout      :class:`~chainrun.errors.ProviderTimeout`
                                               (``timeout``)
HTTP error status                              :func:`~chainrun.providers.openai_client.
                                               status_error` (``http_STATUS``, the SDK's
                                               message, ``Retry-After`` kept)
closed, reset or cut mid-stream                :class:`~chainrun.errors.
                                               ProviderConnectionLost` (``connection_lost``)
=============================================  ==========================================

The body's end is read after ``[DONE]`` (for at most :data:`DRAIN_TIMEOUT_S`) so the
connection is reused; a stream left before its end (a hedge's loser, a timer, an error)
closes its connection, so the server sees the client leave and stops generating.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp

from chainrun.errors import (
    ProviderConnectionLost,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
)
from chainrun.providers.chat_sse import DONE, ChatSSEParser
from chainrun.providers.openai_client import (
    KEEPALIVE_EXPIRY_S,
    READ_TIMEOUT_S,
    sdk_status_message,
    status_error,
)
from chainrun.timing import Chunk

#: s to wait for the rest of a body after ``[DONE]`` (the SDK's ``_DRAIN_TIMEOUT``, as on
#: the httpx path)
DRAIN_TIMEOUT_S = 0.1

#: aiohttp's connection faults: refused, closed, reset, or a body cut short
_CONNECTION_FAULTS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


def map_aiohttp_error(e: BaseException, *, name: str, where: str, streaming: bool) -> ProviderError:
    """The chainrun error for an exception aiohttp raised.

    Args:
        e: what aiohttp raised.
        name: the provider's name (``providers.NAME``) for the message.
        where: the server (a URL) for the message.
        streaming: ``e`` was raised while reading a stream whose headers had arrived.

    Returns:
        :class:`ProviderTimeout` (``aiohttp.ServerTimeoutError``: the connect or a read
        timed out), :class:`ProviderConnectionLost` (streaming: the connection was closed,
        reset or the body cut), :class:`ProviderUnavailable` (before the stream: refused,
        DNS, TLS, closed, reset or an error body cut), or :class:`ProviderError`
        (anything else aiohttp raised).
    """
    detail = f"{type(e).__name__}: {e}"
    if isinstance(e, aiohttp.ServerTimeoutError):
        if streaming:
            return ProviderTimeout(f"{name}: read timed out mid-stream: {detail}")
        return ProviderTimeout(f"{name}: request timed out ({detail})")
    if isinstance(e, _CONNECTION_FAULTS):
        if streaming:
            return ProviderConnectionLost(f"{name}: connection lost mid-stream: {detail}")
        return ProviderUnavailable(f"cannot reach provider {name!r} at {where}")
    return ProviderError(f"{name}: stream failed: {detail}")


def _stale(e: BaseException) -> bool:
    """True when ``e`` is a server closing a connection before it sent any response:
    what reusing a keep-alive connection the server had just closed looks like."""
    return isinstance(e, aiohttp.ServerDisconnectedError)


class AiohttpTransport:
    """One provider's HTTP client on aiohttp: a connection pool and its timeouts.

    The session is made on first use (aiohttp binds it to the running event loop), and
    honours the environment's proxy settings as httpx does (``trust_env``).

    Args:
        name: the provider's name, for messages.
        max_connections: connections at most (aiohttp's ``TCPConnector(limit=...)``).
        connect_timeout_s: s to open a TCP connection (``sock_connect``).
        read_timeout_s: s without a byte before a read gives up (``sock_read``): a
            backstop, the step's deadline and timers bound a call.
    """

    def __init__(
        self,
        name: str,
        max_connections: int,
        connect_timeout_s: float,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.max_connections = max_connections
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_EXPIRY_S
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, trust_env=True
            )
        return self._session

    async def post_stream(
        self,
        url: str,
        headers: Mapping[str, str],
        params: dict[str, Any],
        *,
        where: str,
    ) -> aiohttp.ClientResponse:
        """``POST url`` with the JSON body ``params``: the response once its headers are in
        (2xx), its body unread. Sent once more when a reused keep-alive connection turns
        out closed (the server never saw the request); no other resend (hedging decides).

        Raises:
            ProviderUnavailable, ProviderTimeout: :func:`map_aiohttp_error`.
            ProviderStatusError, RequestRejected: an HTTP error status
                (:func:`~chainrun.providers.openai_client.status_error`).
        """
        session = self._open()
        body = json.dumps(params).encode()
        try:
            try:
                response = await session.post(url, data=body, headers=headers)
            except aiohttp.ClientConnectionError as e:
                if not _stale(e):
                    raise
                response = await session.post(url, data=body, headers=headers)
            if response.status < 400:
                return response
            try:
                raw = await response.read()
            finally:
                response.release()
        except aiohttp.ClientError as e:
            raise map_aiohttp_error(e, name=self.name, where=where, streaming=False) from e
        message, error = sdk_status_message(response.status, raw)
        raise status_error(self.name, response.status, message, error, response.headers,
                           params=params)  # fmt: skip

    async def stream(
        self,
        url: str,
        headers: Mapping[str, str],
        params: dict[str, Any],
        *,
        where: str,
    ) -> AsyncGenerator[Chunk, None]:
        """The chunks of a streamed Chat Completions request (:meth:`post_stream`), its
        body's bytes parsed by :class:`~chainrun.providers.chat_sse.ChatSSEParser` as they
        arrive; the response is released (read to its end) after ``[DONE]`` and closed
        when left before (the server sees the client leave).

        Raises:
            ProviderUnavailable, ProviderTimeout, ProviderStatusError, RequestRejected:
                :meth:`post_stream`.
            ProviderConnectionLost, ProviderTimeout: mid-stream (:func:`map_aiohttp_error`).
            StreamError, MalformedStream: the parser's.
        """
        response = await self.post_stream(url, headers, params, where=where)
        parser = ChatSSEParser(self.name)
        content = response.content
        done = False
        try:
            # read by HTTP chunk, as httpx yields them (one SSE event each from most
            # servers); the first chunk parsed from a read carries the bytes received
            # since the last chunk (a read that completes no event adds to the next)
            pending = 0
            while True:
                part = (await content.readchunk())[0]
                if not part:
                    if content.at_eof():
                        break
                    continue  # an HTTP chunk's end found after its data was read
                pending += len(part)
                for item in parser.feed(part, pending):
                    if item is DONE:
                        done = True
                        break
                    pending = 0
                    yield item
                if done:
                    break
        except aiohttp.ClientError as e:
            raise map_aiohttp_error(e, name=self.name, where=where, streaming=True) from e
        finally:
            if done:  # read the body's end so that the connection is reused
                try:
                    await drain(response, DRAIN_TIMEOUT_S)
                finally:
                    response.release()
            else:  # left early (a loser, a timer, an error): close, the server sees it
                response.close()

    async def aclose(self) -> None:
        """Close the session and its connections (if one was made)."""
        if self._session is not None:
            await self._session.close()
            self._session = None


async def drain(response: aiohttp.ClientResponse, timeout_s: float) -> None:
    """Read what follows ``[DONE]`` for at most ``timeout_s`` s, so that the connection can
    be reused; errors there are not the call's."""
    content = response.content
    if content.at_eof():
        return
    try:
        async with asyncio.timeout(timeout_s):
            while await content.readany():
                pass
    except (TimeoutError, aiohttp.ClientError):
        pass
