"""Clients' ``Idempotency-Key`` s: a request sent again runs nothing a second time.

The IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field" names the field; the
``openai`` SDK sends one on every POST and keeps it across its own retries. A turn
started with a key takes it in the run log (``request_keys``, one row per conversation
and key: the scope is the conversation id, or "" for a request without one) before
anything runs, in one ``insert ... on conflict do nothing``; so of two requests with the
same key, in one process or in several sharing a PostgreSQL log, or after a restart,
exactly one runs. The other:

- with the same request (a hash of the message, conversation, decision and user): waits
  for the first one's turn to be logged and yields it (``TurnFinished.repeated`` true:
  its answer, as logged), running nothing; past :data:`WAIT_S` s
  :class:`~chainrun.errors.RequestInProgress`;
- with a different request: :class:`~chainrun.errors.IdempotencyKeyReused` (serve: 422
  naming the key).

The tools of a turn started with a key get idempotency keys derived from it
(:func:`tool_key_prefix`), so the shop's own services can deduplicate across retries
too. Keys are kept in the log for good (the draft leaves their lifetime to the server).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from chainrun.errors import IdempotencyKeyReused, RequestInProgress
from chainrun.events import Event, TokenDelta, TurnFinished
from chainrun.log.migrations import utc_now
from chainrun.log.store import Store

__all__ = [
    "MAX_KEY_CHARS",
    "POLL_S",
    "WAIT_S",
    "RequestKeys",
    "key_problem",
    "keyed_conversation_id",
    "tool_key_prefix",
]

#: how long a repeated request waits for the first one's turn to be logged, in s
WAIT_S = 120.0
#: between two looks at the log while waiting, in s
POLL_S = 0.05
#: the longest key taken, in characters (the draft sets none; a UUID is 36)
MAX_KEY_CHARS = 255


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


def keyed_conversation_id(client_key: str, user_id: str | None = None) -> str:
    """The conversation id of a request that names none but has ``client_key``: derived
    from the key (and the caller's identity, when serve takes one), so that the
    request sent again is in the same conversation and its key finds the first turn
    (a new random id for each would make every retry a new request).
    ``"k"`` and 31 hex digits of ``sha256(user_id, key)``."""
    return "k" + hashlib.sha256(f"{user_id or ''}\0{client_key}".encode()).hexdigest()[:31]


def tool_key_prefix(client_key: str, conversation_id: str | None) -> str:
    """The first half of a tool's idempotency key in a turn started with ``client_key``:
    ``"{sha256(scope, key)[:16]}"`` (hex), the same for every retry of that request
    (the turn id differs from one retry to the next; the key does not)."""
    scope = conversation_id or ""
    return "k" + hashlib.sha256(f"{scope}\0{client_key}".encode()).hexdigest()[:16]


def _digest(parts: Any) -> str:
    text = json.dumps(parts, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class RequestKeys:
    """The request keys of one log (see the module text)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def claim(
        self, key: str, conversation_id: str | None, request_id: str, request: Any
    ) -> dict[str, Any] | None:
        """Take ``key`` for ``request_id``; None: taken (run the turn), else the first
        request's key row (``request_id``: its turn's).

        Raises:
            IdempotencyKeyReused: the key's first request was a different ``request``.
        """
        store = self.store
        digest = _digest(request)
        mine, row = await store.off_loop(store.claim_request_key, conversation_id or "", key,
                                         digest, request_id, utc_now())  # fmt: skip
        if mine:
            return None
        if row["body_sha256"] != digest:
            raise IdempotencyKeyReused(key)
        return row

    async def first_turn(self, row: dict[str, Any]) -> int:
        """The id of the key's first turn, once it is logged.

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
            if loop.time() >= until:
                raise RequestInProgress(
                    f"Idempotency-Key {row['key']!r}: the first request with this key is "
                    f"still running (or was lost) after {WAIT_S:g} s; nothing was run"
                )
            await asyncio.sleep(POLL_S)

    async def repeat(self, row: dict[str, Any], answer_step: str) -> AsyncGenerator[Event, None]:
        """The key's first turn as events: its answer (one :class:`TokenDelta`) and its
        :class:`TurnFinished` with ``repeated`` true."""
        turn_id = await self.first_turn(row)
        logged = await self.store.aread_turn(turn_id)
        if logged is None:
            raise RequestInProgress(f"Idempotency-Key {row['key']!r}: the first request's "
                                    "turn could not be read from the log")  # fmt: skip
        t = logged.turn
        if t.output:
            yield TokenDelta(step=answer_step, text=t.output)
        yield TurnFinished(
            turn_id=t.id, run_id=t.run_id, output=t.output, status=t.status,
            duration_ms=t.duration_ms or 0.0, label=t.label, verdicts=dict(t.verdicts),
            error_type=t.error_type, answer_ttft_ms=t.answer_ttft_ms,
            answer_done_ms=t.answer_done_ms, truncated=bool(t.truncated),
            conversation_id=t.conversation_id, turn_index=t.turn_index, repeated=True,
        )  # fmt: skip
