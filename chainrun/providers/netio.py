"""httpcore's network I/O on asyncio's own streams, without anyio.

httpcore (under the ``openai`` client's ``httpx2``) reads and writes sockets through
anyio on asyncio: every read of a streamed response opens an anyio cancel scope
(``fail_after``) and goes through anyio's socket stream. With 1,000 streams in flight and
a chunk every 40 ms each, that was about a quarter of the event loop's CPU (py-spy of
``benchmarks/scale.py``'s paced 1,000 level: anyio 23%, sniffio 3%). :class:`AsyncioBackend`
is httpcore's ``AsyncNetworkBackend`` on ``asyncio.open_connection``: a read is
``StreamReader.read`` under ``asyncio.timeout``. httpcore's own exceptions are raised as
its anyio backend raises them (``ConnectError``/``ConnectTimeout``, ``ReadError``/
``ReadTimeout``, ``WriteError``/``WriteTimeout``), so httpx and the ``openai`` client map
them exactly as before. Used by :class:`~chainrun.providers.pool.ShardedTransport`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore2
from httpcore2 import (
    AsyncNetworkBackend,
    AsyncNetworkStream,
    ConnectError,
    ConnectTimeout,
    ReadError,
    ReadTimeout,
    WriteError,
    WriteTimeout,
)

#: httpcore's socket option shape (``httpcore2._types.SOCKET_OPTION``)
SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


class AsyncioStream(AsyncNetworkStream):
    """One connection: an asyncio ``StreamReader``/``StreamWriter`` pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        """Up to ``max_bytes`` received (b"" at the end of the stream); timeout in s.

        Raises:
            httpcore2.ReadTimeout, httpcore2.ReadError.
        """
        try:
            if timeout is None:
                return await self._reader.read(max_bytes)
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as e:
            raise ReadTimeout(e) from e
        except OSError as e:
            raise ReadError(e) from e

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Send ``buffer``; timeout in s.

        Raises:
            httpcore2.WriteTimeout, httpcore2.WriteError.
        """
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            if timeout is None:
                await self._writer.drain()
            else:
                async with asyncio.timeout(timeout):
                    await self._writer.drain()
        except TimeoutError as e:
            raise WriteTimeout(e) from e
        except (OSError, RuntimeError) as e:  # RuntimeError: the transport was closed
            raise WriteError(e) from e

    async def aclose(self) -> None:
        """Close the connection (the transport closes it at once, no handshake wait)."""
        self._writer.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> AsyncNetworkStream:
        """TLS over this connection (an HTTP proxy's CONNECT tunnel).

        Raises:
            httpcore2.ConnectTimeout, httpcore2.ConnectError.
        """
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as e:
            raise ConnectTimeout(e) from e
        except (OSError, ssl.SSLError) as e:
            self._writer.close()
            raise ConnectError(e) from e
        return self

    def get_extra_info(self, info: str) -> Any:
        """What httpcore asks of a connection: ``ssl_object``, ``client_addr``,
        ``server_addr``, ``socket`` and ``is_readable`` (an idle keep-alive connection
        the server has closed: the transport has read its end of stream)."""
        writer = self._writer
        if info == "ssl_object":
            return writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return writer.get_extra_info("sockname")
        if info == "server_addr":
            return writer.get_extra_info("peername")
        if info == "socket":
            return writer.get_extra_info("socket")
        if info == "is_readable":
            return self._reader.at_eof() or writer.transport.is_closing()
        return None


class AsyncioBackend(AsyncNetworkBackend):
    """httpcore's network backend on asyncio streams (see the module docstring)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> AsyncNetworkStream:
        """Connect to ``host:port`` (timeout in s); asyncio sets TCP_NODELAY.

        Raises:
            httpcore2.ConnectTimeout, httpcore2.ConnectError.
        """
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, local_addr=local)
        except TimeoutError as e:
            raise ConnectTimeout(e) from e
        except OSError as e:
            raise ConnectError(e) from e
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[SocketOption] | None = None,
    ) -> AsyncNetworkStream:
        """Connect to the Unix socket at ``path`` (timeout in s).

        Raises:
            httpcore2.ConnectTimeout, httpcore2.ConnectError.
        """
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path)
        except TimeoutError as e:
            raise ConnectTimeout(e) from e
        except OSError as e:
            raise ConnectError(e) from e
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def use_asyncio_io(pool: Any) -> None:
    """Make an ``httpx2.AsyncHTTPTransport``'s httpcore pool do its network I/O with
    :class:`AsyncioBackend` (new connections from now on). httpx does not expose the
    pool's ``network_backend``; this sets the attribute httpcore's pool reads when it
    creates a connection (checked by tests/test_provider_pool.py).

    Raises:
        TypeError: ``pool`` has no httpcore connection pool where expected.
    """
    inner = getattr(pool, "_pool", None)
    if not isinstance(inner, httpcore2.AsyncConnectionPool) or not hasattr(
        inner, "_network_backend"
    ):
        raise TypeError("not an httpx2 transport over an httpcore2 connection pool")
    inner._network_backend = AsyncioBackend()
