"""Clients' ``Idempotency-Key`` s: a request sent again runs nothing a second time, as the
IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field" and Stripe's API ("Idempotent
requests") have it.

A turn started with a key takes it in the run log (``request_keys``) before anything
runs, in one ``insert ... on conflict do nothing``; so of two requests with the same key,
in one process or in several sharing a PostgreSQL log, or after a restart, exactly one
runs. A key is **scoped by its caller** (the identity's user id, else the end user the
client names), as the draft asks servers to scope keys by client and Stripe by account;
a request from nobody in particular (no identity, no end user) by its conversation. So
two callers sending the constant key ``1`` never share a turn. The other request:

- with the same request (a hash of the message, conversation, decision and caller):
  waits for the first one's turn to be logged and yields it (``TurnFinished.repeated``
  true: its answer, as logged), running nothing; past :data:`WAIT_S` s
  :class:`~chainrun.errors.RequestInProgress`;
- with a different request: :class:`~chainrun.errors.IdempotencyKeyReused`.

What pins a key is a turn that ran (Stripe: results are saved once the endpoint began
executing). So a request refused before its turn runs (a bad action id, another caller's
conversation) **releases** its key, and so does a turn that failed or was cancelled
before any tool that acts started (a model server's 503, a stop): its retry runs. A
turn whose process died is logged ``lost`` at the log's next open, on SQLite too (the
key's row names its run), and a retry gets that turn at once.

The tools of a turn get idempotency keys unique across logs and redeploys
(:func:`tool_key`): the log's nonce (made when the log was created) with the turn id, or
with a digest of the client's key for a keyed turn, the same on every retry. Keys are
kept in the log for good (the draft leaves their lifetime to the server).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from chainrun.desk.request import TurnRequest
from chainrun.errors import IdempotencyKeyReused, RequestInProgress
from chainrun.events import Event, TokenDelta, TurnFinished
from chainrun.log.migrations import utc_now
from chainrun.log.store import Store

__all__ = [
    "MAX_KEY_CHARS",
    "POLL_S",
    "WAIT_S",
    "Claim",
    "RequestKeys",
    "key_problem",
    "keyed_conversation_id",
    "tool_key",
]

#: how long a repeated request waits for the first one's turn to be logged, in s
WAIT_S = 120.0
#: between two looks at the log while waiting, in s
POLL_S = 0.05
#: the longest key taken, in characters (the draft sets none; a UUID is 36)
MAX_KEY_CHARS = 255
#: turn statuses that do not pin their key when no tool that acts started: the turn gave
#: no result (the model server failed, the server stopped); its retry runs
UNPINNED = frozenset({"error", "cancelled"})


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an Idempotency-Key (None: it can): empty, longer than
    :data:`MAX_KEY_CHARS`, or holding a control character."""
    if not key:
        return "expected a non-empty value"
    if len(key) > MAX_KEY_CHARS:
        return f"expected at most {MAX_KEY_CHARS} characters, got {len(key)}"
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        return "expected no control characters"
    return None


