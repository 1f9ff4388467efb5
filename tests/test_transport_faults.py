"""Every connection fault on both transports (``httpx`` and ``aiohttp``), each done by a
real server on loopback: the same chainrun error type, ``error_type``, status and
message, and the same number of requests sent (one resend of a request a server closed
without answering, no other).

The servers are plain asyncio sockets that read one HTTP/1.1 request and then do one
thing: refuse (nothing listens), close or reset mid-stream, close before answering,
stall past the read timeout (before the headers, or after the first chunk), answer
429 with ``Retry-After``, a 5xx or a 400 naming a parameter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from chainrun.errors import (
    ProviderConnectionLost,
    ProviderError,
    ProviderStatusError,
    ProviderTimeout,
    ProviderUnavailable,
    RequestRejected,
)
from chainrun.providers.base import ChatRequest
from chainrun.providers.openai_client import AzureTarget
from chainrun.providers.openai_compat import OpenAICompatProvider

TRANSPORTS = ("httpx", "aiohttp")
REQUEST = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                      reasoning_effort="minimal", headers={"x-chainrun-attempt": "1"})  # fmt: skip
#: s: short enough for a test, long enough for a loaded machine's loopback
READ_TIMEOUT_S = 0.5

SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip


def sse_chunk(data: dict[str, Any] | str) -> bytes:
    """One ``data:`` event as one HTTP chunk."""
    text = data if isinstance(data, str) else json.dumps(data)
    event = f"data: {text}\n\n".encode()
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"


def token(text: str, finish: str | None = None) -> bytes:
    return sse_chunk({"id": "c1", "model": "m", "choices": [
        {"index": 0, "delta": {"content": text}, "finish_reason": finish}]})  # fmt: skip


USAGE = sse_chunk({"id": "c1", "model": "m", "choices": [],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 2}})  # fmt: skip
STREAM = token("Hello") + token(" there", "stop") + USAGE + sse_chunk("[DONE]") + b"0\r\n\r\n"


def response(status: int, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status} X", "content-type: application/json",
            f"content-length: {len(body)}", *headers]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass
class Seen:
    """One request as the server read it."""

    line: str
    headers: dict[str, str]
    body: dict[str, Any]


Behaviour = Callable[[asyncio.StreamWriter, Seen], Awaitable[None]]


@dataclass
class Wire:
    """A loopback HTTP/1.1 server doing ``behaviour`` with every request it reads."""

    behaviour: Behaviour
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *rest = head.decode().split("\r\n")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (h.partition(":") for h in rest if h)}  # fmt: skip
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                seen = Seen(line, headers, json.loads(body) if body else {})
                self.seen.append(seen)
                await self.behaviour(writer, seen)
                if writer.transport.is_closing():
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(behaviour: Behaviour) -> AsyncIterator[Wire]:
    wire = Wire(behaviour)
    wire.server = await asyncio.start_server(wire._handle, "127.0.0.1", 0)
    try:
        yield wire
    finally:
        wire.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(wire.server.wait_closed(), 2.0)


async def run(
    transport: str, url: str, *, azure: AzureTarget | None = None
) -> tuple[list[Any], ProviderError | None]:
    """One streamed call: (chunks received, the chainrun error or None)."""
    provider = OpenAICompatProvider(
        "p", None if azure else url, "TEST_KEY", connect_timeout_s=2.0,
        read_timeout_s=READ_TIMEOUT_S, transport=transport, azure=azure,  # type: ignore[arg-type]
    )  # fmt: skip
    chunks: list[Any] = []
    try:
        async with asyncio.timeout(10):
            async for c in provider.chunks(REQUEST):
                chunks.append(c)
    except ProviderError as e:
        return chunks, e
    finally:
        await provider.aclose()
    return chunks, None


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_KEY", "sk-test")


async def both(url: str, **kw: Any) -> dict[str, tuple[list[Any], ProviderError | None]]:
    return {t: await run(t, url, **kw) for t in TRANSPORTS}


def same_error(results: dict[str, tuple[list[Any], ProviderError | None]]) -> ProviderError:
    """The error both transports gave, checked to be the same in type, kind and text
    (the text up to the client's own wording of the cause, after the first colon pair)."""
    errors = {t: e for t, (_, e) in results.items()}
    first = errors["httpx"]
    assert first is not None, results
    for t, e in errors.items():
        assert type(e) is type(first), (t, e, first)
        assert e.error_type == first.error_type
        assert getattr(e, "status", None) == getattr(first, "status", None)
        assert getattr(e, "retry_after_s", None) == getattr(first, "retry_after_s", None)
    return first


# -- before the stream ------------------------------------------------------------------


async def test_a_refused_connection_is_unavailable() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    results = await both(url)
    err = same_error(results)
    assert isinstance(err, ProviderUnavailable) and err.error_type == "unavailable"
    assert {str(e) for _, e in results.values()} == {f"cannot reach provider 'p' at {url}"}


async def test_closed_before_answering_is_unavailable_after_one_resend() -> None:
    async def close(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.close()

    for transport in TRANSPORTS:
        async with serving(close) as wire:
            _, err = await run(transport, wire.url)
            assert isinstance(err, ProviderUnavailable), (transport, err)
            # the resend of a request a reused connection may have lost, and no other
            assert len(wire.seen) == 2, transport


async def test_a_stall_before_the_headers_is_a_timeout() -> None:
    async def stall(writer: asyncio.StreamWriter, seen: Seen) -> None:
        await asyncio.sleep(30)

    async with serving(stall) as wire:
        err = same_error(await both(wire.url))
        assert len(wire.seen) == 2  # once per transport: a timeout is not resent
    assert isinstance(err, ProviderTimeout) and err.error_type == "timeout"


@pytest.mark.parametrize("form", ["seconds", "ms"])
async def test_429_keeps_retry_after(form: str) -> None:
    header = "retry-after: 7" if form == "seconds" else "retry-after-ms: 1500"
    body = json.dumps({"error": {"message": "slow down", "type": "requests",
                                 "code": "rate_limit_exceeded"}}).encode()  # fmt: skip

    async def limited(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(response(429, body, header))

    async with serving(limited) as wire:
        results = await both(wire.url)
        assert len(wire.seen) == 2  # once per transport: no SDK retry
    err = same_error(results)
    assert isinstance(err, ProviderStatusError) and not isinstance(err, RequestRejected)
    assert err.error_type == "http_429"
    assert err.retry_after_s == (7.0 if form == "seconds" else 1.5)
    assert {str(e) for _, e in results.values()} == {"p: HTTP 429: Error code: 429 - slow down"}


@pytest.mark.parametrize(
    "status, body",
    [(500, b'{"error": {"message": "boom", "type": "server_error"}}'),
     (503, b"upstream overloaded"),
     (502, b"")],
)  # fmt: skip
async def test_5xx_is_a_status_error_with_the_sdks_message(status: int, body: bytes) -> None:
    async def failing(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(response(status, body, "retry-after: 2"))

    async with serving(failing) as wire:
        results = await both(wire.url)
    err = same_error(results)
    assert type(err) is ProviderStatusError and err.error_type == f"http_{status}"
    assert err.retry_after_s == 2.0
    assert len({str(e) for _, e in results.values()}) == 1, results


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_refusals_are_request_rejected_alike(status: int) -> None:
    error = {"message": "Unsupported value: 'reasoning_effort' does not support 'minimal' "
             "with this model. Supported values are: 'low', 'medium', and 'high'.",
             "type": "invalid_request_error", "param": "reasoning_effort",
             "code": "unsupported_value"}  # fmt: skip

    async def refuse(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(response(status, json.dumps({"error": error}).encode()))

    async with serving(refuse) as wire:
        results = await both(wire.url)
    err = same_error(results)
    assert isinstance(err, RequestRejected) and err.status == status
    got = {(e.param, e.value, e.accepted, e.code, str(e))
           for _, e in results.values() if isinstance(e, RequestRejected)}  # fmt: skip
    assert got == {("reasoning_effort", "minimal", ("low", "medium", "high"),
                    "unsupported_value", str(err))}  # fmt: skip


# -- during the stream ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_connection_dropped_mid_stream_is_connection_lost(how: str) -> None:
    async def drop(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(SSE_HEAD + token("Hel"))
        await writer.drain()
        await asyncio.sleep(0.05)
        if how == "reset":
            writer.transport.abort()
        else:
            writer.close()

    async with serving(drop) as wire:
        results = await both(wire.url)
        assert len(wire.seen) == 2  # once per transport: a broken stream is not resent
    err = same_error(results)
    assert isinstance(err, ProviderConnectionLost) and err.error_type == "connection_lost"
    for transport, (chunks, _) in results.items():  # what came before the drop was kept
        assert [c.content for c in chunks] == ["Hel"], transport


async def test_a_stall_mid_stream_is_a_timeout() -> None:
    async def stall(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(SSE_HEAD + token("Hel"))
        await writer.drain()
        await asyncio.sleep(30)

    async with serving(stall) as wire:
        results = await both(wire.url)
    err = same_error(results)
    assert isinstance(err, ProviderTimeout) and err.error_type == "timeout"
    assert "mid-stream" in str(err)
    for transport, (chunks, _) in results.items():
        assert [c.content for c in chunks] == ["Hel"], transport


# -- what is sent, and what is kept -----------------------------------------------------


async def test_both_transports_send_the_same_request_and_keep_the_same_chunks() -> None:
    async def answer(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(SSE_HEAD + STREAM)

    async with serving(answer) as wire:
        results = await both(wire.url)
        assert wire.connections == 2  # one per transport's client
    first, second = wire.seen
    assert first.line == second.line == "POST /v1/chat/completions HTTP/1.1"
    assert first.body == second.body
    assert first.body["reasoning_effort"] == "minimal" and first.body["stream"] is True
    for name in ("authorization", "x-chainrun-attempt", "content-type", "accept"):
        assert first.headers.get(name) == second.headers.get(name), name
    assert second.headers["authorization"] == "Bearer sk-test"
    (a, ea), (b, eb) = results["httpx"], results["aiohttp"]
    assert ea is None and eb is None
    assert [(c.content, c.finish_reason, c.usage) for c in a] == [
        (c.content, c.finish_reason, c.usage) for c in b
    ]
    assert b[-1].usage is not None and b[-1].usage.output_tokens == 2
    assert b[-1].usage.reasoning_tokens is None  # not sent: unknown, not 0


@pytest.mark.parametrize("deployment", [None, "dep-1"])
async def test_azure_urls_and_key_are_the_same_on_both(deployment: str | None) -> None:
    async def answer(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(SSE_HEAD + STREAM)

    async with serving(answer) as wire:
        endpoint = wire.url.removesuffix("/v1")
        azure = AzureTarget(endpoint=endpoint, api_version="2024-10-21", deployment=deployment)
        results = await both(wire.url, azure=azure)
    assert all(e is None for _, e in results.values()), results
    first, second = wire.seen
    assert first.line == second.line
    assert first.line == (f"POST /openai/deployments/{deployment or 'm'}/chat/completions"
                          "?api-version=2024-10-21 HTTP/1.1")  # fmt: skip
    assert first.headers["api-key"] == second.headers["api-key"] == "sk-test"


async def test_aiohttp_reuses_a_connection_after_done_and_closes_a_stream_left_early() -> None:
    async def answer(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(SSE_HEAD + token("Hel"))
        await writer.drain()
        await asyncio.sleep(0.1)  # the rest later: a stream left after "Hel" is left mid-body
        writer.write(STREAM)

    async with serving(answer) as wire:
        provider = OpenAICompatProvider("p", wire.url, transport="aiohttp")
        try:
            for _ in range(3):
                assert [c async for c in provider.chunks(REQUEST)]
            assert wire.connections == 1  # read to its end: the connection was reused
            async with contextlib.aclosing(provider.chunks(REQUEST)) as stream:
                async for _ in stream:
                    break  # a loser: left after its first chunk
            assert [c async for c in provider.chunks(REQUEST)]
            assert wire.connections == 2  # the one left early was closed, not reused
        finally:
            await provider.aclose()


def test_aiohttp_takes_no_httpx_client() -> None:
    import httpx2

    with pytest.raises(ValueError, match="transport 'aiohttp' takes none"):
        OpenAICompatProvider("p", "http://127.0.0.1:9/v1", http_client=httpx2.AsyncClient(),
                             transport="aiohttp")  # fmt: skip


@pytest.mark.parametrize("framing", ["split_crlf", "event_over_two_chunks", "close_delimited"])
async def test_odd_framings_give_the_same_whole_stream(framing: str) -> None:
    """An HTTP chunk's end arriving after its data, an SSE event over two HTTP chunks,
    and a body ended by closing the connection (no chunked coding) all parse whole."""
    body = b"".join(f"data: {json.dumps(d)}\n\n".encode() for d in (
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hi"},
                                                "finish_reason": "stop"}]},
        {"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 5,
                                                          "completion_tokens": 1}},
    )) + b"data: [DONE]\n\n"  # fmt: skip

    async def send(writer: asyncio.StreamWriter, seen: Seen) -> None:
        async def part(data: bytes) -> None:
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(0.02)

        if framing == "close_delimited":
            await part(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                       b"connection: close\r\n\r\n")  # fmt: skip
            for i in range(0, len(body), 40):
                await part(body[i : i + 40])
            writer.close()
            return
        await part(SSE_HEAD)
        pieces = [body] if framing == "split_crlf" else [body[:30], body[30:]]
        for p in pieces:
            await part(f"{len(p):x}\r\n".encode() + p)
            await part(b"\r\n")  # the chunk's end in a packet of its own
        await part(b"0\r\n\r\n")

    async with serving(send) as wire:
        results = await both(wire.url)
    got = {t: [(c.content, c.finish_reason, c.usage) for c in chunks]
           for t, (chunks, e) in results.items() if e is None}  # fmt: skip
    assert set(got) == set(TRANSPORTS), results
    assert got["aiohttp"] == got["httpx"] and got["httpx"][0][:2] == ("Hi", "stop")
    assert got["httpx"][-1][2] is not None and got["httpx"][-1][2].output_tokens == 1


def test_the_config_chooses_the_transport() -> None:
    from chainrun.config import config_from_dict
    from chainrun.config.loading import config_from_snapshot
    from chainrun.providers.config import DEFAULT_TRANSPORT

    cfg = config_from_dict({"providers": {"a": {"base_url": "http://127.0.0.1:9/v1"},
                                          "h": {"base_url": "http://127.0.0.1:9/v1",
                                                "transport": "httpx"}}})  # fmt: skip
    assert cfg.providers["a"].transport == DEFAULT_TRANSPORT == "aiohttp"
    assert cfg.providers["h"].transport == "httpx"
    assert OpenAICompatProvider("p", "http://127.0.0.1:9/v1").transport == DEFAULT_TRANSPORT
    # the setting is the Chat Completions streams' (the Responses API always uses httpx):
    # on api = "responses" it is accepted and kept, so a run's stored config, which names
    # every setting, loads again (it was refused there)
    responses = {"base_url": "http://127.0.0.1:9/v1", "api": "responses"}
    r = config_from_dict({"providers": {"r": {**responses, "transport": "aiohttp"}}})
    assert config_from_snapshot(r.snapshot()).providers["r"].api == "responses"


async def test_open_provider_builds_the_configured_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chainrun.config import config_from_dict
    from chainrun.providers.factory import open_provider

    models = b'{"object": "list", "data": []}'

    async def answer(writer: asyncio.StreamWriter, seen: Seen) -> None:
        if seen.line.startswith("GET"):
            writer.write(response(200, models))
        else:
            writer.write(SSE_HEAD + STREAM)

    async with serving(answer) as wire:
        for transport in TRANSPORTS:
            cfg = config_from_dict({"providers": {"p": {"base_url": wire.url,
                                                        "transport": transport}}})  # fmt: skip
            provider = await open_provider("p", cfg.providers["p"])
            try:
                assert isinstance(provider, OpenAICompatProvider)
                assert provider.transport == transport
                assert [c.content async for c in provider.chunks(REQUEST)][:2] == [
                    "Hello", " there"]  # fmt: skip
            finally:
                await provider.aclose()
    assert [s.line.split()[0] for s in wire.seen] == ["GET", "POST"] * 2


async def test_a_repointed_provider_sends_its_next_stream_to_the_new_server() -> None:
    async def answer(writer: asyncio.StreamWriter, seen: Seen) -> None:
        writer.write(SSE_HEAD + STREAM)

    async with serving(answer) as old, serving(answer) as new:
        for transport in TRANSPORTS:
            provider = OpenAICompatProvider("p", old.url, transport=transport)  # type: ignore[arg-type]
            try:
                assert [c async for c in provider.chunks(REQUEST)]
                provider.repoint(new.url)
                assert [c async for c in provider.chunks(REQUEST)]
            finally:
                await provider.aclose()
        assert len(old.seen) == len(new.seen) == 2  # one per transport on each
