"""``POST /chat``: one turn streamed as Server-Sent Events.

Request body (JSON)::

    {"message": "a rain jacket under 100?", "conversation_id": "optional, <= 200 chars"}

Response: ``text/event-stream`` with the events of :mod:`chainrun.serve.turns`
(``turn_started``, ``step``, ``token``, ``turn``), each ``data`` one JSON object. A bad
body is answered ``400 {"error": "..."}`` naming the field; a server not yet ready
``503``. A client that disconnects cancels the turn (sse-starlette cancels the
generator on the ASGI ``http.disconnect``), which closes the in-flight model calls.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chainrun.serve.turns import TurnRunner

#: longest message accepted, in characters (a chat message, not a document)
MAX_MESSAGE_CHARS = 8000
MAX_CONVERSATION_ID_CHARS = 200


class BadRequest(ValueError):
    """A request body that does not have the documented shape (message names the field)."""


def parse_chat_body(raw: bytes) -> tuple[str, str | None]:
    """``(message, conversation_id)`` from a ``/chat`` body.

    Raises:
        BadRequest: not a JSON object, ``message`` missing, empty, not a string or over
            :data:`MAX_MESSAGE_CHARS`; ``conversation_id`` not a string or too long.
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("body: expected a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object")
    message = body.get("message")
    if not isinstance(message, str) or not message.strip():
        raise BadRequest("message: expected a non-empty string")
    if len(message) > MAX_MESSAGE_CHARS:
        raise BadRequest(f"message: expected at most {MAX_MESSAGE_CHARS} characters")
    conversation_id = body.get("conversation_id")
    if conversation_id is not None and (
        not isinstance(conversation_id, str)
        or not conversation_id
        or len(conversation_id) > MAX_CONVERSATION_ID_CHARS
    ):
        raise BadRequest(
            f"conversation_id: expected a string of 1 to {MAX_CONVERSATION_ID_CHARS} characters"
        )
    return message, conversation_id


async def _events(
    runner: TurnRunner, message: str, conversation_id: str | None
) -> AsyncIterator[ServerSentEvent]:
    async for ev in runner.stream(message, conversation_id):
        yield ServerSentEvent(data=json.dumps(ev.data), event=ev.event)


async def chat(request: Request) -> Response:
    """The ``POST /chat`` endpoint (see the module docstring)."""
    runner: TurnRunner | None = request.app.state.serve.runner
    if runner is None:
        return not_ready(request)
    try:
        message, conversation_id = parse_chat_body(await request.body())
    except BadRequest as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    return EventSourceResponse(
        _events(runner, message, conversation_id),
        ping=15,  # a comment line every 15 s keeps idle proxies from closing the stream
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def not_ready(request: Request) -> Response:
    """``503`` with why the chain is not ready (still starting, or its last error)."""
    state: Any = request.app.state.serve
    return JSONResponse(
        {"error": "not ready", "detail": state.not_ready_reason()},
        status_code=503,
        headers={"Retry-After": "1"},
    )
