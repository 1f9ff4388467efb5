"""The front desk: whether and how a turn runs, decided once, before its first step.

:meth:`Desk.admit` takes a :class:`~chainrun.desk.request.TurnRequest` from any face and
answers with the one value the turn runs with (:class:`Admitted`), the first turn of a
repeated ``Idempotency-Key`` (:class:`Repeated`), or a refusal: an error carrying its
HTTP status (``http_status``, :mod:`chainrun.errors`), raised before anything ran. FastAPI
resolves a request's dependencies the same way before its endpoint runs, a failing one
answering its own HTTP error.

In order:

1. **the caller and the conversation**: a conversation bound to another identity is
   refused (:class:`~chainrun.errors.ConversationForbidden`, 403) before anything of it
   is read or logged; the first identity to use it binds it;
2. **the key** (:mod:`chainrun.desk.keys`): taken, or the first request's turn yielded;
   a refusal from here on releases it;
3. **the input checks**: a message whose checks block it is refused by the turn itself
   (every step skipped); a match that redacts is masked before anything sees it, in the
   caller's history too;
4. **the conversation's place**: its earlier turns and the turn's index
   (:class:`~chainrun.conversations.source.ConversationSource`); a chat UI's background
   request (:mod:`chainrun.desk.background`) gets a place of its own, claiming nothing;
5. **the pending actions' decision** (:class:`~chainrun.actions.confirmations.Confirmations`):
   a yes (claiming the action for this turn at once), a no, an unclear reply, a new
   request; a yes to an action another turn took is told what happened to it; where the
   caller keeps the thread, only an action whose question the thread shows is decided by
   a reply;
6. **the tools**: their idempotency keys (unique across logs, :func:`~chainrun.desk.keys.tool_key`),
   the confirmed actions as one value, and where a ``confirm`` tool's question is
   recorded (the log, before the question is sent). When the turn ends
   (:meth:`Desk.settle`), a claimed action it never started is given back.

Everything the desk reads or writes of the log waits out an outage as the rest of the log
does (``[log] outage_wait_s``, :func:`~chainrun.conversations.source.pool_patient`: the
database's writer is told of each failure, so its "back after N s" counts from the first
one anyone saw); past the wait, a request that needs the log (an owner to check, a key)
is refused with :class:`~chainrun.errors.LogUnavailable` (503), never a traceback. The
desk's waits of one request end, in all, within the outage wait and a look of
:data:`PROBE_S` (a silent database too), before the faces' wait for a refusal. The
time spent here is the turn's (``admit_ms``; the turn's clock starts at the request).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from chainrun.actions.confirmations import Confirmations, Decided
from chainrun.config import ChainConfig
from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.memory import TurnStart
from chainrun.conversations.source import (
    SHARED_TIMEOUT_S,
    ConversationSource,
    TurnPlace,
    pool_patient,
)
from chainrun.desk.keys import UNPINNED, Claim, RequestKeys, tool_key
from chainrun.desk.request import TurnRequest
from chainrun.errors import ConversationForbidden, LogUnavailable, UserInputError
from chainrun.events import Event
from chainrun.identity import Identity
from chainrun.log.migrations import utc_now
from chainrun.log.rows import RunKind, TurnRow
from chainrun.log.store import Store
from chainrun.tools import Tool, TurnTools
from chainrun.tools.runner import KnownProducts

__all__ = ["Admitted", "Desk", "Repeated"]

log = logging.getLogger("chainrun.desk")
T = TypeVar("T")
#: s a request may look at a log known to be away (its pool's connect, a statement)
#: before it is refused: the first look that finds it back ends the outage
PROBE_S = 1.0


@dataclass(frozen=True)
class Repeated:
    """A request whose ``Idempotency-Key`` an earlier request holds: ``events`` are that
    request's turn, read from the log (nothing runs)."""

    events: AsyncGenerator[Event, None]


