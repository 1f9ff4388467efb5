"""Where a chain finds a conversation's earlier turns: in memory, else in the run log.

A chat backend (``/chat``, ``Chain.stream_turn(message, conversation_id=...)``) gives
only the conversation id; the earlier turns are the log's. Reading them from the log
on every turn would wait for the log's writer (a turn returns once its rows are
queued, before they are committed), so the chain keeps each conversation's latest
turns in memory as they end, and reads the log only for a conversation it has not
seen since it opened (a conversation resumed after a restart, or served before by
another chain on the same log). At most ``max_conversations`` conversations are kept,
the least recently used dropped first (read again from the log when they come back).

Turn indexes are handed out here, 1-based and in start order: a turn that starts
while an earlier turn of its conversation is still running gets the next index, and
does not see that turn in its history (it has not ended).

**On a log shared by several processes** (``serve --workers N`` on PostgreSQL, where
each message of a conversation may reach another worker), memory alone would answer
from a stale thread: the memory is given a ``claim`` (the log's atomic per-conversation
counter, :meth:`chainrun.log.store.Store.claim_turn_index`) and then every turn takes
its index from the log, reads the conversation's earlier turns from the log (waiting
up to :data:`WAIT_FOR_EARLIER_S` for the turn just before it, which another process may
still be committing), and adds the turns this process ended that the log does not hold
yet. The claim and the reads wait out a short outage of the log (up to
:data:`OUTAGE_WAIT_S` from its start: :func:`chainrun.conversations.source.pool_patient`);
only a claim that still fails hands the turn to this process's memory, as on a log of
one process.

A chain reads the log without the event loop waiting on it (:meth:`ConversationMemory.abegin`
with a loader that returns an awaitable: a PostgreSQL read runs in a worker thread);
turns of one conversation that start while its read is in flight share that read.
"""

from __future__ import annotations

import asyncio
import bisect
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from chainrun.conversations.history import HistoryTurn

__all__ = [
    "OUTAGE_WAIT_S",
    "WAIT_FOR_EARLIER_S",
    "ClaimIndex",
    "ConversationMemory",
    "LoadConversation",
    "TurnStart",
]

#: s a turn on a shared log waits for its conversation's previous turn to be in the log
#: (another process answered it and may still be committing it: a writer commits within
#: milliseconds, within seconds on a loaded machine) before it goes on without it
WAIT_FOR_EARLIER_S = 5.0
#: s a turn on a shared log waits out an outage of the log (counted from its start) for
#: its index and earlier turns before it goes on from this process's memory (``[log]
#: outage_wait_s``). A pooler's restart or a reset connection is over within it
#: (PgBouncer's restart under load took 1.6-2.1 s, and its log writer saw the outage
#: end up to 1 s later, its retries backing off to 1 s: benchmarks/README.md, pg_fleet
#: conversations), and a turn that went on from memory meanwhile could repeat an index
#: another process gave or miss the turns it answered; a database that stays down does
#: not hold every turn longer than this
OUTAGE_WAIT_S = 5.0
#: s between the first two reads of the log while waiting for the previous turn (then
#: doubled up to :data:`POLL_MAX_S`, so that waiting turns do not crowd the log's pool)
POLL_S = 0.025
#: s between two such reads at most
POLL_MAX_S = 0.4


@dataclass(frozen=True)
class TurnStart:
    """What a claim keeps of the turn it numbers, so that the turn is logged ``lost``
    should its process die before the turn's rows are written
    (:func:`chainrun.log.lifecycle.log_lost_turns`).

    Attributes:
        run_id: the run the turn is logged in.
        message: the shopper's message as it is to be logged (checks' matches masked).
        started_at: when the turn started (ISO-8601 UTC).
        request_id: the turn's request id (a lost turn keeps it: a client's retry with
            the same ``Idempotency-Key`` then finds it).
    """

    run_id: int | None
    message: str
    started_at: str
    request_id: str | None = None


#: ``claim(conversation_id, start) -> the next turn index``, handed out once across
#: processes (None: the log could not say; this process's memory hands it out)
ClaimIndex = Callable[[str, "TurnStart | None"], Awaitable[int | None]]

#: what a conversation's read from the log gives: (the latest `keep` turns as (turn
#: index, turn), oldest first; the highest turn index logged, 0 for none)
Loaded = tuple[list[tuple[int, HistoryTurn]], int]
#: ``load(conversation_id, keep) -> Loaded``, or an awaitable of it (for
#: :meth:`ConversationMemory.abegin`)
LoadConversation = Callable[[str, int], "Loaded | Awaitable[Loaded]"]


@dataclass
class _Conversation:
    #: (turn index, turn), by index
    turns: list[tuple[int, HistoryTurn]] = field(default_factory=list)
    last_index: int = 0


