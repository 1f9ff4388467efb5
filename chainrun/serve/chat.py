"""``POST /chat``: one turn streamed as Server-Sent Events.

Request body (JSON)::

    {"message": "a rain jacket under 100?", "conversation_id": "optional, <= 200 chars"}

Response: ``text/event-stream`` with the events of :mod:`chainrun.serve.turns`
(``turn_started``, ``step``, ``token``, ``turn``), each ``data`` one JSON object. A bad
body is answered 400 naming the field, a server not yet ready 503, both in the one
error shape of :mod:`chainrun.serve.errors` (``{"error": {"message", "type", "param",
"code"}}``). The message follows the library's rule (:mod:`chainrun.conversations.turn_input`). A
client that disconnects cancels the turn (sse-starlette cancels the generator on the
ASGI ``http.disconnect``), which closes the in-flight model calls. A turn the server
cancels as it stops (its stop's deadline, a second Ctrl-C) still ends its stream with
its ``turn`` event, status ``cancelled``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from chainrun.conversations.turn_input import MAX_MESSAGE_CHARS, text_problem
from chainrun.serve.errors import error_response, not_ready
from chainrun.serve.sse import sse_event, sse_response
from chainrun.serve.turns import TurnRunner

__all__ = ["MAX_CONVERSATION_ID_CHARS", "MAX_MESSAGE_CHARS", "BadRequest", "chat",
           "parse_chat_body"]  # fmt: skip

MAX_CONVERSATION_ID_CHARS = 200
#: the keys a ``/chat`` body may have
CHAT_KEYS = ("message", "conversation_id")


class BadRequest(ValueError):
    """A request body that does not have the documented shape (message names the field).

    ``param``: the field at fault (None: the body as a whole).
    """

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def parse_chat_body(raw: bytes) -> tuple[str, str | None]:
    """``(message, conversation_id)`` from a ``/chat`` body.

    Raises:
        BadRequest: not a JSON object; ``message`` missing, blank, not a string, over
            :data:`MAX_MESSAGE_CHARS` or holding a lone surrogate (the library's rule,
            :func:`chainrun.conversations.turn_input.check_turn_input`); ``conversation_id`` not
            such a string of 1 to :data:`MAX_CONVERSATION_ID_CHARS` characters; a key not in
            :data:`CHAT_KEYS` (a typo such as ``conversationId`` would otherwise start a
            new conversation without a word).
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("body: expected a JSON object", None) from None
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object", None)
    for key in body:
        if key not in CHAT_KEYS:
            close = difflib.get_close_matches(str(key), CHAT_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BadRequest(f"{key}: unknown field{hint}; expected {', '.join(CHAT_KEYS)}", key)
    message = body.get("message")
    problem = text_problem(message, required=True, max_chars=MAX_MESSAGE_CHARS)
    if problem is not None:
        raise BadRequest(f"message: {problem}", "message")
    conversation_id: str | None = body.get("conversation_id")
    problem = text_problem(conversation_id, required=False, max_chars=MAX_CONVERSATION_ID_CHARS)
    if problem is None and conversation_id == "":
        problem = "expected a non-empty string"
    if problem is not None:
        raise BadRequest(f"conversation_id: {problem}", "conversation_id")
    assert isinstance(message, str)
    return message, conversation_id


async def _events(
    runner: TurnRunner, message: str, conversation_id: str | None
) -> AsyncIterator[ServerSentEvent]:
    async for ev in runner.stream(message, conversation_id):
        yield sse_event(json.dumps(ev.data), ev.event)


async def chat(request: Request) -> Response:
    """The ``POST /chat`` endpoint (see the module docstring)."""
    runner: TurnRunner | None = request.app.state.serve.runner
    if runner is None:
        return not_ready(request)
    try:
        message, conversation_id = parse_chat_body(await request.body())
    except BadRequest as e:
        return error_response(400, str(e), param=e.param, code="invalid_value")
    return sse_response(
        _events(runner, message, conversation_id),
        keepalive_s=request.app.state.serve.chat_keepalive_s,
    )

