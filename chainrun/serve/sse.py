"""Server-sent events as every face sends them: OpenAI's framing, keep-alives by choice.

OpenAI's streams end every event with a blank line of bare ``\\n`` (``data: {...}\\n\\n``;
the WHATWG HTML standard, "Server-sent events", allows ``\\r\\n``, ``\\r`` or ``\\n``
line ends, but clients that split the body on ``\\n\\n`` read a stream framed in
``\\r\\n`` as one event at its end). sse-starlette's default separator is ``\\r\\n``, so
every event and response here is built with ``\\n``.

Keep-alive comment lines (``: ping - <time>``) keep idle proxies from closing a slow
stream but are not part of OpenAI's wire, and some OpenAI clients reject them: the
OpenAI face sends none unless asked (``chainrun serve --v1-keepalive-s``); ``/chat``,
chainrun's own stream, sends one every :data:`CHAT_KEEPALIVE_S` by default
(``--chat-keepalive-s``, 0 for none).
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from chainrun.serve.settings import CHAT_KEEPALIVE_S, SHUTDOWN_GRACE_S

__all__ = ["CHAT_KEEPALIVE_S", "SEP", "sse_event", "sse_response"]

#: the line end of every event (OpenAI's framing)
SEP = "\n"


def sse_event(data: str, event: str | None = None) -> ServerSentEvent:
    """One event (``event:`` line when named, then ``data:``), framed in ``\\n``."""
    return ServerSentEvent(data=data, event=event, sep=SEP)


def sse_response(events: AsyncIterable[Any], *, keepalive_s: float | None) -> EventSourceResponse:
    """A ``text/event-stream`` response of ``events`` framed in ``\\n``.

    Args:
        events: the :func:`sse_event` s to send, in order.
        keepalive_s: s between keep-alive comment lines; None or 0: none are sent.
    """
    return EventSourceResponse(
        events,
        sep=SEP,
        # sse-starlette sends no ping only for an interval of 0 (None means its default)
        ping=keepalive_s or 0,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        # at shutdown the stream runs on while its turn has its grace (the turn is
        # cancelled at SHUTDOWN_GRACE_S, which ends the stream cleanly first)
        shutdown_grace_period=SHUTDOWN_GRACE_S + 1,
    )
