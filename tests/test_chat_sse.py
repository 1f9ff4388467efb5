"""Chat Completions stream bytes parsed straight into chunks (chainrun.providers.chat_sse),
checked against the ``openai`` client's own path (its SSE decoder, ``ChatCompletionChunk``
models, then ``normalise_chunk``) on the same bytes, split every way."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx2
import openai
import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk

from chainrun.errors import ContextLengthExceeded, MalformedStream, ProviderError, StreamError
from chainrun.providers import ChatRequest, ChatStream, OpenAICompatProvider
from chainrun.providers.chat_sse import DONE, ChatSSEParser, chunk_from_dict
from chainrun.providers.openai_client import _ErrorFieldDecoder, map_openai_error
from chainrun.providers.openai_compat import normalise_chunk
from chainrun.timing import Chunk, Usage

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gemma"}


def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    return f"data: {json.dumps({**HEAD, 'choices': choices, **extra})}\n\n".encode()


def delta(finish: str | None = None, **d: Any) -> dict[str, Any]:
    return {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}


# What servers send: llama.cpp's role-only first frame, reasoning_content before content,
# usage on its own chunk and on the finish chunk, timings, a comment, an id line.
STREAMS: dict[str, bytes] = {
    "llama.cpp": b"".join([
        frame([delta(role="assistant", content=None)]),
        frame([delta(reasoning_content="let me think")]),
        frame([delta(content="Hello")]),
        frame([delta(content=" w\u00f6rld \U0001f600")]),
        frame([delta("stop")]),
        frame([], usage={"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14,
                         "completion_tokens_details": {"reasoning_tokens": 3},
                         "prompt_tokens_details": {"cached_tokens": 2}},
              timings={"prompt_ms": 1.5, "predicted_ms": 12.25}),
        b"data: [DONE]\n\n",
    ]),
    "usage on the finish chunk, reasoning, comments, CRLF": b"".join([
        b": keep-alive\r\n\r\n",
        frame([delta(role="assistant", reasoning="hm")]).replace(b"\n", b"\r\n"),
        b"id: 7\n" + frame([delta(content="ok")]),
        frame([delta("length", content="!")], usage={"prompt_tokens": 1, "completion_tokens": 2}),
        b"data: [DONE]\n\n",
    ]),
    "no usage (unknown, never 0), non-text reasoning, CR only": b"".join([
        frame([delta(content="a", reasoning=3)]).replace(b"\n", b"\r"),
        frame([delta("stop", content="b")], usage=None),
        b"data: [DONE]\r\n\r\n",
    ]),
}


def sdk_chunks(parts: list[bytes]) -> list[Chunk]:
    """The chunks the SDK path makes of these bytes (without byte counts)."""
    out = []
    for sse in _ErrorFieldDecoder().iter_bytes(iter(parts)):
        if sse.data.startswith("[DONE]"):
            break
        raw = construct_type(type_=ChatCompletionChunk, value=sse.json())
        out.append(normalise_chunk(raw))
    return out


def parsed(parts: list[bytes]) -> list[Chunk]:
    parser = ChatSSEParser("p")
    out: list[Chunk] = []
    for part in parts:
        for item in parser.feed(part):
            if item is DONE:
                return out
            out.append(item)
    return out


def splits(data: bytes, rng: random.Random) -> list[list[bytes]]:
    """The bytes whole, one at a time, and at random cut points."""
    ways = [[data], [data[i : i + 1] for i in range(len(data))]]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 12)))
        ways.append([data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)])
    return ways


@pytest.mark.parametrize("name", list(STREAMS))
def test_the_parser_makes_the_sdk_paths_chunks_however_the_bytes_are_split(name: str) -> None:
    data = STREAMS[name]
    expected = sdk_chunks([data])
    assert expected and any(c.has_token for c in expected)
    for parts in splits(data, random.Random(name)):
        assert parsed(parts) == expected


def test_fields_are_kept_exactly() -> None:
    chunks = parsed([STREAMS["llama.cpp"]])
    assert [c.role for c in chunks][:1] == ["assistant"] and chunks[0].content is None
    assert chunks[0].has_token is False  # a role-only frame is no first token
    assert chunks[1].reasoning == "let me think" and chunks[3].content == " w\u00f6rld \U0001f600"
    assert chunks[-1].usage == Usage(input_tokens=5, output_tokens=9, reasoning_tokens=3,
                                     cached_input_tokens=2)  # fmt: skip
    assert chunks[-1].server_timings == {"prompt_ms": 1.5, "predicted_ms": 12.25}
    assert chunks[-2].finish_reason == "stop" and chunks[-1].response_id == "chatcmpl-1"
    unknown = parsed([STREAMS["usage on the finish chunk, reasoning, comments, CRLF"]])[-1]
    assert unknown.usage == Usage(input_tokens=1, output_tokens=2)  # the rest unknown: None
    assert chunk_from_dict({"choices": [], "usage": None}).usage is None


def test_the_first_chunk_of_a_read_carries_its_bytes() -> None:
    two = frame([delta(content="a")]) + frame([delta(content="b")])
    parser = ChatSSEParser("p")
    assert parser.feed(two[:10], 10) == []  # no event complete yet
    got = parser.feed(two[10:], len(two))
    assert [c.nbytes for c in got] == [len(two), 0]
    assert parser.feed(b"data: [DONE]\n\n") == [DONE]


def test_multi_line_data_is_joined_and_an_event_without_data_is_not_dispatched() -> None:
    body = b'event: ping\nid: 3\n\ndata: {"choices": [{"delta":\ndata: {"content": "x"}}]}\n\n'
    assert [c.content for c in parsed([body])] == ["x"]


def sdk_error(data: bytes) -> ProviderError:
    """The chainrun error the SDK path raises for these bytes."""
    stream_events = _ErrorFieldDecoder().iter_bytes(iter([data]))
    try:
        for sse in stream_events:
            body = sse.json()
            if isinstance(body, dict) and body.get("error"):
                error = body["error"]
                message = error.get("message") if isinstance(error, dict) else None
                if not message or not isinstance(message, str):
                    message = "An error occurred during streaming"
                request = httpx2.Request("POST", "http://x.test/v1/chat/completions")
                raise openai.APIError(message, request, body=error)
    except openai.APIError as e:
        return map_openai_error(e, name="p", where="x", streaming=True)
    raise AssertionError("no error")


@pytest.mark.parametrize(
    "data",
    [
        # llama-server: the non-standard error field, then [DONE]
        b'error: {"code": 400, "message": "the request exceeds the available context size"}'
        b"\n\ndata: [DONE]\n\n",
        b'error: {"code": 500, "message": "boom"}\n\n',
        b"error: not json at all\n\n",
        b'error: {"code": 7}\n\n',
        b'data: {"error": {"message": "lab: overloaded", "code": 503, "type": "x"}}\n\n',
        b'data: {"error": {"code": "context_length_exceeded", "message": "too long"}}\n\n',
        b'data: {"error": {"message": 5}}\n\n',
        b'data: {"error": "a bare string"}\n\n',
    ],
)
def test_in_stream_errors_are_the_sdk_paths_errors(data: bytes) -> None:
    expected = sdk_error(data)
    with pytest.raises(StreamError) as info:
        parsed([frame([delta(content="a")]), data])
    assert type(info.value) is type(expected) and str(info.value) == str(expected)
    assert info.value.code == expected.code


def test_context_errors_are_context_length_exceeded() -> None:
    with pytest.raises(ContextLengthExceeded):
        parsed([b'error: {"code": 400, "message": "exceeds the available context size"}\n\n'])


@pytest.mark.parametrize(
    "data", [b"data: {not json\n\n", b"data: [1, 2]\n\n", b'data: "\xff\xfe"\n\n', b"data:\n\n"]
)
def test_data_that_is_no_json_object_is_a_malformed_stream(data: bytes) -> None:
    with pytest.raises(MalformedStream, match="malformed stream line"):
        parsed([frame([delta(content="a")]), data])


# ------------------------------------------------------- through the provider, over HTTP


def provider_over(body_parts: list[bytes], *, sdk: bool) -> OpenAICompatProvider:
    async def stream() -> Any:
        for part in body_parts:
            yield part

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=stream()
        )

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    provider = OpenAICompatProvider("p", "http://chat.test/v1", http_client=http)
    provider.sdk_sse = sdk
    return provider


REQ = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])


async def collect(provider: OpenAICompatProvider) -> ChatStream:
    s = ChatStream(provider, REQ, pump=False)
    try:
        await s.collect()
    finally:
        await s.aclose()
        await provider.aclose()
    return s


async def test_the_provider_gives_the_sdk_paths_chunks_and_byte_counts() -> None:
    data = STREAMS["llama.cpp"]
    parts = [data[i : i + 37] for i in range(0, len(data), 37)]
    ours, sdk = await collect(provider_over(parts, sdk=False)), await collect(
        provider_over(parts, sdk=True)
    )
    for attr in ("text", "reasoning", "finish_reason", "usage", "model", "response_id",
                 "server_timings", "n_chunks", "nbytes"):  # fmt: skip
        assert getattr(ours.timer, attr) == getattr(sdk.timer, attr), attr
    assert ours.timer.text == "Hello w\u00f6rld \U0001f600" and ours.timer.ttft_ms is not None


async def test_the_provider_maps_in_stream_errors_and_malformed_data() -> None:
    head = frame([delta(content="a")])
    for tail, kind in (
        (b'error: {"code": 400, "message": "exceeds the available context size"}\n\n',
         ContextLengthExceeded),
        (b'data: {"error": {"message": "lab: bad", "code": 400}}\n\n', StreamError),
        (b"data: {not json\n\n", MalformedStream),
    ):  # fmt: skip
        for sdk in (False, True):
            s = ChatStream(provider_over([head, tail], sdk=sdk), REQ)
            with pytest.raises(kind):
                await s.collect()
            await s.aclose()
            await s.provider.aclose()  # type: ignore[attr-defined]
            assert s.timer.text == "a"  # what arrived before the error is kept


async def test_the_request_is_the_one_chat_completions_create_sends() -> None:
    """The body, path and headers of the parser's request equal those of
    ``chat.completions.create`` (the SDK path) for a request using every parameter."""
    seen: dict[bool, httpx2.Request] = {}
    done = b"data: [DONE]\n\n"
    full = ChatRequest(
        model="m", messages=[{"role": "system", "content": "be brief"},
                             {"role": "user", "content": "hi"}],
        max_output_tokens=7, temperature=0.2, reasoning_effort="low", seed=3, stop=["\n"],
        json_schema={"type": "object"}, headers={"x-chainrun-attempt": "2"},
    )  # fmt: skip
    for sdk in (False, True):

        def handler(request: httpx2.Request, sdk: bool = sdk) -> httpx2.Response:
            seen[sdk] = request
            return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                                   content=done)  # fmt: skip

        http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
        provider = OpenAICompatProvider("p", "http://chat.test/v1", http_client=http)
        provider.sdk_sse = sdk
        s = ChatStream(provider, full, pump=False)
        with pytest.raises(ProviderError):  # [DONE] without a finish_reason: truncated
            await s.collect()
        await s.aclose()
        await provider.aclose()
    ours, sdk_request = seen[False], seen[True]
    assert ours.url == sdk_request.url and ours.method == sdk_request.method
    assert json.loads(ours.content) == json.loads(sdk_request.content)
    assert ours.headers["x-chainrun-attempt"] == "2"
    skip = {"x-stainless-retry-count", "x-stainless-read-timeout", "content-length"}
    assert {k: v for k, v in ours.headers.items() if k not in skip} == {
        k: v for k, v in sdk_request.headers.items() if k not in skip
    }


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        # DeepSeek: top-level hit/miss counts, no prompt_tokens_details
        ({"prompt_tokens": 100, "completion_tokens": 5, "prompt_cache_hit_tokens": 64,
          "prompt_cache_miss_tokens": 36}, 64),
        # both: OpenAI's nested field wins
        ({"prompt_tokens": 100, "completion_tokens": 5, "prompt_cache_hit_tokens": 64,
          "prompt_tokens_details": {"cached_tokens": 60}}, 60),
        # neither: unknown, never 0
        ({"prompt_tokens": 100, "completion_tokens": 5}, None),
    ],
)
def test_cached_tokens_as_each_server_reports_them(
    usage: dict[str, Any], cached: int | None
) -> None:
    """The same usage read by both transports (chainrun's SSE parser and the SDK's types)."""
    frame = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [], "usage": usage}  # fmt: skip
    ours = chunk_from_dict(frame)
    sdk = normalise_chunk(construct_type(type_=ChatCompletionChunk, value=frame))
    for chunk in (ours, sdk):
        assert chunk.usage == Usage(input_tokens=100, output_tokens=5, reasoning_tokens=None,
                                    cached_input_tokens=cached)  # fmt: skip
