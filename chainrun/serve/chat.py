"""``POST /chat``: one turn streamed as Server-Sent Events.

Request body (JSON)::

    {"message": "a rain jacket under 100?", "conversation_id": "optional, <= 200 chars"}
    {"conversation_id": "...", "confirm": "ACTION_ID"}    (or "deny"; the message optional)

The body is read into the one :class:`~chainrun.desk.TurnRequest` every face builds
(:func:`chainrun.serve.intake.turn_request`), and the chain's front desk
(:mod:`chainrun.desk`) admits it. An ``Idempotency-Key`` header makes a request sent
again return the first one's turn (:mod:`chainrun.desk.keys`); such a turn runs to its
end when the client goes away. A keyed request without a ``conversation_id`` gets one
derived from the key and the caller (:func:`~chainrun.desk.keys.keyed_conversation_id`),
so its retry finds it; any other request without one starts a new conversation. A
request the desk refuses before its turn runs is answered with the refusal's HTTP status
(``http_status``, :mod:`chainrun.errors`) and the error object of
:mod:`chainrun.serve.errors`, not a stream: an unknown action id 400, another identity's
conversation 403 (``conversation_forbidden``), a key whose first request is still running
past the wait 409, a key reused with another body 422 (``idempotency_key_reused``), the
run log away past its outage wait 503 (``log_unavailable``, with ``Retry-After``). The
response starts once the chain's turn has begun, or after
:attr:`chainrun.serve.turns.TurnRunner.refusal_wait_s` at most: a key whose first request is still
running streams while it waits for that turn, and should the wait run out
(:data:`chainrun.desk.keys.WAIT_S`) its stream's event after ``turn_started`` is
``error`` ``{status: 409, message, type}``. With ``serve --identity-header`` the
caller's identity comes from that header (:mod:`chainrun.serve.identity`): missing or not
checking out, 401.

Response: ``text/event-stream`` with the events of :mod:`chainrun.serve.turns`, each
``data`` one JSON object. A shopper's stream carries what the shopper may see:
``turn_started``, the answer step's ``token`` events (the answer as its checks release
it), ``products``, ``action``, ``answer_done`` and ``turn`` (:data:`SHOPPER_EVENTS`);
a stream forwarded to a browser as is shows nothing a check held back. The operator's
events (``step`` with each step's raw output, ``tool``, ``grounding`` with the check's
reasons, other steps' tokens: the chat page's waterfall) come with ``serve
--step-events``, or on a request that sends ``Chainrun-Events: steps`` and passed the
bearer token (:func:`step_events_wanted`). A bad
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
from chainrun.desk import Received
from chainrun.serve.errors import (
    NotJSON,
    error_response,
    not_ready,
    read_json,
    refusal_response,
)
from chainrun.serve.intake import Asked, turn_request
from chainrun.serve.sse import sse_event, sse_response
from chainrun.serve.turns import TurnRunner, WireEvent, opened

__all__ = ["MAX_CONVERSATION_ID_CHARS", "MAX_MESSAGE_CHARS", "BadRequest", "chat",
           "parse_chat_body"]  # fmt: skip

MAX_CONVERSATION_ID_CHARS = 200
#: the keys a ``/chat`` body may have
CHAT_KEYS = ("message", "conversation_id", "confirm", "deny")


class BadRequest(ValueError):
    """A request body that does not have the documented shape (message names the field).

    ``param``: the field at fault (None: the body as a whole).
    """

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def parse_decision(raw: bytes) -> dict[str, str]:
    """``{"confirm": ID}`` or ``{"deny": ID}`` of a ``/chat`` body (``{}``: neither).

    Raises:
        BadRequest: not a non-empty string, or both given.
    """
    try:
        body = read_json(raw)
    except NotJSON as e:
        raise BadRequest(str(e), None) from None
    out = {}
    for key in ("confirm", "deny"):
        value = body.get(key) if isinstance(body, dict) else None
        if value is None:
            continue
        if text_problem(value, required=True, max_chars=300) is not None:
            raise BadRequest(f"{key}: expected an action id (a string from an action event)",
                             key)  # fmt: skip
        out[key] = value
    if len(out) > 1:
        raise BadRequest("confirm, deny: give one of them", "confirm")
    return out


def parse_chat_body(raw: bytes) -> tuple[str, str | None]:
    """``(message, conversation_id)`` from a ``/chat`` body; a body with ``confirm`` or
    ``deny`` (an action id) and no message has the message ``yes`` / ``no``.

    Raises:
        BadRequest: not a JSON object; ``message`` missing, blank, not a string, over
            :data:`MAX_MESSAGE_CHARS` or holding a lone surrogate (the library's rule,
            :func:`chainrun.conversations.turn_input.check_turn_input`); ``conversation_id`` not
            such a string of 1 to :data:`MAX_CONVERSATION_ID_CHARS` characters; a key not in
            :data:`CHAT_KEYS` (a typo such as ``conversationId`` would otherwise start a
            new conversation without a word).
    """
    try:
        body = read_json(raw)
    except NotJSON as e:
        raise BadRequest(f"body: expected a JSON object: {e}", None) from None
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object", None)
    for key in body:
        if key not in CHAT_KEYS:
            close = difflib.get_close_matches(str(key), CHAT_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BadRequest(f"{key}: unknown field{hint}; expected {', '.join(CHAT_KEYS)}", key)
    message = body.get("message")
    if message is None and isinstance(body.get("confirm"), str):
        message = "yes"
    elif message is None and isinstance(body.get("deny"), str):
        message = "no"
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


#: the events of a shopper's stream (and the answer step's ``token`` events); the rest
#: (``step``, ``tool``, ``grounding``, other steps' tokens) are the operator's
SHOPPER_EVENTS = frozenset({"turn_started", "products", "action", "answer_done", "turn",
                            "error"})  # fmt: skip
#: the request header an operator asks for every event with (``Chainrun-Events: steps``),
#: taken on a request that passed the bearer token
EVENTS_HEADER = "chainrun-events"


def step_events_wanted(request: Request) -> bool:
    """Whether ``request``'s stream carries the operator's events: ``serve
    --step-events``, or its :data:`EVENTS_HEADER` says ``steps`` and it passed the
    server's bearer token (a shop's backend holds the token, its shoppers do not)."""
    if request.app.state.serve.step_events:
        return True
    asked = request.headers.get(EVENTS_HEADER, "").strip().lower() == "steps"
    return asked and bool(request.scope.get("state", {}).get("authenticated"))


async def _events(
    events: AsyncIterator[WireEvent], answer_step: str, every: bool
) -> AsyncIterator[ServerSentEvent]:
    """The turn's wire events as SSE; without ``every``, only what the shopper may see
    (:data:`SHOPPER_EVENTS` and the answer step's tokens: the answer as released by its
    checks), never a step's raw output nor a check's reasons."""
    async for ev in events:
        if every or ev.event in SHOPPER_EVENTS or (
                ev.event == "token" and ev.data.get("step") == answer_step):  # fmt: skip
            yield sse_event(json.dumps(ev.data), ev.event)


async def chat(request: Request) -> Response:
    """The ``POST /chat`` endpoint (see the module docstring)."""
    received = Received.now()  # the turn's clock starts here
    runner: TurnRunner | None = request.app.state.serve.runner
    if runner is None:
        return not_ready(request)
    raw = await request.body()
    try:
        message, conversation_id = parse_chat_body(raw)
        decision = parse_decision(raw)
    except BadRequest as e:
        return error_response(400, str(e), param=e.param, code="invalid_value")
    asked = Asked(message, conversation_id, confirm=decision.get("confirm"),
                  deny=decision.get("deny"))  # fmt: skip
    turn = await turn_request(request, asked, received)
    if isinstance(turn, Response):
        return turn
    events, refusal = await opened(runner.stream(turn), runner.refusal_wait_s)
    if refusal is not None:  # refused before its turn ran: the status, not a stream
        return refusal_response(refusal)
    return sse_response(_events(events, runner.answer_step, step_events_wanted(request)),
                        keepalive_s=request.app.state.serve.chat_keepalive_s)
