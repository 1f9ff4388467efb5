"""The provider protocol and the stream every provider returns.

A provider turns a :class:`ChatRequest` into an async iterator of normalised
:class:`~chainrun.timing.Chunk` objects (its only job: wire format, auth, client
lifecycle). :class:`ChatStream` wraps that iterator the same way for every provider:
a *pump task* reads the chunks as they arrive and stamps them into a
:class:`~chainrun.timing.StreamTimer`, so timings are taken where the bytes arrive,
not where a (possibly slow) consumer reads them. Closing a ChatStream cancels the
pump, whose ``finally`` closes the HTTP response: the server stops generating.

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
from dataclasses import dataclass, field
from typing import Any, Protocol

from chainrun.errors import (
    ChainrunError,
    FirstTokenTimeout,
    IdleTimeout,
    ProviderError,
    StreamTruncated,
)
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
    messages: list[dict[str, str]]
    max_output_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: str | None = None
    #: Responses API only: ``reasoning.summary`` ("auto", "concise" or "detailed")
    reasoning_summary: str | None = None
    seed: int | None = None
    stop: list[str] | None = None
    #: a JSON Schema for the answer (sent as ``response_format`` json_schema)
    json_schema: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


class Provider(Protocol):
    """What a model provider must offer: a stream of chunks for a request."""

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


_END = object()


class ChatStream:
    """A started model call: timings accumulate while chunks arrive.

    Use :meth:`first_token` (settle on the first token), :meth:`deltas` (the rest of
    the text, as it arrives) or :meth:`collect` (the whole answer), and always
    :meth:`aclose` (idempotent). The ``timer`` holds the measurements at any moment,
    including for a stream closed half way (cancelled hedging losers).
    """

    def __init__(
        self,
        provider: Provider,
        request: ChatRequest,
        clock: Clock = time.perf_counter,
        *,
        first_token_timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
    ):
        self.provider = provider
        self.request = request
        self._clock = clock
        self.first_token_timeout_s = first_token_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._started_loop = asyncio.get_running_loop().time()
        self.timer = StreamTimer(t_start=clock())
        self.error: BaseException | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._first = asyncio.Event()
        self._done = asyncio.Event()
        self._closed = False
        self._pump = asyncio.create_task(self._run(), name=f"chainrun-pump-{request.model}")

    def _wait_until(self, got_token: bool) -> float | None:
        """The event-loop time by which the next chunk must arrive (None: no timer)."""
        loop = asyncio.get_running_loop()
        if not got_token:
            if self.first_token_timeout_s is None:
                return None
            return self._started_loop + self.first_token_timeout_s
        if self.idle_timeout_s is None:
            return None
        return loop.time() + self.idle_timeout_s

    async def _run(self) -> None:
        it = aiter(self.provider.chunks(self.request))
        got_token = False
        try:
            while True:
                until = self._wait_until(got_token)
                try:
                    if until is None:  # no timer: no per-chunk timeout object either
                        chunk = await anext(it)
                    else:
                        async with asyncio.timeout_at(until):
                            chunk = await anext(it)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    self.error = self._timer_fired(got_token)
                    return
                self.timer.on_chunk(self._clock(), chunk)
                if chunk.content:
                    self._queue.put_nowait(chunk.content)
                if chunk.has_token:
                    got_token = True
                    self._first.set()
            if self.timer.finish_reason is None:
                self.error = StreamTruncated(
                    f"stream from {self.provider.name} ended without a finish_reason "
                    f"after {self.timer.n_chunks} chunks"
                )
        except asyncio.CancelledError:
            raise
        except ProviderError as e:
            self.error = e
        except Exception as e:  # a bug in a provider must not vanish silently
            self.error = ProviderError(f"{type(e).__name__}: {e}")
        finally:
            self.timer.on_end(self._clock())
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                # shield: the response must be closed even when we are being cancelled
                await asyncio.shield(aclose())
            self._queue.put_nowait(_END)
            self._first.set()
            self._done.set()

    def _timer_fired(self, got_token: bool) -> ProviderError:
        name = self.provider.name
        if not got_token:
            n = self.timer.n_chunks
            where = "no chunk arrived" if not n else f"{n} chunk(s) without a token"
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

    async def first_token(self) -> ChatStream:
        """Wait until the first content or reasoning token arrived; return self.

        Raises:
            ProviderError: the call failed, or ended before any token
                (:class:`StreamTruncated` when it ended without a finish_reason).
        """
        await self._first.wait()
        if self.timer.ttft_ms is None:
            # ended before any token: an error, a truncation, or a legitimately empty answer
            await self._done.wait()
            self._raise_if_failed()
        return self

    async def deltas(self) -> AsyncGenerator[str, None]:
        """Yield content text as it arrives, to the end of the stream.

        Raises:
            ProviderError: the stream failed or was truncated (after yielding what arrived).
        """
        while True:
            item = await self._queue.get()
            if item is _END:
                break
            yield item
        self._raise_if_failed()

    async def collect(self) -> ChatStream:
        """Wait for the whole answer; return self (text in ``self.timer.text``).

        Raises:
            ProviderError: the stream failed or was truncated.
        """
        await self._done.wait()
        self._raise_if_failed()
        return self

    async def aclose(self) -> None:
        """Stop the call now: cancel the pump, which closes the HTTP response."""
        self._closed = True
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