def _digest(parts: Any) -> str:
    text = json.dumps(parts, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def keyed_conversation_id(client_key: str, caller: str = "") -> str:
    """The conversation id of a request that names none but has ``client_key``: derived
    from the key and the caller (:attr:`TurnRequest.caller`), so that the request sent
    again is in the same conversation and its key finds the first turn (a new random id
    for each would make every retry a new request). ``"k"`` and 31 hex digits of a
    SHA-256."""
    return "k" + _digest(["conversation", caller, client_key])[:31]


def tool_key(nonce: str, request: TurnRequest, turn_id: int | None) -> str:
    """The first part of the idempotency keys a turn's tools get
    (``{this}:{step}:{round}:{position}``): unique across logs and redeploys.

    A keyed request: ``"k"`` and 16 hex digits of a SHA-256 of the log's ``nonce``, the
    caller, the conversation and the client's key: the same on every retry of that
    request to that log. Otherwise ``"{turn id}.{nonce[:8]}"`` (a turn id repeats in
    another log, the nonce does not), or a random UUID without a log (``turn_id`` None).
    """
    if request.idempotency_key is not None:
        return "k" + _digest(["tools", nonce, request.caller, request.conversation_id or "",
                              request.idempotency_key])[:16]  # fmt: skip
    if turn_id is None:
        return uuid.uuid4().hex
    return f"{turn_id}.{nonce[:8]}"


@dataclass(frozen=True)
class Claim:
    """A key taken for a request: what :meth:`RequestKeys.release` needs."""

    scope: str
    key: str
    request_id: str


class RequestKeys:
    """The request keys of one log (see the module text)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def scope(request: TurnRequest) -> str:
        """The key's scope in the log, as JSON: ``["caller", CALLER]``, or
        ``["conversation", ID]`` for a request from nobody in particular."""
        if request.caller:
            return json.dumps(["caller", request.caller], ensure_ascii=False)
        return json.dumps(["conversation", request.conversation_id or ""], ensure_ascii=False)

    async def claim(
        self, request: TurnRequest, run_id: int | None
    ) -> tuple[Claim | None, dict[str, Any] | None]:
        """Take ``request``'s key for it (it has a key and a request id):
        ``(the claim, None)`` when it is this request's to run, ``(None, the key's row)``
        when an earlier request holds it (``request_id``: its turn's).

        Raises:
            IdempotencyKeyReused: the key's first request was a different request.
            The log's errors (the caller waits out an outage, :mod:`chainrun.desk.desk`).
        """
        assert request.idempotency_key is not None and request.request_id is not None
        store = self.store
        digest = _digest([request.message, request.conversation_id, request.confirm,
                          request.deny, request.caller])  # fmt: skip
        scope = self.scope(request)
        mine, row = await store.off_loop(
            store.claim_request_key, scope, request.idempotency_key, digest,
            request.request_id, utc_now(), run_id=run_id,
            conversation_id=request.conversation_id, message=request.message,
        )  # fmt: skip
        if mine:
            return Claim(scope, request.idempotency_key, request.request_id), None
        if row["body_sha256"] != digest:
            raise IdempotencyKeyReused(request.idempotency_key)
        return None, row

    async def release(self, claim: Claim) -> None:
        """Give the key up: its request ran no turn (refused before it ran), or its turn
        gave no result before anything acted (:data:`UNPINNED`)."""
        await self.store.off_loop(self.store.release_request_key, claim.scope, claim.key,
                                  claim.request_id)  # fmt: skip

    async def first_turn(self, row: dict[str, Any]) -> int | None:
        """The id of the key's first turn, once it is logged; None when the key was
        released meanwhile (its first request ran nothing: this one may take it).

        Raises:
            RequestInProgress: not logged within :data:`WAIT_S` s.
        """
        store = self.store
        loop = asyncio.get_running_loop()
        until = loop.time() + WAIT_S
        while True:
            if store.writer is not None:  # this process's own turn may still be queued
                await store.flush()
            turn_id = await store.off_loop(store.turn_of_request, row["request_id"])
            if turn_id is not None:
                return turn_id
            holder = await store.off_loop(store.request_key_holder, row["scope"], row["key"])
            if holder != row["request_id"]:
                return None
            if loop.time() >= until:
                raise RequestInProgress(
                    f"Idempotency-Key {row['key']!r}: the first request with this key is "
                    f"still running after {WAIT_S:g} s; nothing was run"
                )
            await asyncio.sleep(POLL_S)

    async def repeat(self, turn_id: int, key: str, answer_step: str) -> AsyncGenerator[Event, None]:
        """The key's first turn as events: its answer (one :class:`TokenDelta`) and its
        :class:`TurnFinished` with ``repeated`` true."""
        logged = await self.store.aread_turn(turn_id)
        if logged is None:
            raise RequestInProgress(f"Idempotency-Key {key!r}: the first request's turn "
                                    "could not be read from the log")  # fmt: skip
        t = logged.turn
        if t.output:
            yield TokenDelta(step=answer_step, text=t.output)
        yield TurnFinished(
            turn_id=t.id, run_id=t.run_id, output=t.output, status=t.status,
            duration_ms=t.duration_ms or 0.0, label=t.label, verdicts=dict(t.verdicts),
            error_type=t.error_type, answer_ttft_ms=t.answer_ttft_ms,
            answer_done_ms=t.answer_done_ms, truncated=bool(t.truncated),
            conversation_id=t.conversation_id, turn_index=t.turn_index, repeated=True,
            admit_ms=t.admit_ms,
        )  # fmt: skip