class ConversationMemory:
    """Each conversation's latest turns and next turn index (see the module text).

    Args:
        load: reads a conversation from the log (None: no log; every unknown
            conversation starts empty).
        keep_turns: turns kept per conversation (the history budget's ``max_turns``).
        max_conversations: conversations kept in memory at most.
        claim: a log shared by several processes: the log's turn-index counter (see the
            module text; None: this process hands out the indexes).
    """

    def __init__(
        self,
        load: LoadConversation | None,
        *,
        keep_turns: int,
        max_conversations: int = 4096,
        claim: ClaimIndex | None = None,
    ) -> None:
        self.load = load
        self.claim = claim
        self.keep_turns = keep_turns
        self.max_conversations = max_conversations
        self._conversations: OrderedDict[str, _Conversation] = OrderedDict()
        #: reads from the log in flight (:meth:`abegin`), by conversation id
        self._loading: dict[str, asyncio.Future[_Conversation]] = {}
        #: conversations read from the log (misses), for tests and diagnostics
        self.loads = 0

    def _keep(self, conversation_id: str, conv: _Conversation) -> None:
        """Hold ``conv`` as the most recently used; drop the least recently used past
        ``max_conversations``."""
        self._conversations[conversation_id] = conv
        self._conversations.move_to_end(conversation_id)
        if len(self._conversations) > self.max_conversations:
            self._conversations.popitem(last=False)

    def _get(self, conversation_id: str, *, new: bool) -> _Conversation:
        conv = self._conversations.get(conversation_id)
        if conv is not None:
            self._conversations.move_to_end(conversation_id)
            return conv
        conv = _Conversation()
        if self.load is not None and not new:
            self.loads += 1
            loaded = self.load(conversation_id, self.keep_turns)
            if inspect.isawaitable(loaded):
                close = getattr(loaded, "close", None)
                if close is not None:
                    close()  # never awaited: say so rather than warn of it later
                raise TypeError("this conversation loader is asynchronous: use abegin()")
            conv.turns, conv.last_index = loaded
        self._keep(conversation_id, conv)
        return conv

    async def _load(self, conversation_id: str) -> _Conversation:
        assert self.load is not None
        self.loads += 1
        loaded = self.load(conversation_id, self.keep_turns)
        turns, last_index = await loaded if inspect.isawaitable(loaded) else loaded
        conv = _Conversation(list(turns), last_index)
        self._keep(conversation_id, conv)
        return conv

    async def abegin(
        self, conversation_id: str, *, new: bool = False, start: TurnStart | None = None
    ) -> tuple[tuple[HistoryTurn, ...], int]:
        """:meth:`begin` for a chain: a conversation not in memory is read with ``load``
        awaited (an asynchronous loader does not hold the event loop); turns of the same
        conversation that start meanwhile wait for that one read. ``start``: handed to
        ``claim`` with the conversation id.

        Raises:
            Whatever ``load`` raised (the conversation stays unknown: read again by the
            next turn).
        """
        if self.claim is not None:
            claimed = await self.claim(conversation_id, start)
            if claimed is not None:
                return await self._shared_begin(conversation_id, claimed, new=new)
            # the log could not say: this process's memory (and the log, if it answers)
        conv = self._conversations.get(conversation_id)
        if conv is None and self.load is not None and not new:
            pending = self._loading.get(conversation_id)
            if pending is None:
                pending = asyncio.ensure_future(self._load(conversation_id))
                self._loading[conversation_id] = pending
                pending.add_done_callback(lambda _: self._loading.pop(conversation_id, None))
            conv = await asyncio.shield(pending)
            self._keep(conversation_id, conv)  # (evicted meanwhile: held again)
        elif conv is None:
            conv = self._get(conversation_id, new=True)
        else:
            self._conversations.move_to_end(conversation_id)
        conv.last_index += 1
        return tuple(t for _, t in conv.turns), conv.last_index

    async def _shared_begin(
        self, conversation_id: str, index: int, *, new: bool
    ) -> tuple[tuple[HistoryTurn, ...], int]:
        """A turn on a shared log whose index the log's counter gave: its history the
        log's turns before it (waited for) with this process's own ended turns added."""
        turns: dict[int, HistoryTurn] = {}
        if index > 1 and not new and self.load is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_FOR_EARLIER_S
            poll = POLL_S
            while True:
                self.loads += 1
                loaded = self.load(conversation_id, self.keep_turns)
                rows, top = await loaded if inspect.isawaitable(loaded) else loaded
                if top >= index - 1 or loop.time() >= deadline:
                    break
                await asyncio.sleep(min(poll, max(0.0, deadline - loop.time())))
                poll = min(poll * 2, POLL_MAX_S)
            turns = {i: t for i, t in rows if i < index}
        own = self._conversations.get(conversation_id)
        if own is not None:
            turns.update({i: t for i, t in own.turns if i < index})
        conv = own or _Conversation()
        conv.last_index = max(conv.last_index, index)
        self._keep(conversation_id, conv)
        kept = [turns[i] for i in sorted(turns)][-self.keep_turns:] if self.keep_turns else []
        return tuple(kept), index

    def begin(
        self, conversation_id: str, *, new: bool = False
    ) -> tuple[tuple[HistoryTurn, ...], int]:
        """A starting turn's history (the conversation's kept turns, oldest first) and
        its turn index. ``new``: the id was just made for this turn (no log lookup)."""
        conv = self._get(conversation_id, new=new)
        conv.last_index += 1
        return tuple(t for _, t in conv.turns), conv.last_index

    def end(self, conversation_id: str, turn_index: int, turn: HistoryTurn) -> None:
        """Record an ended turn (whatever its status: what reached the shopper), or an
        answered one whose checks still run; a turn recorded again at its end replaces
        its earlier record."""
        conv = self._get(conversation_id, new=True)
        conv.turns = [(i, t) for i, t in conv.turns if i != turn_index]
        bisect.insort(conv.turns, (turn_index, turn), key=lambda it: it[0])
        del conv.turns[: max(0, len(conv.turns) - self.keep_turns)]
        conv.last_index = max(conv.last_index, turn_index)

    def __len__(self) -> int:
        return len(self._conversations)
