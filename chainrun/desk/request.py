"""One shape for what asks for a turn: :class:`TurnRequest`, built the same way by the
library (:meth:`chainrun.Chain.stream_turn`), ``/chat``, the OpenAI-compatible face and
replays, and admitted by :class:`chainrun.desk.Desk`.

The request's clock starts when it is built (``received``): whatever happens before the
turn's first step (waiting on the log, the key, the owner check) is part of the turn's
logged duration and of the shopper's wait (``turns.admit_ms``, ``answer_ttft_ms``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.turn_input import check_history, check_turn_input
from chainrun.errors import UserInputError
from chainrun.identity import Identity
from chainrun.log.migrations import utc_now

__all__ = ["Received", "TurnRequest"]


@dataclass(frozen=True)
class Received:
    """When a request arrived: ``clock`` (``time.perf_counter()``, s) for durations,
    ``at`` (ISO-8601 UTC, the log's timestamp format) for the turn's ``started_at``."""

    clock: float
    at: str

    @classmethod
    def now(cls) -> Received:
        """This moment."""
        return cls(time.perf_counter(), utc_now())


@dataclass(frozen=True)
class TurnRequest:
    """A request for one turn, from any face.

    Attributes:
        message: the shopper's text (a non-empty string of at most
            :data:`~chainrun.conversations.turn_input.MAX_MESSAGE_CHARS` characters, valid
            Unicode).
        conversation_id: the conversation the turn belongs to (None: a new one, its id in
            :class:`~chainrun.events.TurnFinished`).
        new_conversation: the caller made ``conversation_id`` up for this turn (a face that
            names a new conversation before it starts): nothing of it is read from the log.
        history: the conversation's earlier turns as the caller keeps them, oldest first
            (None: the chain's own record, read from the log when this chain has not seen
            the conversation).
        turn_index: the turn's 1-based position in its conversation (None: the next one).
        user: the shopper as the shop vouched for them (None: no identity; nothing is
            bound or checked).
        end_user: who the caller says the end user is, unverified (OpenAI's ``user``
            field): scopes keys and derived conversation ids where ``user`` is None, and
            is never an identity.
        idempotency_key: the client's ``Idempotency-Key``
            (:mod:`chainrun.desk.keys`).
        cache_key: the prompt-cache affinity key the turn's model calls carry instead of
            the conversation id (a client's hint, scoped by its caller:
            :func:`chainrun.desk.conversations.hinted_cache_key`); None: the
            conversation's.
        confirm / deny: the id of a pending action of the conversation the turn decides.
        request_id: stored with the turn (None: a new one when a key needs it).
        original_ms: the turn's duration in the traffic a replay came from.
        background: a chat UI's background request (a title, tags, follow-ups: its kind,
            :mod:`chainrun.desk.background`): it runs on nothing of the conversation's,
            decides no action and acts on nothing.
        received: when the request arrived (default: when this object was made).

    Raises:
        UserInputError: a bad field (``message: expected a string, got NoneType``), both
            ``confirm`` and ``deny``.
    """

    message: str
    conversation_id: str | None = None
    new_conversation: bool = False
    history: Sequence[HistoryTurn] | None = None
    turn_index: int | None = None
    user: Identity | None = None
    end_user: str | None = None
    idempotency_key: str | None = None
    cache_key: str | None = None
    confirm: str | None = None
    deny: str | None = None
    request_id: str | None = None
    original_ms: float | None = None
    background: str | None = None
    received: Received = field(default_factory=Received.now)

    def __post_init__(self) -> None:
        check_turn_input(self.message, self.request_id, self.conversation_id)
        check_history(self.history, self.turn_index)
        if self.user is not None and not isinstance(self.user, Identity):
            raise UserInputError(f"user: expected an Identity, got {type(self.user).__name__}")
        if self.cache_key is not None and not (isinstance(self.cache_key, str)
                                               and self.cache_key):  # fmt: skip
            raise UserInputError("cache_key: expected a non-empty string")
        if self.confirm is not None and self.deny is not None:
            raise UserInputError("confirm, deny: give one of them")

    @property
    def decision(self) -> str | None:
        """The action id ``confirm`` or ``deny`` names (None: neither)."""
        return self.confirm or self.deny

    @property
    def caller(self) -> str:
        """Whose request this is, for scoping keys and derived ids: the identity's user
        id, else ``~`` and the unverified end user, else "" (anyone)."""
        if self.user is not None:
            return self.user.user_id
        return f"~{self.end_user}" if self.end_user else ""

    def with_request_id(self) -> TurnRequest:
        """This request with a request id (a new random one when it has none)."""
        if self.request_id is not None:
            return self
        return replace(self, request_id=uuid.uuid4().hex)
