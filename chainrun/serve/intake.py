"""A face's request read into the one :class:`~chainrun.desk.TurnRequest` every face hands
the chain: the one helper ``/chat`` and the OpenAI-compatible faces (Chat Completions,
Responses) build it with.

What a face reads of its body is an :class:`Asked` (the message, the conversation it
names, the chat's opening, the client's thread, a decision, the end user, a background
request's kind); :func:`turn_request` adds what the HTTP request carries (the
``Idempotency-Key`` header, the caller's identity, its request id: the turn's, as its
``x-request-id`` says) and which conversation the turn
belongs to (:mod:`chainrun.desk.conversations`): the one the client names, else one
derived from the chat's opening and the caller, else (a keyed request) one derived from
the key, else a new one; and the client's prompt-cache hint, scoped by the caller
(:func:`~chainrun.desk.conversations.hinted_cache_key`; a background request's is
ignored: it would take the chat's cache for a title). A request that cannot become a
turn is answered here, in the one error shape (:mod:`chainrun.serve.errors`): 400 a bad
field or key, 401 an identity that does not check out, 503 an identity provider whose
keys cannot be had.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import Response

from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.source import new_conversation_id
from chainrun.desk import Received, TurnRequest
from chainrun.desk.conversations import derived_conversation_id, hinted_cache_key
from chainrun.desk.keys import key_problem, keyed_conversation_id
from chainrun.errors import UserInputError
from chainrun.identity import Identity
from chainrun.serve.browsers import request_id
from chainrun.serve.errors import error_response
from chainrun.serve.identity import IdentityRefused, IdentitySource, IdentityUnavailable

__all__ = ["Asked", "caller", "idempotency_key", "turn_request"]


@dataclass(frozen=True)
class Asked:
    """What a face read of its request's body.

    Attributes:
        message: the message the turn answers.
        conversation_id: the conversation the client names (None: none).
        opening: a stateless chat's opening (its instructions and first user message),
            from which its conversation id is derived when it names none.
        history: the client's thread (None: the chain's own record, as ``/chat``).
        confirm / deny: an action id the turn decides.
        end_user: the end user the client names (OpenAI's ``user``), unverified.
        background: a chat UI's background request's kind (None: a shopper's turn).
        cache_hint: the client's prompt-cache hint (OpenAI's ``prompt_cache_key``; None:
            none): the turn's model calls are kept on one cache by it, not by the
            conversation.
    """

    message: str
    conversation_id: str | None = None
    opening: Sequence[str] | None = None
    history: tuple[HistoryTurn, ...] | None = None
    confirm: str | None = None
    deny: str | None = None
    end_user: str | None = None
    background: str | None = None
    cache_hint: str | None = None


def idempotency_key(request: Request) -> tuple[str | None, Response | None]:
    """The request's ``Idempotency-Key`` header (None: none), or the 400 answering a key
    that cannot be one (:func:`chainrun.desk.keys.key_problem`)."""
    key = request.headers.get("idempotency-key")
    problem = key_problem(key) if key is not None else None
    if problem is None:
        return key, None
    return None, error_response(400, f"Idempotency-Key: {problem}", param="Idempotency-Key",
                                code="invalid_value")  # fmt: skip


async def caller(request: Request) -> tuple[Identity | None, Response | None]:
    """The request's identity (None: serve takes none) or the response refusing it: 401
    when the identity header does not check out, 503 when the identity provider's keys
    cannot be had. Whether the identity may use a conversation is the desk's to say."""
    source: IdentitySource | None = getattr(request.app.state, "identity", None)
    if source is None:
        return None, None
    try:
        return await source.identity(request.headers), None
    except IdentityRefused as e:
        return None, error_response(401, str(e), param=source.header, code="invalid_identity")
    except IdentityUnavailable as e:
        return None, error_response(503, str(e), "server_error", code="identity_unavailable",
                                    headers={"Retry-After": "5"})  # fmt: skip


async def turn_request(
    request: Request, asked: Asked, received: Received
) -> TurnRequest | Response:
    """The turn ``request`` asks for (see the module text), or the response refusing it."""
    key, refused = idempotency_key(request)
    if refused is not None:
        return refused
    user, refused = await caller(request)
    if refused is not None:
        return refused
    try:
        turn = TurnRequest(
            asked.message, history=asked.history, user=user, end_user=asked.end_user,
            idempotency_key=key, confirm=asked.confirm, deny=asked.deny,
            background=asked.background, received=received,
            request_id=request_id(request.scope),
        )  # fmt: skip
        # a background request's turn has a conversation of its own, whatever it names
        conversation = asked.conversation_id if asked.background is None else None
        new = False
        if conversation is None and asked.background is None:
            if asked.opening:
                conversation = derived_conversation_id(turn.caller, asked.opening)
            elif key is not None:
                conversation = keyed_conversation_id(key, turn.caller)
        if conversation is None:
            conversation, new = new_conversation_id(), True
        hint = asked.cache_hint if asked.background is None else None
        cache_key = hinted_cache_key(turn.caller, hint) if hint is not None else None
        return replace(turn, conversation_id=conversation, new_conversation=new,
                       cache_key=cache_key)
    except UserInputError as e:
        field, _, _ = str(e).partition(":")
        return error_response(400, str(e), param=field, code="invalid_value")
