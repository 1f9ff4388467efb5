"""An in-process fake provider: a provider like any other, with scripted replies.

Used by the unit tests (which never touch the network) and usable by library users
to test their own chains. Each reply is scripted as a :class:`FakeReply`, either
fixed or computed from the request by a function. A request's ``stop`` sequences end
the scripted text as a server's would: before the first one it holds (the sequence
itself is not sent), with finish reason ``stop`` (OpenAI API reference, Chat
Completions, ``stop``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from chainrun.errors import ProviderError
from chainrun.providers.base import ChatRequest
from chainrun.timing import Chunk, ToolCallDelta, Usage


def words_in_sentences(n: int, per: int = 5) -> str:
    """``n`` words ``w0 w1 ...`` in sentences of ``per`` words, each ending in ``!``.

    A long answer for tests that stop or cut it mid-way: the default chain's grounding
    check releases whole sentences, so words with no sentence end would reach the shopper
    only once the answer is complete; ``!`` is no stop sequence of the default chain.
    """
    return " ".join(f"w{i}" + ("!" if i % per == per - 1 else "") for i in range(n))


@dataclass
class FakeReply:
    """How the fake answers one request.

    Args:
        text: the answer, streamed word by word (each word one chunk).
        ttft_s: delay before the first token, in s.
        gap_s: delay between chunks, in s.
        reasoning: reasoning text streamed (as ``reasoning_content``) before the answer.
        role_only_first: send a role-only first frame with no content (like llama.cpp).
        usage: send the usage chunk (token counts = number of chunks).
        finish_reason: None = the stream ends without one (truncated).
        error: raised instead of answering (after ``ttft_s``).
        tool_calls: answer with these tool calls instead of text: ``{"id", "name",
            "arguments"}`` each (arguments: JSON text, streamed in two pieces after a
            first fragment with the id and name; finish reason ``tool_calls``).
    """

    text: str = "ok"
    ttft_s: float = 0.0
    gap_s: float = 0.0
    reasoning: str | None = None
    role_only_first: bool = True
    usage: bool = True
    finish_reason: str | None = "stop"
    error: Exception | None = None
    tool_calls: list[dict[str, str]] | None = None


Script = FakeReply | Callable[[ChatRequest], FakeReply]


def _until_stop(reply: FakeReply, stop: list[str] | None) -> str:
    """``reply.text`` cut before the first of the ``stop`` sequences it holds."""
    cuts = [i for s in stop or () if s and (i := reply.text.find(s)) >= 0]
    return reply.text[: min(cuts)] if cuts else reply.text


@dataclass
class FakeProvider:
    """A provider whose replies are scripted; records every request it saw.

    ``closed_early`` counts streams closed by the consumer before their end
    (what a cancelled hedging loser looks like).
    """

    name: str = "fake"
    script: Script = field(default_factory=FakeReply)
    server_address: str | None = None
    requests: list[ChatRequest] = field(default_factory=list)
    closed_early: int = 0
    finished: int = 0

    def _reply(self, request: ChatRequest) -> FakeReply:
        return self.script(request) if callable(self.script) else self.script

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        self.requests.append(request)
        reply = self._reply(request)
        completed = False
        try:
            if reply.role_only_first:
                yield Chunk(role="assistant", content=None, model="fake-model", nbytes=60)
            await asyncio.sleep(reply.ttft_s)
            if reply.error is not None:
                raise reply.error
            n = 0
            for i, word in enumerate((reply.reasoning or "").split()):
                if i:
                    await asyncio.sleep(reply.gap_s)
                yield Chunk(reasoning=word + " ", nbytes=40 + len(word))
                n += 1
            if reply.tool_calls is not None:
                async for chunk in _tool_call_chunks(reply, n):
                    yield chunk
                    n += 1
                words = []
            else:
                words = _until_stop(reply, request.stop).split(" ")
            for i, word in enumerate(words):
                if i or n:
                    await asyncio.sleep(reply.gap_s)
                last = i == len(words) - 1
                yield Chunk(
                    content=word + ("" if last else " "),
                    finish_reason=reply.finish_reason if last else None,
                    nbytes=40 + len(word),
                )
                n += 1
            if reply.usage:
                reasoning_n = len((reply.reasoning or "").split())
                yield Chunk(
                    usage=Usage(
                        input_tokens=sum(len(str(m.get("content") or "").split())
                                     for m in request.messages),
                        output_tokens=n,
                        reasoning_tokens=reasoning_n,
                        cached_input_tokens=0,
                    ),
                    nbytes=80,
                )
            completed = True
        finally:
            if completed:
                self.finished += 1
            else:
                self.closed_early += 1

    async def aclose(self) -> None:
        return None


async def _tool_call_chunks(reply: FakeReply, sent: int) -> AsyncIterator[Chunk]:
    """A reply's tool calls as chunks: per call a first piece (id, name), then its
    arguments in two pieces; the last chunk carries finish reason ``tool_calls``."""
    calls = reply.tool_calls or []
    pieces: list[ToolCallDelta] = []
    for i, call in enumerate(calls):
        args = call.get("arguments", "")
        half = len(args) // 2
        pieces.append(ToolCallDelta(index=i, id=call.get("id"), name=call.get("name")))
        pieces += [ToolCallDelta(index=i, arguments=a) for a in (args[:half], args[half:]) if a]
    for k, piece in enumerate(pieces):
        if k or sent:
            await asyncio.sleep(reply.gap_s)
        last = k == len(pieces) - 1
        finish = "tool_calls" if last and reply.finish_reason else None
        yield Chunk(tool_calls=(piece,), nbytes=50 + len(piece.arguments), finish_reason=finish)


def failing(message: str = "fake failure") -> FakeReply:
    """A reply that raises a :class:`ProviderError`."""
    return FakeReply(error=ProviderError(message))
