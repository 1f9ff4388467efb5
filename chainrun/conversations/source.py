"""A turn's place in its conversation, as the chain works it out before the turn starts.

Each turn belongs to a conversation: the id the caller gave, or a new one
(:func:`new_conversation_id`). Its history and turn index come from one of two places:

- **given by the caller** (``Chain.stream_turn(..., history=[...])``): the
  OpenAI-compatible faces (the client's ``messages``), a replay (the chain's own earlier
  answers in that run, or the line's ``history``); the turn index is the caller's, or
  one past the history. Such a caller keeps its own thread; of a turn in a named
  conversation the chain keeps only what its prompt showed
  (:class:`~chainrun.conversations.threads.CallerThreads`), so that the next request's
  thread, where it repeats the turn, is rendered as that prompt continued (what a
  prompt cache reuses).
- **the chain's own record** (``history`` None): ``/chat`` and library callers that pass
  only a conversation id; :class:`~chainrun.conversations.memory.ConversationMemory`
  keeps the latest turns of each conversation and reads the run log for one it does
  not know. The turn is remembered when it ends, as it reached the shopper.

Either way the history is cut to the ``[history]`` budget
(:func:`~chainrun.conversations.history.cut_to_budget`), counted with the chain's
:class:`~chainrun.conversations.tokens.TokenCounter`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from chainrun.conversations.history import (
    History,
    HistorySettings,
    HistoryTurn,
    cut_to_budget,
    render_history,
    turn_context,
)
from chainrun.conversations.memory import (
    OUTAGE_WAIT_S,
    ClaimIndex,
    ConversationMemory,
    LoadConversation,
    Loaded,
    TurnStart,
)
from chainrun.conversations.threads import CallerThreads
from chainrun.conversations.tokens import EstimateCounter, TokenCounter
from chainrun.log.rows import WINNER_OUTCOMES, CallRow, StepRow
from chainrun.log.store import Store
from chainrun.retrieval.products import logged_products

__all__ = [
    "LOAD_TIMEOUT_S",
    "OUTAGE_POLL_S",
    "POOL_RETRY_S",
    "SHARED_TIMEOUT_S",
    "WARN_EVERY_S",
    "ConversationSource",
    "LogOutage",
    "TurnPlace",
    "log_claim",
    "log_loader",
    "new_conversation_id",
    "pool_patient",
    "shown_products",
]

log = logging.getLogger("chainrun.conversations")
T = TypeVar("T")
#: s a conversation's read from the log may take before the turn goes on without it
LOAD_TIMEOUT_S = 2.0
#: the same on a log several processes share, and for its turn-index claim: there the
#: log is the conversation's only record (another process may have answered its last
#: turn), so a log that is slow (a busy pool, a loaded machine) is waited for; only one
#: that is down, or silent this long, lets a turn go on from this process's memory
SHARED_TIMEOUT_S = 10.0
#: s between two warnings that conversations went on without their earlier turns
WARN_EVERY_S = 5.0
#: reads of conversations one process sends a shared log at once: its pool's connections
#: but one (:data:`chainrun.log.opening.PG_POOL_MAX`, the writer's); the others wait
#: their turn, and a read's :data:`SHARED_TIMEOUT_S` counts from its turn, so that a
#: pool kept busy by many turns at once (a fresh process meeting forty follow-ups over
#: a slow link) is waited for, not taken for a log that is away
SHARED_READS_AT_ONCE = 3
#: s a read waits for its turn behind the process's other reads at most (a turn's
#: budget: the default answer step's ``deadline_s``); past it the turn goes on without
#: the conversation's earlier turns, said in the warning line
BUSY_WAIT_S = 30.0


def shown_products(steps: Iterable[StepRow]) -> tuple[str, ...] | None:
    """The ids of the products a turn showed: the ``products`` the first of its steps
    that handed them on logged (:func:`~chainrun.retrieval.products.logged_products`,
    whatever its kind); None when none did (skipped, failed, or a chain without a search)."""
    for s in steps:
        shown = logged_products(s.updates) if s.status == "ok" else None
        if shown is not None:
            return tuple(p.id for p in shown)
    return None


def answer_turn(
    calls: Iterable[CallRow], answer_step: str, template: str | None, history: str
) -> tuple[str | None, tuple[dict[str, Any], ...]]:
    """What the answer step's prompt showed of this turn, for the next turn's history:
    ``(context, messages)``.

    ``context``: its first call's last user message without the turn's ``history``
    text (:func:`~chainrun.conversations.history.turn_context`), or that message whole
    when the history went as role messages before it; None when the step sent no call
    or its ``template`` does not begin with ``{history}``. ``messages``: when the step
    called tools, its last round's messages from that user message on (the assistant's
    tool calls and the tool results), else ``()``.
    """
    rows = [c for c in calls if c.step == answer_step and isinstance(c.prompt, list)]
    if template is None or not rows:
        return None, ()
    first = min(rows, key=lambda c: (c.round, c.attempt))
    prompt = first.prompt if isinstance(first.prompt, list) else []
    users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
    content = prompt[users[-1]].get("content") if users else None
    if not isinstance(content, str):
        return None, ()
    at = users[-1]
    as_messages = any(m.get("role") == "assistant" for m in prompt[:at])
    if as_messages:
        context = content if template.startswith("{history}") else None
    else:
        context = turn_context(content, template, history)
    last = max(rows, key=lambda c: (c.round, c.outcome in WINNER_OUTCOMES, -c.attempt))
    messages: tuple[dict[str, Any], ...] = ()
    if last.round > 1 and isinstance(last.prompt, list):
        messages = tuple(last.prompt[at:])
    return context, messages


def new_conversation_id() -> str:
    """A new conversation id: 32 hex digits (a random UUID, RFC 9562 version 4)."""
    return uuid.uuid4().hex


def log_loader(
    store: Store, *, timeout_s: float = LOAD_TIMEOUT_S, outage_wait_s: float = 0.0
) -> LoadConversation:
    """Reads a conversation's latest turns from ``store``: the turns of live runs (a
    replay's or an eval's conversation ids are that run's own), each as its message and
    what reached the shopper (the turn's ``output``). Asynchronous: a PostgreSQL read
    runs in a worker thread (:meth:`chainrun.log.store.Store.off_loop`), so the event
    loop never waits on the database's network.

    The log is behind the answer, never in front of it: when the read fails for want of
    the database (unreachable, or no answer within ``timeout_s`` seconds) the turn goes
    on without the conversation's earlier turns (it starts at turn index 1 in this
    process), and a warning on the ``chainrun.conversations`` logger says so (at most
    every :data:`WARN_EVERY_S` seconds, with the count since the last line). An outage
    of the log (its writer retrying, or the read's own connection failing) is waited out
    until it has lasted ``outage_wait_s`` seconds (:func:`pool_patient`; a log several
    processes share passes ``[log] outage_wait_s``, 0 elsewhere: at once). Any other
    error of the read is raised.

    On a shared PostgreSQL log (``timeout_s`` >= :data:`SHARED_TIMEOUT_S`) at most
    :data:`SHARED_READS_AT_ONCE` reads of this loader run at once, each on one pooled
    connection for its statements; the others wait their turn (up to
    :data:`BUSY_WAIT_S`, then as an unreachable log), and ``timeout_s`` counts from it.
    """
    unreachable = store.unreachable_errors
    said = {"at": -WARN_EVERY_S, "since": 0}
    shared = timeout_s >= SHARED_TIMEOUT_S and store.dialect == "postgresql"
    gate = asyncio.Semaphore(SHARED_READS_AT_ONCE) if shared else None
    session = getattr(store.log, "session", None) if shared else None

    def read(conversation_id: str, keep: int) -> Loaded:
        if session is not None:  # one pooled connection for the read's statements
            with session():
                return read_all(conversation_id, keep)
        return read_all(conversation_id, keep)

    def read_all(conversation_id: str, keep: int) -> Loaded:
        rows, top = store.conversation(conversation_id, last=keep, kinds=("live",))
        rows = [r for r in rows if r.status != "lost"]  # no answer: not in the history
        ids = [r.id for r in rows if r.id is not None]
        steps = store.steps_of_turns(ids) if ids else []
        by_turn: dict[int | None, list[StepRow]] = {}
        for s in steps:
            by_turn.setdefault(s.turn_id, []).append(s)
        return [(r.turn_index or 0, HistoryTurn(r.input, r.output or "",
                                                shown_products(by_turn.get(r.id, []))))
                for r in rows], top  # fmt: skip

    async def load(conversation_id: str, keep: int) -> Loaded:
        try:
            if gate is not None:
                # wait for a turn behind this process's other reads (a busy pool, not
                # an outage), then the read's own time
                async with asyncio.timeout(BUSY_WAIT_S):
                    await gate.acquire()
            try:
                return await pool_patient(store, timeout_s, lambda left: asyncio.wait_for(
                    store.off_loop(read, conversation_id, keep), left),
                    outage_wait_s=outage_wait_s, down=unreachable)  # fmt: skip
            finally:
                if gate is not None:
                    gate.release()
        except unreachable as e:
            said["since"] += 1
            now = time.monotonic()
            if now - said["at"] >= WARN_EVERY_S:
                log.warning(
                    "run log %s could not be read (%s): %d conversation(s) not known to "
                    "this process went on without their earlier turns (last: %s)",
                    store.name, str(e) or type(e).__name__, said["since"], conversation_id,
                )  # fmt: skip
                said["at"], said["since"] = now, 0
            return [], 0

    return load


def log_claim(store: Store, *, outage_wait_s: float = OUTAGE_WAIT_S) -> ClaimIndex | None:
    """The turn-index counter of a log several processes share (a PostgreSQL log:
    :meth:`chainrun.log.store.Store.claim_turn_index`, run off the event loop); None for
    a SQLite log, whose conversations one process serves (its memory hands out the
    indexes, read from the log for a conversation it has not seen). The claim keeps the
    turn's :class:`~chainrun.conversations.memory.TurnStart` in the log, so that a turn
    whose process dies is logged ``lost`` (its index stays taken).

    A claim waits for a slow log up to :data:`SHARED_TIMEOUT_S` and waits out an outage
    of the log until it has lasted ``outage_wait_s`` seconds (:func:`pool_patient`).
    Every try of one claim carries the same token, so a try whose commit reached the
    database but whose answer did not is found in place when tried again: the turn gets
    the index that try took, not the next one. The claim gives None (the turn goes on
    from this process's memory, and a warning line says so) when the database is still
    down after that, or silent for :data:`SHARED_TIMEOUT_S`."""
    if store.dialect != "postgresql":
        return None
    unreachable = store.unreachable_errors

    async def claim(conversation_id: str, start: TurnStart | None) -> int | None:
        kept = {} if start is None else {"run_id": start.run_id, "message": start.message,
                                         "started_at": start.started_at,
                                         "request_id": start.request_id}  # fmt: skip
        token = uuid.uuid4().hex
        try:
            return await pool_patient(store, SHARED_TIMEOUT_S, lambda left: asyncio.wait_for(
                store.off_loop(store.claim_turn_index, conversation_id, token=token, **kept),
                left), outage_wait_s=outage_wait_s, down=unreachable)  # fmt: skip
        except unreachable as e:
            log.warning("run log %s could not be read (%s): conversation %s took its turn "
                        "index from this process's memory", store.name,
                        str(e) or type(e).__name__, conversation_id)  # fmt: skip
            return None

    return claim


class LogOutage(ConnectionError):
    """The log's writer could not reach the database for longer than a turn waits out
    (``[log] outage_wait_s``): the message says for how long (s)."""


#: s between two tries of a read whose pool had no connection to give (a pooler restarting)
POOL_RETRY_S = 0.2
#: s between two looks at the log writer's state while a turn waits out an outage
OUTAGE_POLL_S = 0.05


async def pool_patient(
    store: Store,
    timeout_s: float,
    attempt: Callable[[float], Awaitable[T]],
    *,
    outage_wait_s: float = 0.0,
    down: tuple[type[BaseException], ...] = (),
) -> T:
    """``attempt(s left)`` within ``timeout_s`` in all, tried again:

    - while it fails only because the pool had no connection to give (psycopg_pool's
      ``PoolTimeout``: no statement ran) and the log's writer sees no outage (a busy
      pool), every :data:`POOL_RETRY_S`; a pool that could not connect meanwhile
      (:func:`chainrun.log.backend.pool_cannot_connect`) is an outage, below;
    - while the log is in an outage (its writer retrying a write, or the attempt failing
      with one of ``down``, the errors of an unreachable database), until the outage has
      lasted ``outage_wait_s`` seconds: counted from the writer's first failed try, or
      from this call's first failure when the writer has seen none. While the writer is
      in its outage no attempt is made (each would hold a worker thread for the pool's
      wait); the writer is looked at every :data:`OUTAGE_POLL_S` and the attempt made
      once it is back. Without the writer's word, the attempt is tried again every
      :data:`POOL_RETRY_S`.

    So a short outage (a pooler that restarts, a reset connection) is waited out, and a
    database that stays down holds a call ``outage_wait_s`` at most from its start, at
    once when it started longer ago. ``attempt`` must be safe to try again after a
    failure of ``down`` (a read, or a claim that finds its own earlier try in place).

    Raises:
        LogOutage: the writer's outage lasted ``outage_wait_s`` (or the time ran out)
            while the call waited for it.
        The attempt's last error: the time ran out, the outage outlasted the wait, or it
            is none of the errors above.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    until: float | None = None  # (loop time) when this call stops waiting out an outage

    def outage_lasted() -> float | None:
        """How long the writer has been in its outage (s); None: it is not."""
        since = store.writer.outage_since if store.writer is not None else None
        return None if since is None else max(0.0, time.monotonic() - since)

    def wait_until(lasted: float) -> float:
        nonlocal until
        if until is None:
            until = min(deadline, loop.time() + max(0.0, outage_wait_s - lasted))
        return until

    while True:
        lasted = outage_lasted()
        if lasted is not None:  # no attempt while the writer is in its outage
            end = wait_until(lasted)
            if loop.time() >= end:
                raise LogOutage(f"the database has not answered the log's writer for "
                                f"{lasted:.1f} s")  # fmt: skip
            await asyncio.sleep(min(OUTAGE_POLL_S, end - loop.time()))
            continue
        tried_at = time.monotonic()
        try:
            return await attempt(max(0.0, deadline - loop.time()))
        except Exception as e:
            no_pool = type(e).__name__ == "PoolTimeout"  # no statement ran
            if not (no_pool or isinstance(e, down)):
                raise
            if not no_pool and store.writer is not None:  # down, not a busy pool
                store.writer.note_unreachable(tried_at)  # the outage's start, for its length
            now = loop.time()
            lasted = outage_lasted()
            if lasted is not None:  # the writer is in an outage: waited out at the top
                if now >= wait_until(lasted):
                    raise
                continue
            end = deadline if no_pool else wait_until(0.0)  # a busy pool is not down
            if now + POOL_RETRY_S >= end:
                raise
        await asyncio.sleep(POOL_RETRY_S)


@dataclass(frozen=True)
class TurnPlace:
    """Where a starting turn stands in its conversation.

    Attributes:
        conversation_id: the conversation's id.
        turn_index: the turn's 1-based position in it.
        history: the earlier turns the turn's prompts see (cut to the budget).
        remember: the chain records the turn in its memory when it ends.
        thread: the caller keeps the thread of a named conversation: the chain records
            what the turn's prompt showed (:class:`~chainrun.conversations.threads.CallerThreads`).
    """

    conversation_id: str
    turn_index: int
    history: History
    remember: bool
    thread: bool = False


class ConversationSource:
    """The chain's conversations: its memory, the budget and the token counter.

    Args:
        settings: the ``[history]`` budget.
        load: reads a conversation from the run log (None: no log).
        counter: counts history tokens (default: the character estimate; the chain sets
            the answer step's provider's tokenizer with :meth:`use_counter` at open).
    """

    def __init__(
        self,
        settings: HistorySettings,
        load: LoadConversation | None = None,
        counter: TokenCounter | None = None,
    ) -> None:
        self.settings = settings
        self.memory = ConversationMemory(load, keep_turns=settings.max_turns)
        #: what the prompts showed of the turns of threads the callers keep
        self.threads = CallerThreads()
        self.counter: TokenCounter = counter or EstimateCounter()

    def use_log(self, load: LoadConversation, claim: ClaimIndex | None = None) -> None:
        """Read conversations this chain does not know from the run log with ``load``;
        with ``claim`` (a log shared by several processes: :func:`log_claim`), take every
        turn's index and earlier turns from the log (:mod:`chainrun.conversations.memory`)."""
        self.memory.load = load
        self.memory.claim = claim

    def use_counter(self, counter: TokenCounter) -> None:
        """Count history tokens with ``counter`` from now on."""
        self.counter = counter

    async def aclose(self) -> None:
        """Close the token counter (its HTTP client, if any)."""
        await self.counter.aclose()

    async def begin(
        self,
        conversation_id: str | None,
        history: Sequence[HistoryTurn] | None = None,
        turn_index: int | None = None,
        start: TurnStart | None = None,
        *,
        new: bool = False,
    ) -> TurnPlace:
        """The place of a turn starting now (see the module text; ``start``: kept with
        the turn's index on a shared log; ``new``: ``conversation_id`` was just made up
        by the caller, nothing of it is read from the log)."""
        new = new or conversation_id is None
        cid = conversation_id if conversation_id is not None else new_conversation_id()
        thread = history is not None and not new
        if history is None:
            earlier, index = await self.memory.abegin(cid, new=new, start=start)
            remember = True
        else:
            earlier = self.threads.fill(cid, history) if thread else tuple(history)
            index, remember = len(history) + 1, False
        if turn_index is not None:
            index = turn_index
        kept = await cut_to_budget(earlier, self.settings, self.counter.count)
        text = render_history(kept, self.settings)
        return TurnPlace(cid, index, History(kept, text, len(earlier) - len(kept)), remember,
                         thread)  # fmt: skip

    def end(
        self, place: TurnPlace, message: str, shown: str | None,
        products: tuple[str, ...] | None = None, context: str | None = None,
        messages: tuple[dict[str, Any], ...] = (),
    ) -> None:  # fmt: skip
        """Record an ended turn: the message, what reached the shopper, the products it
        showed and what its answer prompt showed after the history (``context``)."""
        self.answered(place, HistoryTurn(message, shown or "", products, context, messages))

    def answered(self, place: TurnPlace, turn: HistoryTurn) -> None:
        """Record a turn as the shopper has it: in the chain's memory (``place.remember``)
        or as what a turn of a thread its caller keeps showed (``place.thread``). Called
        once the shopper has the whole answer, before the checks after it end, so that
        the conversation's next turn, sent as soon as the answer is in, finds it; and
        again at the turn's end (the record replaced)."""
        if place.remember:
            self.memory.end(place.conversation_id, place.turn_index, turn)
        if place.thread:
            self.threads.record(place.conversation_id, place.turn_index, turn)
