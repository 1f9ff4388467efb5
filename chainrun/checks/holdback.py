"""The hold-back engine: check a token stream in windows before its tokens reach the user.

Generic like :mod:`chainrun.hedging`: it reads any ``AsyncIterator[str]`` of tokens
(stream deltas; a chunk counts as one token) and awaits any ``async (text) ->
WindowVerdict``; it imports nothing of LLMs or HTTP.

The rule: the last ``window_tokens`` (c) tokens are never
released before a check has passed over them *and the c tokens after them* (or the end of
the stream). Concretely, when c new tokens have arrived since the last check, one check
runs over everything still held (the c held back plus the new ones, more when a slow check
let tokens pile up); if it passes, all but the last c are released. So a flagged phrase of
at most c tokens is inside one checked text before any of its tokens is released, even
when it was split across chunks or across two windows: **it never reaches the consumer**.
A check may also redact (replace spans of the held text) instead of blocking, or stop the
stream (``WindowVerdict.stop``: what it checked is released, the source closed, and the
stream ends as if the source had).

Checks run one at a time, while tokens keep being read: the generation is never paused,
and a slow check simply covers more text. On a block the source is closed (for an HTTP
stream: the connection is closed and the server stops generating), and
:class:`OutputBlocked` is raised with what had been released.

:func:`exposure_bound` gives the figures to report for a configuration: the added delay
and the flagged tokens that can reach a user before the block.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chainrun.checks.patterns import PatternChecker


@dataclass(frozen=True)
class Redaction:
    """Replace ``text[start:end]`` of the checked text by ``replacement`` (character offsets)."""

    start: int
    end: int
    replacement: str


@dataclass(frozen=True)
class WindowVerdict:
    """A check's verdict on one checked text: pass (``ok``), block (``ok = False``, with a
    ``reason``), or pass with ``redactions`` to apply before release. ``hold_from``: an
    offset of the checked text (after the redactions) from which nothing is released
    yet, whatever the window allows (a claim still being written: the grounding check);
    None: the window's rule alone decides. ``stop``: release the checked text (after the
    redactions) and end the stream there, the source closed (a loop: the answer so far
    is the answer; :mod:`chainrun.checks.loops`)."""

    ok: bool
    reason: str | None = None
    redactions: tuple[Redaction, ...] = ()
    hold_from: int | None = None
    stop: bool = False


WindowCheck = Callable[[str], Awaitable[WindowVerdict]]


class OutputBlocked(Exception):
    """A window failed its check: the stream was stopped and closed.

    Attributes:
        reason: the check's reason.
        released_tokens: tokens that had reached the consumer before the block.
        released_text: the text that had reached the consumer.
        checked_tokens: tokens covered by the check that blocked.
    """

    def __init__(
        self, reason: str, *, released_tokens: int, released_text: str, checked_tokens: int
    ) -> None:
        super().__init__(f"output blocked: {reason}")
        self.reason = reason
        self.released_tokens = released_tokens
        self.released_text = released_text
        self.checked_tokens = checked_tokens


@dataclass
class HoldBackStats:
    """What one stream went through: checks run, their latencies (ms), the most tokens held."""

    tokens_in: int = 0
    tokens_released: int = 0
    checks: int = 0
    check_ms: list[float] = field(default_factory=list)
    max_held_tokens: int = 0
    redactions: int = 0
    #: why a check stopped the stream (None: it was not stopped)
    stopped: str | None = None
    #: tokens read and never released, dropped when a check stopped the stream
    tokens_dropped: int = 0


class HoldBack:
    """Runs a check over a token stream in windows of ``window_tokens``; see the module text.

    A check with a true ``streaming`` attribute (the grounding check:
    :class:`chainrun.checks.grounding.StreamGrounding`) is awaited as ``check(text,
    final=...)`` (``final``: the stream has ended and this is all that is held) and told
    each released piece (``check.released(piece)``), so that it can judge text that
    began before what it holds; with ``window_tokens = 0`` such a check runs on every
    token and only its ``hold_from`` holds anything back.

    Args:
        check: awaited with the held text; its verdict releases, redacts or blocks.
        window_tokens: c, the number of tokens held back (>= 1; 0: only with a
            ``streaming`` check).

    Raises:
        ValueError: ``window_tokens`` < 1 (< 0 for a ``streaming`` check).
    """

    def __init__(self, check: WindowCheck, window_tokens: int) -> None:
        self.streaming = bool(getattr(check, "streaming", False))
        if window_tokens < (0 if self.streaming else 1):
            raise ValueError(f"window_tokens must be >= 1, got {window_tokens}")
        self.check = check
        self.window_tokens = window_tokens
        self.stats = HoldBackStats()

    async def stream(self, source: AsyncIterator[str]) -> AsyncGenerator[str, None]:
        """Yield the released text of ``source`` (pieces of one or more tokens).

        ``source`` is closed (``aclose()``, if it has one) when this generator ends, is
        closed, or blocks.

        Raises:
            OutputBlocked: a check did not pass (after the source was closed).
            Exception: whatever ``source`` or ``check`` raised (the source closed first).
        """
        c = self.window_tokens
        streaming = self.streaming
        check_fn: Any = self.check
        on_release = getattr(self.check, "released", None) if streaming else None
        held: list[str] = []  # tokens read and not yet released
        new = 0  # tokens read since the last check started
        ended = False
        released: list[str] = []
        reader: asyncio.Task[str] | None = None
        checker: asyncio.Task[WindowVerdict] | None = None
        checked_n = 0  # tokens covered by the check in flight
        checked_final = False  # the check in flight was told the stream had ended
        check_started = 0.0
        try:
            while True:
                if checker is None and ((new >= max(c, 1)) or (ended and held)):
                    checked_n, new = len(held), 0
                    check_started = time.perf_counter()
                    text = "".join(held[:checked_n])
                    checked_final = ended
                    checker = asyncio.ensure_future(
                        check_fn(text, final=ended) if streaming else self.check(text)
                    )
                if reader is None and not ended:
                    reader = asyncio.ensure_future(anext(source))
                waiting = [t for t in (reader, checker) if t is not None]
                if not waiting:
                    return
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if reader is not None and reader in done:
                    task, reader = reader, None
                    try:
                        held.append(task.result())
                        new += 1
                        self.stats.tokens_in += 1
                        self.stats.max_held_tokens = max(self.stats.max_held_tokens, len(held))
                    except StopAsyncIteration:
                        ended = True
                    except Exception:
                        if not streaming or not held:
                            raise
                        # the source broke off: a streaming check judges what is held as
                        # the end (a cut answer keeps the words that pass), then it raises
                        if checker is not None:
                            await asyncio.wait([checker])
                            checker = None
                        verdict = await check_fn("".join(held), final=True)
                        self.stats.checks += 1
                        if verdict.ok:
                            if verdict.redactions:
                                held[:] = _redact(held, verdict.redactions)
                                self.stats.redactions += len(verdict.redactions)
                            piece = "".join(held)
                            self.stats.tokens_released += len(held)
                            held.clear()
                            released.append(piece)
                            if on_release is not None:
                                on_release(piece)
                            if piece:
                                yield piece
                            if verdict.stop:
                                self.stats.stopped = verdict.reason or "stopped"
                                return  # the check ended the answer: the break-off is moot
                        raise
                if checker is not None and checker in done:
                    task2, checker = checker, None
                    verdict = task2.result()
                    self.stats.checks += 1
                    self.stats.check_ms.append((time.perf_counter() - check_started) * 1000)
                    if not verdict.ok:
                        raise OutputBlocked(
                            verdict.reason or "check failed",
                            released_tokens=self.stats.tokens_released,
                            released_text="".join(released),
                            checked_tokens=checked_n,
                        )
                    if verdict.redactions:
                        held[:checked_n] = _redact(held[:checked_n], verdict.redactions)
                        self.stats.redactions += len(verdict.redactions)
                    if verdict.stop:
                        # the check ended the answer: what it checked is released below,
                        # the rest read meanwhile is dropped, the source closed (finally)
                        self.stats.tokens_dropped += len(held) - checked_n
                        self.stats.stopped = verdict.reason or "stopped"
                        del held[checked_n:]
                        final = True
                    else:
                        # a streaming check judges an open claim only when told the
                        # stream ended
                        final = (ended and checked_n == len(held)
                                 and (checked_final or not streaming))  # fmt: skip
                    upto = checked_n if final else max(0, checked_n - c)
                    if verdict.hold_from is not None and not final:
                        upto = min(upto, _tokens_before(held[:checked_n], verdict.hold_from))
                    if upto:
                        piece = "".join(held[:upto])
                        del held[:upto]
                        self.stats.tokens_released += upto
                        released.append(piece)
                        if on_release is not None:
                            on_release(piece)
                        if piece:
                            yield piece
                    if final:
                        return
        finally:
            for t in (reader, checker):
                if t is not None and not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()


def _tokens_before(tokens: Sequence[str], offset: int) -> int:
    """How many of ``tokens`` lie wholly before character ``offset`` of their join."""
    total = 0
    for i, tok in enumerate(tokens):
        total += len(tok)
        if total > offset:
            return i
    return len(tokens)


def _redact(tokens: list[str], redactions: Sequence[Redaction]) -> list[str]:
    """Apply ``redactions`` (offsets into ``"".join(tokens)``) keeping the token count.

    A replacement lands in the token where its span starts; the other tokens the span
    covered become empty, so window arithmetic in tokens is unchanged.
    """
    bounds = [0]
    for tok in tokens:
        bounds.append(bounds[-1] + len(tok))
    text = "".join(tokens)
    out = list(tokens)
    for r in sorted(redactions, key=lambda r: r.start, reverse=True):
        if not 0 <= r.start <= r.end <= len(text):
            raise ValueError(f"redaction {r} outside the checked text (length {len(text)})")
        first = max(i for i in range(len(tokens)) if bounds[i] <= r.start) if tokens else 0
        last = max(i for i in range(len(tokens)) if bounds[i] < max(r.end, r.start + 1))
        start_tok = "".join(out[first : last + 1])
        local_s = r.start - bounds[first]
        local_e = r.end - bounds[first]
        out[first] = start_tok[:local_s] + r.replacement + start_tok[local_e:]
        for i in range(first + 1, last + 1):
            out[i] = ""
    return out


def window_check(
    patterns: PatternChecker | None = None, model: WindowCheck | None = None
) -> WindowCheck:
    """A window check that runs the deterministic ``patterns`` first (microseconds: a
    ``block`` match blocks without calling ``model``, ``redact`` matches are redacted) and
    then, if given, ``model`` on the redacted text.

    A model verdict's redactions are taken as offsets into the redacted text; with pattern
    redactions too, the model's are dropped (the pattern ones already masked the text).
    """

    async def check(text: str) -> WindowVerdict:
        redactions: tuple[Redaction, ...] = ()
        seen = text
        if patterns:
            result = patterns.check(text)
            if result.blocked:
                names = sorted({f.check for f in result.findings if f.action == "block"})
                return WindowVerdict(False, "pattern: " + ", ".join(names))
            if result.findings:
                redactions = tuple(
                    Redaction(f.start, f.end, f"[{f.check}]") for f in result.findings
                )
                seen = result.text
        if model is None:
            return WindowVerdict(True, redactions=redactions)
        verdict = await model(seen)
        if not verdict.ok:
            return verdict
        return WindowVerdict(True, verdict.reason, redactions or verdict.redactions)

    return check


def exposure_bound(
    window_tokens: int, tokens_per_s: float, check_ms: float, *, phrase_tokens: int | None = None
) -> dict[str, float | int]:
    """The figures of a hold-back configuration (c tokens, generation speed, check latency).

    Returns ``{window_tokens, held_back_tokens, added_delay_ms, exposure_tokens,
    exposure_without_holdback_tokens}``:

    * ``added_delay_ms``: how much later a token reaches the user than without checks, at
      most the time to generate c tokens plus one check: 1000·c/g + check_ms (more when a
      check takes longer than c tokens' generation, as checks run one at a time).
    * ``exposure_tokens``: tokens of a flagged phrase of ``phrase_tokens`` (default c) that
      can reach a user before the block: max(0, n − c), since a phrase of at most c tokens
      is always checked whole before release (module text).
    * ``exposure_without_holdback_tokens``: the same when tokens are shown at once and
      checked in windows of c afterwards: up to c + ⌈g·check_ms/1000⌉ (bounded by
      the tokens released before the flagged window's check returns).

    Raises:
        ValueError: a non-positive window or speed, or a negative latency.
    """
    if window_tokens < 1 or tokens_per_s <= 0 or check_ms < 0:
        raise ValueError(
            "need window_tokens >= 1, tokens_per_s > 0, check_ms >= 0; got "
            f"{window_tokens=}, {tokens_per_s=}, {check_ms=}"
        )
    n = window_tokens if phrase_tokens is None else phrase_tokens
    return {
        "window_tokens": window_tokens,
        "held_back_tokens": window_tokens,
        "added_delay_ms": round(1000 * window_tokens / tokens_per_s + check_ms, 1),
        "exposure_tokens": max(0, n - window_tokens),
        "exposure_without_holdback_tokens": window_tokens
        + math.ceil(tokens_per_s * check_ms / 1000),
    }
