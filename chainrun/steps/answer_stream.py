"""The winning attempt's answer as the shopper receives it: one function shared by the
model step and the tool loop, so that both stream, hold back and time out alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from chainrun.events import TokenDelta

if TYPE_CHECKING:
    from chainrun.checks.holdback import HoldBack
    from chainrun.providers.base import ChatStream


async def stream_answer(
    step: str,
    winner: ChatStream,
    holdback: HoldBack | None,
    deadline: float,
    shown: list[str],
) -> AsyncGenerator[TokenDelta, None]:
    """``winner``'s text as :class:`TokenDelta` events of ``step``, through the output
    check's hold-back when there is one; each piece is appended to ``shown`` (what reached
    the shopper) as it is yielded.

    Args:
        deadline: the step's deadline on the event loop's clock (s).

    Raises:
        TimeoutError: the answer did not end by ``deadline``.
        OutputBlocked: the hold-back's check flagged a window (nothing of it was yielded).
    """
    source = winner.deltas()
    if holdback is not None:
        source = holdback.stream(source)
    async with asyncio.timeout_at(deadline), contextlib.aclosing(source):
        async for text in source:
            shown.append(text)
            yield TokenDelta(step=step, text=text)


async def settle_attempt(stream: ChatStream, streamed: bool) -> ChatStream:
    """An attempt's stream once it has its first token (``streamed``) or its whole answer
    (the race settles on it); the stream is closed on any failure or cancellation, so a
    loser's HTTP response never stays open.

    Raises:
        whatever the stream raised (a provider error, a first-token or idle timeout).
    """
    try:
        return await (stream.first_token() if streamed else stream.collect())
    except BaseException:
        await stream.aclose()
        raise
