"""What the chain showed for the turns of threads its callers keep, so that a caller's
next request repeats those turns as the chain's prompts had them.

A caller that keeps its own thread (the OpenAI-compatible faces: the client sends the
earlier turns back with every request) sends each earlier turn as two texts, the
shopper's message and the answer. The answer step's prompt had shown more for that turn
(its ``context``: the products and policy sections before the message), and a
conversation's next prompt begins with its previous prompt and answer only when the
history repeats that context (:mod:`chainrun.conversations.history`): that prefix is
what a prompt cache reuses (llama-server reuses a slot's common prefix; OpenAI caches
prompt prefixes). Rendered from the two texts alone, turn 2's prompt shares only the
system text with turn 1's, and the server computes the whole history again.

So the chain records, for each turn of such a thread, what its prompt showed, keyed by
the conversation, the turn's position and its two texts; a later request whose thread
holds a turn with the same conversation, position, message and answer (white space at
either end aside) gets that turn as recorded (its context, the products it showed, its
tool messages). A turn the client changed (an edited message, a regenerated answer)
matches nothing and is taken as the client sent it. Nothing a client did not send is
added: a recorded turn stands in only for the turn it equals.

The record is this process's, in memory, at most :data:`MAX_TURNS` turns (the least
recently used dropped first); after a restart, or on another worker of ``serve
--workers N``, a thread is taken as sent (its answers right, its prompt uncached).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from chainrun.conversations.history import HistoryTurn

__all__ = ["MAX_TURNS", "CallerThreads"]

#: turns recorded at most (a turn's context is a few KB: the default chain's ~400 tokens)
MAX_TURNS = 4096

_Key = tuple[str, int, str, str]


def _key(conversation_id: str, turn_index: int, turn: HistoryTurn) -> _Key:
    return conversation_id, turn_index, turn.message.strip(), turn.answer.strip()


class CallerThreads:
    """The turns the chain answered in threads their callers keep (see the module text).

    Args:
        max_turns: turns recorded at most (>= 0; 0 records nothing).
    """

    def __init__(self, max_turns: int = MAX_TURNS) -> None:
        self.max_turns = max_turns
        self._turns: OrderedDict[_Key, HistoryTurn] = OrderedDict()

    def __len__(self) -> int:
        return len(self._turns)

    def record(self, conversation_id: str, turn_index: int, turn: HistoryTurn) -> None:
        """Keep ``turn`` (the ``turn_index``-th of ``conversation_id``, 1-based) as the
        chain showed it; a turn without a context or tool messages adds nothing to what
        the caller sends and is not kept."""
        if self.max_turns <= 0 or (turn.context is None and not turn.messages):
            return
        key = _key(conversation_id, turn_index, turn)
        self._turns[key] = turn
        self._turns.move_to_end(key)
        while len(self._turns) > self.max_turns:
            self._turns.popitem(last=False)

    def fill(self, conversation_id: str, thread: Sequence[HistoryTurn]) -> tuple[HistoryTurn, ...]:
        """``thread`` (the caller's earlier turns, oldest first, the first at index 1) with
        each turn that equals a recorded one replaced by that one (its message and answer
        as recorded, equal to the caller's but for white space at either end; its context,
        products and tool messages)."""
        out = []
        for i, turn in enumerate(thread, start=1):
            known = None
            if turn.context is None and not turn.messages:
                known = self._turns.get(_key(conversation_id, i, turn))
            if known is None:
                out.append(turn)
                continue
            self._turns.move_to_end(_key(conversation_id, i, turn))
            products = turn.products if turn.products is not None else known.products
            out.append(replace(known, products=products))
        return tuple(out)
