"""ChatStream read by a pump task or, for a whole answer, in the caller's own task
(``pump=False``): the same measurements either way (stamped at arrival, every gap,
usage kept, unknown stays None); the per-chunk helpers give what the dataclass does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from openai.types.chat import ChatCompletionChunk

from chainrun.errors import StreamTruncated
from chainrun.providers import ChatRequest, ChatStream
from chainrun.providers.openai_compat import normalise_chunk
from chainrun.timing import Chunk, Usage, make_chunk

REQUEST = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])


class Scripted:
    """A provider that sends ``(pause_s, chunk)`` pairs; records whether it was closed."""

    name = "scripted"
    server_address = None

    def __init__(self, script: list[tuple[float, Chunk]]) -> None:
        self.script = script
        self.closed = False

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        try:
            for pause, chunk in self.script:
                await asyncio.sleep(pause)
                yield chunk
        finally:
            self.closed = True

    async def aclose(self) -> None:
        pass


USAGE = Usage(5, 3)


def script(finish: bool = True, usage: Usage | None = USAGE) -> list[tuple[float, Chunk]]:
    items = [
        (0.05, Chunk(role="assistant")),  # role-only: not the first token
        (0.05, Chunk(reasoning="think")),  # the first token (reasoning counts)
        (0.02, Chunk(content="a")),
        (0.02, Chunk(content="b")),
    ]
    if finish:
        items.append((0.0, Chunk(finish_reason="stop")))
    if usage is not None:
        items.append((0.0, Chunk(usage=usage)))
    return items


def loop_clock() -> float:
    return asyncio.get_running_loop().time()


@pytest.mark.parametrize("pump", [True, False])
async def test_a_whole_answer_measures_the_same_with_or_without_a_pump(pump: bool) -> None:
    provider = Scripted(script())
    s = ChatStream(provider, REQUEST, loop_clock, pump=pump)
    pumps = [t for t in asyncio.all_tasks() if t.get_name().startswith("chainrun-pump")]
    assert bool(pumps) is pump  # pump=False: no second task for the call
    await s.collect()
    await s.aclose()
    t = s.timer
    assert t.text == "ab" and t.reasoning == ["think"] and t.finish_reason == "stop"
    # the role-only frame is an event, no chunk (no gap before the first token)
    assert t.n_events == 6 and t.n_chunks == 5 and len(t.chunk_gaps_ms) == 4
    assert t.ttft_ms is not None and t.ttft_ms == pytest.approx(100, abs=40)  # at arrival
    assert t.chunk_gaps_ms[:2] == pytest.approx([20, 20], abs=15)
    assert t.usage == Usage(5, 3) and t.duration_ms is not None
    assert provider.closed and not t.truncated


async def test_without_a_pump_usage_unknown_stays_none_and_truncation_is_an_error() -> None:
    s = ChatStream(Scripted(script(finish=False, usage=None)), REQUEST, pump=False)
    with pytest.raises(StreamTruncated):
        await s.collect()
    await s.aclose()
    assert s.timer.usage is None and s.timer.truncated


async def test_cancelling_the_reading_task_closes_the_response() -> None:
    provider = Scripted([(0.0, Chunk(content="a")), (10.0, Chunk(content="never"))])
    s = ChatStream(provider, REQUEST, pump=False)
    reader = asyncio.ensure_future(s.collect())
    await asyncio.sleep(0.05)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert provider.closed and s.done and s.timer.text == "a" and s.timer.truncated


async def test_aclose_from_another_task_stops_a_reader_and_an_unread_stream() -> None:
    provider = Scripted([(0.0, Chunk(content="a")), (10.0, Chunk(content="never"))])
    s = ChatStream(provider, REQUEST, pump=False)
    reader = asyncio.ensure_future(s.collect())
    await asyncio.sleep(0.05)
    await asyncio.wait_for(s.aclose(), 2)
    assert provider.closed and reader.done()
    unread = ChatStream(Scripted(script()), REQUEST, pump=False)
    await unread.aclose()  # nothing was sent
    assert unread.done and unread.timer.n_chunks == 0 and unread.timer.ttft_ms is None


async def test_deltas_yield_what_arrived_before_and_after_the_call() -> None:
    s = ChatStream(Scripted(script()), REQUEST)
    await s.first_token()
    await asyncio.sleep(0.03)  # "a" arrives before anyone reads deltas
    got = [text async for text in s.deltas()]
    await s.aclose()
    assert got == ["a", "b"]
    late = ChatStream(Scripted(script()), REQUEST, pump=False)  # deltas start the reading
    assert [text async for text in late.deltas()] == ["a", "b"]
    await late.aclose()


def test_make_chunk_equals_the_dataclass() -> None:
    args = ("hi", "r", "assistant", "stop", Usage(1, 2, 0, None), "m", "id", None, 7)
    made, built = make_chunk(*args), Chunk(*args)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert make_chunk(*args[:7], {"a": 1}, 7) == Chunk(*args[:7], {"a": 1}, 7)
    assert made.has_token
    with pytest.raises(AttributeError):
        made.content = "x"  # type: ignore[misc]  # still frozen


def test_normalise_chunk_keeps_reasoning_usage_and_timings() -> None:
    raw = ChatCompletionChunk.model_validate({
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"reasoning_content": "why"}, "finish_reason": None}],
    })  # fmt: skip
    assert normalise_chunk(raw, 9) == Chunk(reasoning="why", model="m", response_id="c1", nbytes=9)
    last = ChatCompletionChunk.model_validate({
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
        "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10,
                  "completion_tokens_details": {"reasoning_tokens": 2}},
        "timings": {"predicted_ms": 12.5},
    })  # fmt: skip
    chunk = normalise_chunk(last)
    assert chunk.usage == Usage(input_tokens=4, output_tokens=6, reasoning_tokens=2)
    assert chunk.server_timings == {"predicted_ms": 12.5} and not chunk.has_token
    plain = ChatCompletionChunk.model_validate({
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x", "reasoning": 3}, "finish_reason": None}],
    })  # fmt: skip
    assert normalise_chunk(plain).reasoning is None  # not text: ignored, as before
