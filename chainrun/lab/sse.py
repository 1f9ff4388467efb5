"""The lab's streamed response: pre-framed SSE bytes sent straight to the ASGI server.

The lab's generators already yield whole SSE frames (``data: ...\\n\\n``), so all a
response has to do is send them and notice a client that goes away. sse-starlette's
``EventSourceResponse`` does that through an anyio task group (a disconnect listener,
a ping task, an exit-signal watcher and a cancel scope per send); at hundreds of
streams at once that machinery was a fifth of the lab's CPU per request (py-spy on
``benchmarks/scale.py``), and the lab shares the cores with the client it
measures. :class:`SSEBytesResponse` keeps the behaviour the lab's records rely on:

- headers first, then every frame in its own ``http.response.body`` message, in the
  generator's own time (nothing is buffered or re-timed here);
- a client disconnect (the ASGI ``http.disconnect`` message) cancels the generator
  at its current ``await`` (as sse-starlette's task-group cancellation did), so the
  generator's ``except CancelledError`` marks the record ``disconnected``; a
  generator suspended at a ``yield`` is closed (``GeneratorExit``) instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

#: what sse-starlette sent with a stream, kept so that clients see the same headers
_SSE_HEADERS = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
)


class SSEBytesResponse(Response):
    """A 200 ``text/event-stream`` response whose body is ``frames``, each sent as is.

    Args:
        frames: an async generator of pre-framed SSE bytes; it is closed when the
            response ends, and cancelled at its current ``await`` when the client
            disconnects (its ``CancelledError`` is not raised further).
        headers: extra response headers (e.g. ``x-lab-request-id``).
    """

    def __init__(
        self, frames: AsyncGenerator[bytes, None], headers: Mapping[str, str] | None = None
    ) -> None:
        self.frames = frames
        self.status_code = 200
        self.background = None
        extra = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        self.raw_headers = [*_SSE_HEADERS, *extra]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        state = {"disconnected": False, "ending": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state["ending"]:  # the last frame is out: nothing to stop any more
                state["disconnected"] = True
                task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            try:
                await send(
                    {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                )
                async for frame in self.frames:
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                state["ending"] = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                state["ending"] = True
                watcher.cancel()
                await self.frames.aclose()
        except asyncio.CancelledError:
            if not state["disconnected"]:
                raise  # cancelled from outside (the server shutting down)
            task.uncancel()  # our own cancellation: the client has gone, the response ends