@dataclass(frozen=True)
class Admitted:
    """The one value a turn runs with (what :class:`chainrun.scheduler.TurnRun` takes).

    Attributes:
        request: the request, with a request id when a key needed one.
        run_id: the run the turn is logged in (None: no log).
        message: the message as the turn's steps and the log see it (checks' matches
            masked).
        place: the turn's conversation, index and history.
        turn_id: the turn's id, taken now when the chain has tools (None: at its write).
        tools: the turn's tool calls (None: the chain has no tools).
        decided: what the turn decided about its conversation's pending actions.
        verdicts: the desk's findings for the turn's ``verdicts`` (``checks``,
            ``confirmation``, ``desk``).
        answer: chainrun's own answer and why, given without running a step (a no, an
            unclear reply, an expired action); None: the steps run.
        blocked: ``(by, text)``: the input checks blocked the message (every step
            skipped, the shopper told ``text``); None: not blocked.
        claim: the request's key, held by this turn (None: no key).
        admit_ms: from the request's arrival to this value, in ms.
    """

    request: TurnRequest
    run_id: int | None
    message: str
    place: TurnPlace
    turn_id: int | None = None
    tools: TurnTools | None = None
    decided: Decided = field(default_factory=Decided)
    verdicts: Mapping[str, Any] = field(default_factory=dict)
    answer: tuple[str, str] | None = None
    blocked: tuple[str, str | None] | None = None
    claim: Claim | None = None
    admit_ms: float = 0.0

    @property
    def t0(self) -> float:
        """The turn's clock start: the request's arrival (``time.perf_counter()``, s)."""
        return self.request.received.clock

    def turn_row(self) -> TurnRow:
        """The turn's log row as it starts."""
        r = self.request
        return TurnRow(id=self.turn_id, input=self.message, request_id=r.request_id,
                       conversation_id=self.place.conversation_id,
                       turn_index=self.place.turn_index, started_at=r.received.at,
                       original_ms=r.original_ms, admit_ms=self.admit_ms,
                       user_id=r.user.user_id if r.user is not None else None,
                       idempotency_key=r.idempotency_key)  # fmt: skip


