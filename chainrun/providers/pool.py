"""A provider's HTTP connections split into several small pools (1,000 turns
in flight in one process).

httpcore's connection pool (under the ``openai`` client's ``httpx2``) re-plans every
request's connection at each request start and each response close, and that pass
walks *every* connection of the pool: ``AsyncConnectionPool._assign_requests_to_connections``
is O(open connections + queued requests) per call. With one pool of 1,000-2,000 open
connections (1,000 turns in flight) each walk costs about 1-2 ms of the event loop:
measured by py-spy at 28% of the client's loop, about 14 ms a turn against about 7 at
100 in flight (benchmarks/README.md, "Scale in one process").

:class:`ShardedTransport` keeps ``ceil(max_connections / pool_connections)`` pools of at
most ``pool_connections`` connections each (an ``httpx2.AsyncHTTPTransport`` each) and
sends every request to the pool with the fewest requests in flight (ties: the next in
turn), so a walk covers one small pool. The total stays bounded by ``max_connections``
for requests in flight: a request waits for a connection only when every pool is full
(each pool's own queue then serves it), as with one pool. A request's count is released
when its response is closed (or its send failed). Each pool does its network I/O on
asyncio's own streams (:mod:`chainrun.providers.netio`), not through anyio.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable

import httpx2

from chainrun.providers.netio import use_asyncio_io

#: default connections per pool: the walk stays ~32 connections long (tens of µs) while
#: picking the least-loaded pool stays cheap (a 4,000-connection provider has 125 pools)
POOL_CONNECTIONS = 32


class _Counted(httpx2.AsyncByteStream):
    """A response body that releases its pool's in-flight count once, at close."""

    __slots__ = ("_release", "_stream")

    def __init__(self, stream: httpx2.AsyncByteStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        release, self._release = self._release, None
        try:
            await self._stream.aclose()
        finally:
            if release is not None:
                release()


class ShardedTransport(httpx2.AsyncBaseTransport):
    """Several ``httpx2.AsyncHTTPTransport`` pools behind one transport; least-loaded wins.

    Args:
        max_connections: connections in all pools together (>= 1).
        pool_connections: connections per pool at most (>= 1); the number of pools is
            ``ceil(max_connections / pool_connections)`` and the connections are spread
            as evenly as they divide.
        keepalive_expiry: s an idle connection is kept.

    Attributes:
        pools: the pools (``httpx2.AsyncHTTPTransport``), in order.
        in_flight: requests in flight per pool (sent, response not yet closed).
    """

    def __init__(
        self, max_connections: int, pool_connections: int, *, keepalive_expiry: float
    ) -> None:
        if max_connections < 1 or pool_connections < 1:
            raise ValueError("max_connections and pool_connections must be >= 1")
        n = math.ceil(max_connections / pool_connections)
        sizes = [max_connections // n + (1 if i < max_connections % n else 0) for i in range(n)]
        self.pools = [
            httpx2.AsyncHTTPTransport(
                limits=httpx2.Limits(
                    max_connections=size,
                    max_keepalive_connections=size,
                    keepalive_expiry=keepalive_expiry,
                )
            )
            for size in sizes
        ]
        for pool in self.pools:  # asyncio's streams instead of anyio's (netio)
            use_asyncio_io(pool)
        self.in_flight = [0] * n
        self._next = 0

    def _pick(self) -> int:
        """The pool with the fewest requests in flight, searching from the next in turn
        (so that equal pools take turns and every pool's connections get reused)."""
        counts, n = self.in_flight, len(self.in_flight)
        start = self._next
        best, low = start, counts[start]
        if low:
            for i in range(start + 1, start + n):
                j = i % n if i >= n else i
                if counts[j] < low:
                    best, low = j, counts[j]
                    if not low:
                        break
        self._next = best + 1 if best + 1 < n else 0
        return best

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        i = self._pick()
        counts = self.in_flight
        counts[i] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                counts[i] -= 1

        try:
            response = await self.pools[i].handle_async_request(request)
        except BaseException:
            release()
            raise
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Counted(stream, release),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        for pool in self.pools:
            await pool.aclose()
