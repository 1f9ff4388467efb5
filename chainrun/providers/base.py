"""The provider protocol and the stream every provider returns.

A provider turns a :class:`ChatRequest` into an async iterator of normalised
:class:`~chainrun.timing.Chunk` objects (its only job: wire format, auth, client
lifecycle). :class:`ChatStream` wraps that iterator the same way for every provider:
a *pump task* reads the chunks as they arrive and stamps them into a
:class:`~chainrun.timing.StreamTimer`, so timings are taken where the bytes arrive,
not where a (possibly slow) consumer reads them. Closing a ChatStream cancels the
pump, whose ``finally`` closes the HTTP response: the server stops generating.
A caller that only wants the whole answer (a step that does not stream) can make the
stream with ``pump=False`` and read it in its own task with :meth:`ChatStream.collect`:
the same loop, stamping each chunk as it arrives (that task does nothing else while
it waits), without a second task per call (chainrun's own cost per call).

Two timers of its own, besides the step's deadline (which the caller holds):
``first_token_timeout_s`` (no first content or reasoning token by then, counted from
the start of the call, so a server that never sends headers is caught too:
:class:`~chainrun.errors.FirstTokenTimeout`) and ``idle_timeout_s`` (after the first
token, a gap between chunks longer than this: :class:`~chainrun.errors.IdleTimeout`).
A healthy stream that pauses after its first token is never judged by the first-token
timer. Either timer closes the call and is recorded as the stream's ``error``.

Providers know nothing of hedging; the hedging engine knows nothing of providers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from types import AsyncGeneratorType
from typing import Any, Protocol

from chainrun.errors import (
    ChainrunError,
    FirstTokenTimeout,
    IdleTimeout,
    ProviderError,
    StreamTruncated,
)
from chainrun.providers.think import ReasoningInContent, ThinkSplitter
from chainrun.timing import Chunk, StreamTimer

Clock = Callable[[], float]


@dataclass(frozen=True)
class ChatRequest:
    """One model request, provider- and wire-format-neutral.

    ``max_output_tokens`` caps visible plus reasoning tokens (sent as
    ``max_completion_tokens`` on Chat Completions, ``max_output_tokens`` on the Responses
    API); ``headers`` are extra HTTP headers (request id, attempt).
    """

    model: str
    #: Chat Completions messages: ``{"role", "content"}``, plus an assistant message's
    #: ``tool_calls`` and ``{"role": "tool", "tool_call_id", "content"}`` results
    messages: list[dict[str, Any]]
    max_output_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: str | None = None
    #: Responses API only: ``reasoning.summary`` ("auto", "concise" or "detailed")
    reasoning_summary: str | None = None
    seed: int | None = None
    stop: list[str] | None = None
    #: a JSON Schema for the answer (sent as ``response_format`` json_schema)
    json_schema: dict[str, Any] | None = None
    #: llama.cpp server sampler fields (``repeat_penalty``, ``dry_multiplier``...: see
    #: :data:`chainrun.steps.model_config.SAMPLING_FIELDS`), sent in the body only by a
    #: provider that serves them (:attr:`OpenAICompatProvider.sampling_fields`); None: none
    sampling: dict[str, float] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: tools the model may call: ``{"name", "description", "parameters"}`` each (sent as
    #: Chat Completions ``tools`` of type function, or Responses function tools)
    tools: list[dict[str, Any]] | None = None
    #: ``"auto"``, ``"none"`` or ``"required"`` (None: not sent, the server's default)
    tool_choice: str | None = None
    #: prompt-cache affinity: what keeps this request's prompt on the cache that holds
    #: its conversation's earlier prompts (the conversation id; None: no affinity). A
    #: provider sends it as its server takes it (``prompt_cache_key`` on OpenAI and
    #: Azure, a llama-server slot): :mod:`chainrun.providers.affinity`
    cache_key: str | None = None
    #: the request is its conversation's answer step, whose prompt the next turn
    #: repeats: it keeps the conversation's cache (a llama-server slot); other steps'
    #: requests are placed off it
    cache_owner: bool = False


class Provider(Protocol):
    """What a model provider must offer: a stream of chunks for a request.

    Optional: ``reasoning_in_content`` (``"auto"``, ``"think_tags"`` or ``"off"``, the
    default when absent) says whether the server may put a thought inside ``content``
    (:mod:`chainrun.providers.think`). A provider with one-off client set-up (the
    Responses adapter's SDK tables) has ``prepared = False`` until its ``async
    prepare()`` has run; :class:`ChatStream` awaits ``prepare()`` before it starts a
    call's clock, so that no call's TTFT carries that set-up. A provider over several
    servers (a replica pool) has ``place(request)``, which picks the call's server
    before it is sent, and a ``chunks(request, placement)`` that sends it there:
    :class:`ChatStream` keeps the placement (``stream.placement``) for the call's log row.
    """

    name: str
    #: ``server.address:server.port`` for the log (None when not a network server)
    server_address: str | None

    def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        """Send ``request`` and yield its chunks; closing the iterator closes the response.

        Raises:
            ProviderError: connection, status or protocol failures.
        """
        ...

    async def aclose(self) -> None:
        """Release the provider's client and connections."""
        ...


class ChatStream:
    """A started model call: timings accumulate while chunks arrive.

    Use :meth:`first_token` (settle on the first token), :meth:`deltas` (the rest of
    the text, as it arrives) or :meth:`collect` (the whole answer), and always
    :meth:`aclose` (idempotent). The ``timer`` holds the measurements at any moment,
    including for a stream closed half way (cancelled hedging losers).

    Args:
        clock: the clock chunks are stamped with, in s (``time.perf_counter``).
        first_token_timeout_s, idle_timeout_s: see the module text (None: no timer).
        pump: read the stream in a task of its own from the start (True), or in the
            task that calls :meth:`collect` (False: for a caller that waits for the
            whole answer and does nothing else meanwhile; :meth:`first_token` or
            :meth:`deltas` on such a stream start a pump).
    """

    def __init__(
        self,
        provider: Provider,
        request: ChatRequest,
        clock: Clock = time.perf_counter,
        *,
        first_token_timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
        pump: bool = True,
    ):
        self.provider = provider
        self.request = request
        #: the thought taken out of content (a server that thinks in ``content``:
        #: :mod:`chainrun.providers.think`); None: content is the answer as sent
        mode: ReasoningInContent = getattr(provider, "reasoning_in_content", "off")
        self.think = None if mode == "off" else ThinkSplitter(mode, request.stop or ())
        #: what goes on the wire: with ``think_tags`` the stops are applied here, to the
        #: answer only, not sent (the server would apply them to the thought too)
        self._wire_request = (
            replace(request, stop=None) if mode == "think_tags" and request.stop else request
        )
        self._clock = clock
        self.first_token_timeout_s = first_token_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._started_loop = asyncio.get_running_loop().time()
        #: when the request was sent, wall clock (Unix time, s): the call's ``started_at``
        self.sent_at = time.time()
        self.timer = StreamTimer(t_start=clock())
        self.error: BaseException | None = None
        #: where a provider with several servers (a replica pool:
        #: :class:`chainrun.providers.replicas.ReplicaPool`) placed the call; None: the
        #: provider's own server
        self.placement: Any = None
        #: a :meth:`deltas` reader waiting for more text (woken per content chunk)
        self._more: asyncio.Future[None] | None = None
        self._first = asyncio.Event()
        self._done = asyncio.Event()
        self._closed = False
        self._pump: asyncio.Task[None] | None = None
        #: the task reading the stream itself (``pump=False``, inside :meth:`collect`)
        self._reader: asyncio.Task[Any] | None = None
        if pump:
            self._start_pump()

    def _start_pump(self) -> None:
        self._pump = asyncio.create_task(self._run(), name=f"chainrun-pump-{self.request.model}")

    def _wait_until(self, got_token: bool) -> float | None:
        """The event-loop time by which the next chunk must arrive (None: no timer)."""
        if not got_token:
            if self.first_token_timeout_s is None:
                return None
            return self._started_loop + self.first_token_timeout_s
        if self.idle_timeout_s is None:
            return None
        return asyncio.get_running_loop().time() + self.idle_timeout_s

    def _wake_reader(self) -> None:
        more = self._more
        if more is not None and not more.done():
            more.set_result(None)

    async def _run(self) -> None:
        """Read the stream to its end, stamping each chunk at arrival (in the pump task,
        or in the caller's task for ``pump=False``)."""
        if not getattr(self.provider, "prepared", True):
            # the provider's one-off client set-up (the first call of a process) is no
            # part of this call: the call's clock and timers start after it
            await self.provider.prepare()  # type: ignore[attr-defined]
            self.timer.t_start = self._clock()
            self._started_loop = asyncio.get_running_loop().time()
        place = getattr(self.provider, "place", None)
        if place is not None:  # a replica pool: where the call goes, for its log row
            self.placement = place(self._wire_request)
            it = aiter(self.provider.chunks(self._wire_request, self.placement))  # type: ignore[call-arg]
        else:
            it = aiter(self.provider.chunks(self._wire_request))
        think = self.think
        got_token = ended = False
        timed = self.first_token_timeout_s is not None or self.idle_timeout_s is not None
        timer, clock = self.timer, self._clock
        try:
            while True:
                until = self._wait_until(got_token) if timed else None
                try:
                    if until is None:  # no timer: no per-chunk timeout object either
                        chunk = await anext(it)
                    else:
                        async with asyncio.timeout_at(until):
                            chunk = await anext(it)
                except StopAsyncIteration:
                    ended = True
                    break
                except TimeoutError:
                    self.error = self._timer_fired(got_token)
                    return
                if think is not None:
                    chunk = think.apply(chunk)
                timer.on_chunk(clock(), chunk)
                if chunk.content:
                    self._wake_reader()
                if not got_token and (chunk.content or chunk.reasoning or chunk.tool_calls):
                    got_token = True  # a tool call's first piece is the model answering
                    self._first.set()
                if think is not None and think.stopped:
                    break  # a stop in the answer: the response is closed below
            if timer.finish_reason is None:
                self.error = StreamTruncated(
                    f"stream from {self.provider.name} ended without a finish_reason "
                    f"after {timer.n_chunks} chunks"
                )
        except asyncio.CancelledError:
            raise
        except ProviderError as e:
            self.error = e
        except Exception as e:  # a bug in a provider must not vanish silently
            self.error = ProviderError(f"{type(e).__name__}: {e}")
        finally:
            timer.on_end(clock())
            # an async generator that ended has run its own finally (closed its response)
            done = ended and isinstance(it, AsyncGeneratorType)
            aclose = None if done else getattr(it, "aclose", None)
            if aclose is not None:
                # shield: the response must be closed even when we are being cancelled
                await asyncio.shield(aclose())
            self._first.set()
            self._done.set()
            self._wake_reader()

    def _timer_fired(self, got_token: bool) -> ProviderError:
        name = self.provider.name
        if not got_token:
            n = self.timer.n_events  # role-only frames and filter events are no chunks
            where = "no chunk arrived" if not n else f"{n} event(s) without a token"
            return FirstTokenTimeout(
                f"{name}: no first token within first_token_timeout_s = "
                f"{self.first_token_timeout_s:g} s ({where})"
            )
        return IdleTimeout(
            f"{name}: no chunk for idle_timeout_s = {self.idle_timeout_s:g} s "
            f"after {self.timer.n_chunks} chunk(s)"
        )

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _ensure_reading(self) -> None:
        """Start the pump if nobody reads the stream yet (``pump=False`` streams asked
        for their first token or deltas)."""
        if self._pump is None and self._reader is None and not self._done.is_set():
            self._start_pump()

    async def first_token(self) -> ChatStream:
        """Wait until the first content or reasoning token (or a tool call's first piece)
        arrived; return self.

        Raises:
            ProviderError: the call failed, or ended before any token
                (:class:`StreamTruncated` when it ended without a finish_reason).
        """
        self._ensure_reading()
        await self._first.wait()
        if self.timer.ttft_ms is None:
            # ended before any token: an error, a truncation, or a legitimately empty answer
            await self._done.wait()
            self._raise_if_failed()
        return self

    async def deltas(self) -> AsyncGenerator[str, None]:
        """Yield content text as it arrives (from the first chunk on, also what arrived
        before this call), to the end of the stream.

        Raises:
            ProviderError: the stream failed or was truncated (after yielding what arrived).
        """
        self._ensure_reading()
        content = self.timer.content  # appended by the reader as chunks arrive
        i = 0
        while True:
            if i < len(content):
                i += 1
                yield content[i - 1]
                continue
            if self._done.is_set():
                break
            more: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._more = more
            try:
                await more
            finally:
                self._more = None
        self._raise_if_failed()

    async def collect(self) -> ChatStream:
        """Wait for the whole answer; return self (text in ``self.timer.text``). A
        ``pump=False`` stream is read here, in the caller's task.

        Raises:
            ProviderError: the stream failed or was truncated.
        """
        if self._pump is None and self._reader is None and not self._done.is_set():
            self._reader = asyncio.current_task()
            try:
                await self._run()
            finally:
                # read to its end: drop the task, whose result holds this stream (a
                # reference cycle per call for the garbage collector otherwise)
                self._reader = None
        else:
            await self._done.wait()
        self._raise_if_failed()
        return self

    async def aclose(self) -> None:
        """Stop the call now: cancel the pump (or the task reading a ``pump=False``
        stream, when it is not the caller), which closes the HTTP response."""
        self._closed = True
        if self._pump is None:
            reader = self._reader
            if reader is None:  # never read: nothing was sent
                if not self._done.is_set():
                    self.timer.on_end(self._clock())
                    self._first.set()
                    self._done.set()
            elif reader is not asyncio.current_task() and not self._done.is_set():
                reader.cancel()
                await self._done.wait()
            return
        if not self._pump.done():
            self._pump.cancel()
        try:
            await self._pump
        except asyncio.CancelledError:
            if not self._pump.cancelled():
                raise
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    @property
    def done(self) -> bool:
        return self._done.is_set()


def open_stream(provider: Provider, request: ChatRequest) -> ChatStream:
    """Start ``request`` on ``provider``; the returned stream is already running."""
    if not isinstance(request, ChatRequest):  # pragma: no cover - guard for library users
        raise ChainrunError("open_stream needs a ChatRequest")
    return ChatStream(provider, request)
