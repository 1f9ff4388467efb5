"""A provider's connections split into small pools (chainrun.providers.pool): over real
HTTP to the latency lab, through the real ``openai`` client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpcore2
import httpx2
import pytest

from chainrun.config import config_from_dict
from chainrun.errors import ProviderUnavailable
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import Lognormal
from chainrun.providers.base import ChatRequest, ChatStream
from chainrun.providers.netio import AsyncioBackend, use_asyncio_io
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.providers.pool import POOL_CONNECTIONS, ShardedTransport

REQ = ChatRequest(model="m", messages=[{"role": "user", "content": "a linen shirt?"}])


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    # 8 tokens 50 ms apart: a stream stays open ~0.4 s, long enough to count it in flight
    scenario = Scenario(
        name="pool", n_tokens=8, per_token_ms=50, latency=Lognormal(median_ms=5, sigma=0.01)
    )
    with LabServer(scenario) as server:
        yield server


def pools_of(provider: OpenAICompatProvider) -> ShardedTransport:
    transport = provider._http._transport
    assert isinstance(transport, ShardedTransport)
    return transport


def test_connections_are_split_as_evenly_as_they_divide() -> None:
    t = ShardedTransport(100, 32, keepalive_expiry=2.0)
    assert [p._pool._max_connections for p in t.pools] == [25, 25, 25, 25]
    t = ShardedTransport(10, 4, keepalive_expiry=2.0)
    assert [p._pool._max_connections for p in t.pools] == [4, 3, 3]
    assert ShardedTransport(5, 32, keepalive_expiry=2.0).in_flight == [0]
    with pytest.raises(ValueError):
        ShardedTransport(10, 0, keepalive_expiry=2.0)


def test_the_least_loaded_pool_is_picked_and_equal_pools_take_turns() -> None:
    t = ShardedTransport(12, 3, keepalive_expiry=2.0)
    assert [t._pick() for _ in range(5)] == [0, 1, 2, 3, 0]
    t.in_flight[:] = [2, 1, 0, 1]
    assert t._pick() == 2
    t.in_flight[:] = [1, 1, 1, 1]
    assert t._pick() == 3  # from the next in turn after 2


def test_the_config_default_is_the_module_default() -> None:
    cfg = config_from_dict({"providers": {"local": {"base_url": "http://127.0.0.1:1/v1"}}})
    assert cfg.providers["local"].pool_connections == POOL_CONNECTIONS


async def test_streams_spread_over_pools_and_release_their_count(lab: LabServer) -> None:
    provider = OpenAICompatProvider(
        "lab", lab.base_url, max_connections=8, pool_connections=2, transport="httpx"
    )
    pools = pools_of(provider)
    assert len(pools.pools) == 4
    streams = [ChatStream(provider, REQ) for _ in range(8)]
    try:
        await asyncio.gather(*(s.first_token() for s in streams))
        assert pools.in_flight == [2, 2, 2, 2]
        for p in pools.pools:  # no pool opened more than its share
            assert len(p._pool.connections) <= 2
        for s in streams[4:]:  # closed half way: their counts are released
            await s.aclose()
        assert sum(pools.in_flight) == 4
        await asyncio.gather(*(s.collect() for s in streams[:4]))
        for s in streams[:4]:  # measurements as before: a whole answer, timed
            assert s.timer.finish_reason == "stop" and s.timer.ttft_ms is not None
            assert len(s.timer.content) == 8
    finally:
        for s in streams:
            await s.aclose()
        await provider.aclose()
    assert pools.in_flight == [0, 0, 0, 0]


async def test_a_failed_send_releases_its_count() -> None:
    url = "http://127.0.0.1:1/v1"  # nothing listens on port 1
    provider = OpenAICompatProvider(
        "dead", url, max_connections=4, pool_connections=1, transport="httpx"
    )
    try:
        stream = ChatStream(provider, REQ)
        with pytest.raises(ProviderUnavailable):
            await stream.collect()
        assert pools_of(provider).in_flight == [0, 0, 0, 0]
    finally:
        await provider.aclose()


async def test_one_pool_when_the_environment_names_a_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    provider = OpenAICompatProvider("p", "http://127.0.0.1:1/v1", max_connections=100)
    try:
        assert isinstance(provider._http._transport, httpx2.AsyncHTTPTransport)
    finally:
        await provider.aclose()


# ---------------------------------------------- the pools' network I/O on asyncio streams


def test_every_pool_does_its_io_on_asyncio_streams() -> None:
    t = ShardedTransport(10, 4, keepalive_expiry=2.0)
    assert all(isinstance(p._pool._network_backend, AsyncioBackend) for p in t.pools)
    with pytest.raises(TypeError):
        use_asyncio_io(object())


async def test_asyncio_backend_reads_writes_and_raises_httpcores_errors() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        if line == b"close\n":
            writer.close()
            return
        writer.write(line.upper())
        await writer.drain()
        await reader.read()  # then silent until the client goes
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = AsyncioBackend()
    try:
        conn = await backend.connect_tcp("127.0.0.1", port, timeout=2.0)
        await conn.write(b"hello\n", timeout=2.0)
        assert await conn.read(100, timeout=2.0) == b"HELLO\n"
        assert conn.get_extra_info("is_readable") is False
        assert conn.get_extra_info("server_addr")[1] == port
        with pytest.raises(httpcore2.ReadTimeout):
            await conn.read(100, timeout=0.05)  # the server says nothing more
        await conn.aclose()
        closing = await backend.connect_tcp("127.0.0.1", port, timeout=2.0)
        await closing.write(b"close\n")
        assert await closing.read(100, timeout=2.0) == b""  # the server closed it
        assert closing.get_extra_info("is_readable") is True  # an idle one would expire
        await closing.aclose()
        with pytest.raises(httpcore2.WriteError):
            await closing.write(b"x", timeout=1.0)
    finally:
        server.close()
        await server.wait_closed()
    with pytest.raises(httpcore2.ConnectError):
        await backend.connect_tcp("127.0.0.1", 1, timeout=2.0)  # nothing listens on port 1
