"""Cancel work when the party waiting for it has gone (no HTTP here: the check is injected).

A streamed response is cancelled by sse-starlette itself on the ASGI
``http.disconnect``; the turn it streams runs :func:`detached`, so that the cancel
reaches it once, as a plain asyncio cancellation it can clean up after. A non-streamed
response is not cancelled at all, so a backend waiting for a whole turn races the work
against a disconnect check with :func:`run_until_disconnected`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: how often the disconnect check runs, in s (Starlette's ``is_disconnected`` polls)
POLL_S = 0.1


async def run_until_disconnected(
    work: Coroutine[Any, Any, T],
    is_disconnected: Callable[[], Awaitable[bool]],
    poll_s: float = POLL_S,
) -> T | None:
    """Run ``work``; cancel it (and return None) as soon as ``is_disconnected()`` says so.

    ``work``'s own exceptions propagate. Cancelling the caller cancels ``work`` too.
    The check is polled every ``poll_s`` s, so a disconnect is acted on within that.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await is_disconnected():
                return None
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


_END = object()


async def detached(
    source: AsyncGenerator[T, None],
    background: set[asyncio.Task[None]],
    maxsize: int = 256,
    *,
    finish_after: Callable[[T], bool] | None = None,
) -> AsyncGenerator[T, None]:
    """Iterate ``source`` in a task of its own and yield its items; closing this generator
    cancels that task once, unless an item for which ``finish_after(item)`` is true was
    yielded: then ``source`` runs to its end in that task (its later items dropped), e.g.
    a turn whose answer the client has, left to finish its checks.

    Why: a streamed response (sse-starlette's task group, an anyio cancel scope) is
    cancelled *level-triggered*: every ``await`` in the cancelled scope raises again, so
    a producer running inside it could not await its own clean-up (close its HTTP
    streams, log what happened). In its own task it gets one plain ``cancel()`` and
    cleans up normally. The task stays in ``background`` until it is done, so a server
    can wait for it at shutdown, or cancel it: this generator then ends. ``source``'s
    exceptions are re-raised here; at most ``maxsize`` items wait for a slow consumer
    (then ``source`` waits too).
    """
    queue: asyncio.Queue[tuple[Any, BaseException | None]] = asyncio.Queue(maxsize)
    left = False  # the consumer went away after a finish_after item: drop what follows

    async def put(entry: tuple[Any, BaseException | None]) -> None:
        if not left:
            await queue.put(entry)

    async def pump() -> None:
        try:
            async with contextlib.aclosing(source):
                async for item in source:
                    await put((item, None))
        except asyncio.CancelledError:
            # cancelled from outside (a server stopping its turns): a consumer still
            # reading ends too, instead of waiting for an item that never comes
            if not left:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait((_END, None))
            raise
        except BaseException as e:
            await put((_END, e))
        else:
            await put((_END, None))

    task = asyncio.create_task(pump())
    background.add(task)
    task.add_done_callback(background.discard)
    let_finish = False
    try:
        while True:
            item, error = await queue.get()
            if error is not None:
                raise error
            if item is _END:
                return
            if finish_after is not None and not let_finish and finish_after(item):
                let_finish = True
            yield item
    finally:
        if not task.done():
            if let_finish:
                left = True
                while not queue.empty():  # a pump waiting on a full queue goes on
                    queue.get_nowait()
            else:
                task.cancel()