class Desk:
    """A chain's front desk (see the module text).

    Args:
        config: the chain's config (its input checks, answer step, ``[log]`` waits).
        conversations: the chain's conversations.
        tools: the chain's tools, by name.
        store: the run log (None: no log: nothing bound, no keys, no pending actions).
        kind: the chain's run kind (pending actions are read from runs of this kind).
        act: the chain carries out tools with side effects (a live chain).
        known_products: which product ids the chain's catalogue holds (the tools'
            ``product_arguments``).
    """

    def __init__(
        self, config: ChainConfig, conversations: ConversationSource, tools: Mapping[str, Tool],
        *, store: Store | None, kind: RunKind = "live", act: bool = True,
        known_products: KnownProducts | None = None,
    ) -> None:  # fmt: skip
        self.checks = config.checks.checker()
        self.block_texts = config.checks.block_texts
        self.outage_wait_s = config.log.outage_wait_s
        self.conversations = conversations
        self.tools = tools
        self.store = store
        self.act = act
        self.known_products = known_products
        self.answer_step = config.answer_step
        self.keys = RequestKeys(store) if store is not None else None
        #: the log's pending actions of this chain's conversations (None: no tool has
        #: ``confirm``, or no log)
        self.confirmations = (Confirmations(store, tools, (kind,), known_products)
                              if store is not None and any(t.config.confirm for t in tools.values())
                              else None)  # fmt: skip
        #: the log's nonce (:meth:`open`; a random one without a log)
        self.nonce = uuid.uuid4().hex
        #: monotonic s of the first failure of the log the desk met and has not seen
        #: answer since (None: the log answers)
        self.away_since: float | None = None
        self.away_reason: str | None = None

    async def open(self) -> None:
        """Read what the desk keeps of the log (its nonce).

        Raises:
            LogUnavailable: the log did not answer within the outage wait.
        """
        if self.store is not None:
            self.nonce = await self._read(self.store.log_nonce)

    def status(self) -> dict[str, Any]:
        """``{"state": "ok" | "away", "away_s", "reason"}``: whether the log answered the
        desk's last look (``away_s``: since the first failure it met, s)."""
        since = self.away_since
        if since is None:
            return {"state": "ok", "away_s": None, "reason": None}
        return {"state": "away", "away_s": round(time.monotonic() - since, 3),
                "reason": self.away_reason}  # fmt: skip

    async def look(self) -> dict[str, Any]:
        """:meth:`status`, after one short look at the log (:data:`PROBE_S` at most) when
        the desk's last look found it away: a log that came back while no request asked
        is said back here (``/readyz`` asks this, so that a server taken out of a load
        balancer's rotation for the log's outage is put back without a chat first)."""
        if self.away_since is not None and self.store is not None:
            try:
                await self._read(self.store.log_nonce)
            except LogUnavailable:
                pass  # still away: status says so
        return self.status()

    # -- admitting -------------------------------------------------------------------
    async def admit(self, request: TurnRequest, run_id: int | None) -> Admitted | Repeated:
        """Admit ``request`` (see the module text).

        Raises:
            ConversationForbidden: the conversation is bound to another identity.
            IdempotencyKeyReused: the key was used for a different request.
            RequestInProgress: the key's first request still runs past the wait.
            UserInputError: a ``confirm`` / ``deny`` naming no action of the conversation.
            LogUnavailable: the log the request needs did not answer within the wait.
        """
        # what the desk waits for the log before it refuses, in all: within the faces'
        # wait for a refusal (chainrun.serve.turns.REFUSAL_WAIT_S beyond the outage wait),
        # so that a log that is silent, not refusing, is refused with its HTTP status too
        deadline = asyncio.get_running_loop().time() + self.outage_wait_s + PROBE_S
        if request.user is not None and request.conversation_id is not None and (
                request.background is None):  # fmt: skip
            await self._bind(request.conversation_id, request.user, deadline)
        claim: Claim | None = None
        if request.idempotency_key is not None and self.keys is not None:
            request = request.with_request_id()
            claim, repeated = await self._claim(request, run_id, deadline)
            if repeated is not None:
                return repeated
        try:
            return await self._seat(request, run_id, claim, deadline)
        except BaseException:
            if claim is not None:  # nothing ran: the retry runs
                await self._release(claim)
            raise

    async def settle(self, admitted: Admitted, status: str, tools: TurnTools | None) -> None:
        """The turn ended with ``status``, its tool calls ``tools``. A turn that gave no
        result (:data:`UNPINNED`) and acted on nothing (no tool that acts started, no call
        became a pending action) gives its key up: its retry runs. The actions it claimed
        and never started go back to the shopper; those it asked are withdrawn when its
        answer was not their question (:meth:`Confirmations.settle`)."""
        acted = tools is not None and tools.acted
        if admitted.claim is not None and status in UNPINNED and not acted:
            await self._release(admitted.claim)
        if self.confirmations is not None:
            await self.confirmations.settle(admitted.decided, status, tools)

    async def _claim(
        self, request: TurnRequest, run_id: int | None, deadline: float
    ) -> tuple[Claim | None, Repeated | None]:
        """The key's claim by ``request``, or the first request's turn (:class:`Repeated`);
        ``deadline``: loop time the first claim's wait for the log ends (a claim made
        again after the first request was waited for has a wait of its own)."""
        assert self.keys is not None and request.idempotency_key is not None
        keys = self.keys
        while True:
            claim, first = await self._patient(
                lambda left: asyncio.wait_for(keys.claim(request, run_id), left), deadline)
            if first is None:
                return claim, None
            try:
                turn_id = await keys.first_turn(first)
            except self._unreachable as e:
                raise self._unavailable(e) from None
            if turn_id is not None:
                return None, Repeated(keys.repeat(turn_id, request.idempotency_key,
                                                  self.answer_step))  # fmt: skip
            # released meanwhile (its request ran nothing): take it
            deadline = asyncio.get_running_loop().time() + self.outage_wait_s + PROBE_S

    async def _seat(self, request: TurnRequest, run_id: int | None,
                    claim: Claim | None, deadline: float) -> Admitted:  # fmt: skip
        checked = self.checks.check(request.message)
        message = checked.text if checked.findings else request.message
        background = request.background is not None
        if request.decision is not None and not background:
            # an unknown action id is the request's mistake: refused before the turn
            # claims its index in the conversation (a chain without tools has none)
            if self.confirmations is None:
                raise UserInputError(f"confirm: no action {request.decision!r} waits: this "
                                     "chain has no tools that ask for a confirmation")
            await self.confirmations.check_known(request.conversation_id, request.decision)
        history = self._masked(request.history)
        start = TurnStart(run_id, message, request.received.at, request.request_id)
        if background:  # a place of its own: nothing of the conversation read or claimed
            own = request.conversation_id if request.new_conversation else None
            place = await self.conversations.begin(own, history or (), None, start, new=True)
        else:
            place = await self.conversations.begin(
                request.conversation_id, history, request.turn_index, start,
                new=request.new_conversation)  # fmt: skip
        if request.user is not None and request.conversation_id is None and not background:
            await self._bind(place.conversation_id, request.user, deadline)
        turn_id = await self.store.areserve_turn_id() if self.tools and self.store else None
        decided = Decided()
        if self.confirmations is not None and not checked.blocked and not background:
            decided = await self.confirmations.decide(
                place.conversation_id, place.turn_index, message, turn_id=turn_id,
                user=request.user, confirm=request.confirm, deny=request.deny,
                shown=request.history[-1].answer if request.history else None,
                last=place.history.turns[-1].answer if place.history.turns else None,
                received_at=request.received.at, run_id=run_id,
            )  # fmt: skip
        verdicts: dict[str, Any] = {}
        if decided.decisions:
            verdicts["confirmation"] = {"decisions": decided.decisions}
        if checked.findings:
            verdicts["checks"] = checked.as_json()
        if background:
            verdicts["desk"] = {"background": request.background}
        return Admitted(
            request=request, run_id=run_id, message=message, place=place, turn_id=turn_id,
            tools=await self._tools(request, place, turn_id, decided, run_id), decided=decided,
            verdicts=verdicts, claim=claim,
            answer=(decided.answer, decided.why) if decided.answer is not None else None,
            blocked=(("checks", checked.block_text(self.block_texts)) if checked.blocked
                     else None),
            admit_ms=(time.perf_counter() - request.received.clock) * 1000.0,
        )  # fmt: skip

    def _masked(self, history: Sequence[HistoryTurn] | None) -> Sequence[HistoryTurn] | None:
        """The caller's thread with what the input checks mask masked."""
        if history is None:
            return None
        mask = self.checks.check
        return [replace(h, message=mask(h.message).text,
                        context=None if h.context is None else mask(h.context).text)
                for h in history]  # fmt: skip

    async def _tools(self, request: TurnRequest, place: TurnPlace, turn_id: int | None,
                     decided: Decided, run_id: int | None) -> TurnTools | None:  # fmt: skip
        """The turn's tool calls (clear to act once the turn's run says so)."""
        if not self.tools:
            return None
        store = self.store
        recorded: dict[str, str] = {}
        if (not self.act and store is not None and request.request_id is not None
                and any(t.config.replay == "record" for t in self.tools.values())):
            recorded = await store.off_loop(store.recorded_tool_results, request.request_id)
        return TurnTools(self.tools, turn_key=tool_key(self.nonce, request, turn_id),
                         turn_id=turn_id, conversation_id=place.conversation_id,
                         act=self.act, turn_index=place.turn_index, user=request.user,
                         recorded=recorded, known_products=self.known_products,
                         confirmed=decided.confirmed,
                         ask=(self.confirmations.asker(run_id)
                              if self.confirmations is not None else None),
                         background=request.background is not None)  # fmt: skip

    # -- the log, patiently ------------------------------------------------------------
    async def _bind(self, conversation_id: str, user: Identity, deadline: float) -> None:
        """Bind the conversation to ``user`` unless it is bound (in the log, so every
        process sharing it agrees); ``deadline``: as :meth:`_patient`'s.

        Raises:
            ConversationForbidden: it is bound to another identity (nothing said of it).
        """
        if self.store is None:
            return
        owner = await self._read(self.store.bind_conversation, conversation_id,
                                 user.user_id, utc_now(), deadline=deadline)  # fmt: skip
        if owner != user.user_id:
            raise ConversationForbidden("this conversation belongs to another user")

    async def _release(self, claim: Claim) -> None:
        """Give a key up, quietly: a log that does not answer keeps it (its retry waits
        for the first request as before)."""
        assert self.keys is not None
        keys = self.keys
        try:
            await self._patient(lambda left: asyncio.wait_for(keys.release(claim), left))
        except LogUnavailable as e:
            log.warning("Idempotency-Key %r was not released (%s)", claim.key, e)

    @property
    def _unreachable(self) -> tuple[type[BaseException], ...]:
        assert self.store is not None
        return self.store.unreachable_errors

    async def _read(self, fn: Callable[..., T], *args: Any,
                    deadline: float | None = None) -> T:  # fmt: skip
        """``fn(*args)`` (a read or a one-statement write of the store) off the loop,
        patiently (see :meth:`_patient`)."""
        store = self.store
        assert store is not None
        return await self._patient(lambda left: asyncio.wait_for(store.off_loop(fn, *args),
                                                                 left), deadline)  # fmt: skip

    async def _patient(self, attempt: Callable[[float], Awaitable[T]],
                       deadline: float | None = None) -> T:  # fmt: skip
        """``attempt(s left)`` through :func:`~chainrun.conversations.source.pool_patient`:
        a busy pool and an outage shorter than ``[log] outage_wait_s`` are waited out, for
        :data:`~chainrun.conversations.source.SHARED_TIMEOUT_S` at most, and no later than
        ``deadline`` (loop time; None: none; a look of :data:`PROBE_S` at least): a
        database that is silent (a hung server, a dropped network path) fails no attempt,
        and is refused there. Once a request was refused for the log being away, the next
        ones look once, for :data:`PROBE_S` at most, until one finds it back: refused at
        once meanwhile.

        Raises:
            LogUnavailable: the log did not answer within the wait (said in one line).
        """
        store = self.store
        assert store is not None
        timeout_s = SHARED_TIMEOUT_S
        if deadline is not None:  # one short look at least
            left = deadline - asyncio.get_running_loop().time()
            timeout_s = min(timeout_s, max(left, PROBE_S))
        try:
            if self.away_since is not None:  # known away: one short look, no wait
                look_s = min(PROBE_S, timeout_s)
                got = await asyncio.wait_for(attempt(look_s), look_s)
            else:
                got = await pool_patient(store, timeout_s, attempt,
                                         outage_wait_s=self.outage_wait_s,
                                         down=store.unreachable_errors)  # fmt: skip
        except store.unreachable_errors as e:
            raise self._unavailable(e) from None
        self.away_since = self.away_reason = None
        return got

    def _unavailable(self, error: BaseException) -> LogUnavailable:
        """The refusal of a request the log did not answer; the outage's start said once."""
        now = time.monotonic()
        reason = (str(error).splitlines() or [""])[0] or type(error).__name__
        if self.away_since is None:
            self.away_since = now
            log.warning("run log %s did not answer the front desk (%s): requests that need "
                        "it are refused (503) until it does", self.store.name if self.store
                        else "", reason)  # fmt: skip
        self.away_reason = reason
        return LogUnavailable(f"the run log did not answer within {self.outage_wait_s:g} s "
                              f"(away for {now - self.away_since:.1f} s: {reason}); nothing "
                              "was run, try again")  # fmt: skip
