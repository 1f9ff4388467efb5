"""``chainrun serve`` input: the library's message rule on both faces (a lone surrogate is a
400 naming the field, never a 500 and a lost turn), a model that streams a lone surrogate,
the request body limit (413), strict booleans, and the one error shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import reply_by_step
from serve_helpers import JSON_TYPE, chat, fake_chain, n_turns, serving, sse

from chainrun.config import ChainConfig
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.serve.openai_face import InvalidRequest, parse_completion_request
from chainrun.serve.settings import MAX_HEAD_BYTES

MODEL = "chainrun-shop"


@pytest.fixture
def file_store(tmp_path: Path) -> Store:
    """A log file: turn writes go through the writer thread, as under ``chainrun serve``."""
    s = Store.open(tmp_path / "serve.db")
    yield s
    s.close()


factory = fake_chain


async def test_a_lone_surrogate_is_a_400_naming_the_field_on_both_faces(
    config: ChainConfig, file_store: Store, fake: FakeProvider
) -> None:
    """What a browser's JSON.stringify sends for a cut emoji: "\\ud800" (a JSON escape)."""
    async with (
        serving(factory(config, file_store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        plain = await client.post("/chat", content=b'{"message": "a\\ud800b"}',
                                  headers=JSON_TYPE)
        conv = await client.post(
            "/chat", content=b'{"message": "hi", "conversation_id": "\\udc00"}',
            headers=JSON_TYPE,
        )
        oai = await client.post("/v1/chat/completions", headers=JSON_TYPE, content=(
            b'{"model": "chainrun-shop", "messages": [{"role": "user", "content": "a\\ud800b"}]}'))
        events = await chat(client, "still fine \U0001f600")  # the server goes on serving
    assert plain.status_code == 400, plain.text
    assert plain.json()["error"]["param"] == "message"
    assert "lone UTF-16 surrogate (U+D800)" in plain.json()["error"]["message"]
    assert conv.status_code == 400 and conv.json()["error"]["param"] == "conversation_id"
    assert oai.status_code == 400, oai.text
    err = oai.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "messages"
    assert "lone UTF-16 surrogate" in err["message"]
    assert events[-1][0] == "turn" and events[-1][1]["status"] == "ok"
    await asyncio.sleep(0)
    assert n_turns(file_store) == 1  # only the good turn ran


async def test_a_model_streaming_a_lone_surrogate_is_served_and_logged(
    config: ChainConfig, file_store: Store
) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("half an emoji \ud83d here", ttft_s=0.001)}))  # fmt: skip
    async with (
        serving(factory(config, file_store, fake)) as (url, state),
        httpx.AsyncClient(base_url=url) as client,
    ):
        events = await chat(client, "hello")
        whole = await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hello"}]})  # fmt: skip
        async with client.stream("POST", "/v1/chat/completions", json={
            "model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}],
        }) as r:  # fmt: skip
            chunks = [data async for _, data in sse(r)]
        run_id = state.chain.run_id if state.chain else None
    turn = events[-1]
    assert turn[0] == "turn" and turn[1]["status"] == "ok"
    assert turn[1]["output"] == "half an emoji \ud83d here"  # as the model sent it (JSON-escaped)
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["message"]["content"] == "half an emoji \ud83d here"
    assert chunks[-1] == "[DONE]"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "stop"
    turns = file_store.turns(run_id)
    assert len(turns) == 3 and {t.status for t in turns} == {"ok"}
    assert turns[0].output == "half an emoji \ufffd here"  # logged, the surrogate as U+FFFD


async def test_a_content_length_over_the_limit_is_413_before_the_body_is_read(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    async with serving(factory(config, store, fake), max_body_bytes=1000) as (url, _):
        host, port = urlsplit(url).hostname, urlsplit(url).port
        for path in ("/chat", "/v1/chat/completions"):
            reader, writer = await asyncio.open_connection(host, port)
            # announces 300 MB and sends none of it: a server that read the body would wait
            writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                         f"\r\nContent-Length: {300 << 20}\r\n\r\n".encode())  # fmt: skip
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = json.loads(await asyncio.wait_for(reader.readexactly(length), 5))
            writer.close()
            assert head.startswith(b"HTTP/1.1 413 "), head
            assert body["error"]["code"] == "body_too_large", body
            assert "1000 bytes" in body["error"]["message"]
    assert store.db.table("turns").count == 0


async def test_a_chunked_body_stops_being_read_at_the_limit(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    async with serving(factory(config, store, fake), max_body_bytes=64 * 1024) as (url, _):
        reader, writer = await asyncio.open_connection(urlsplit(url).hostname, urlsplit(url).port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        piece = b"x" * 16 * 1024
        for _ in range(8):  # 128 KiB, twice the limit, and never the last (empty) chunk
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert store.db.table("turns").count == 0


async def test_a_body_under_the_limit_is_served(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    async with (
        serving(factory(config, store, fake), max_body_bytes=2000) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        ok = await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "x" * 1800}]})  # fmt: skip
        big = await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "x" * 2100}]})  # fmt: skip
    assert ok.status_code == 200, ok.text
    assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"stream_options": {"include_usage": "true"}}, "stream_options.include_usage"),
        ({"stream_options": "usage"}, "stream_options"),
        ({"n": True}, "n"),
    ],
)
def test_request_booleans_are_strict(extra: dict[str, object], param: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(InvalidRequest) as e:
        parse_completion_request(body, "m")
    assert e.value.param == param and e.value.status == 400


def test_null_and_real_booleans_are_taken() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert parse_completion_request({**base, "stream": None}, "m").stream is False
    req = parse_completion_request(
        {**base, "stream": True, "stream_options": {"include_usage": False}}, "m"
    )
    assert req.stream is True and req.include_usage is False


def test_the_serve_faces_take_the_library_message_limit() -> None:
    from chainrun.conversations.turn_input import MAX_MESSAGE_CHARS
    from chainrun.serve import chat as chat_face

    assert chat_face.MAX_MESSAGE_CHARS is MAX_MESSAGE_CHARS
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * (MAX_MESSAGE_CHARS + 1)}]}
    with pytest.raises(InvalidRequest, match="at most 8000 characters"):
        parse_completion_request(body, "m")


async def test_a_head_over_the_limit_is_431_as_it_arrives(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    """A header of 128 MB was read whole before anything looked at it: now the head stops
    being read past the limit, 431 in the error shape, and the server serves on."""
    async with serving(factory(config, store, fake)) as (url, _):
        host, port = urlsplit(url).hostname, urlsplit(url).port
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0

        async def send_forever() -> None:  # a header that never ends: only the limit stops it
            nonlocal sent
            with contextlib.suppress(ConnectionError):  # the server closed it
                while sent < 2000 * MAX_HEAD_BYTES:
                    writer.write(b"a" * 16384)
                    await writer.drain()
                    sent += 16384

        sending = asyncio.create_task(send_forever())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        body = json.loads(await asyncio.wait_for(reader.readexactly(length), 5))
        sending.cancel()
        writer.close()
        async with httpx.AsyncClient(base_url=url) as client:
            fine = await client.get("/healthz", headers={"X-Fine": "a" * 8000})
    assert head.startswith(b"HTTP/1.1 431 "), head
    assert body["error"]["code"] == "headers_too_large", body
    assert sent < 100 * MAX_HEAD_BYTES  # stopped near the limit (socket buffers aside)
    assert fine.status_code == 200
