"""Prompt-cache affinity: keeping a conversation's requests on the cache that holds its
earlier prompts.

A conversation's next turn repeats its earlier turns' prompt, which a server's prompt
cache can reuse only when the request reaches the cache that holds it:

- **OpenAI and Azure OpenAI** route a request by a hash of its prompt's first tokens
  and cache prefixes of 1,024 tokens and more; the ``prompt_cache_key`` request
  parameter keeps requests that share a key on the same cache (OpenAI's prompt caching
  guide). chainrun sends the turn's conversation id (or a key the provider's config
  names) as that key (mode ``key``).
- **llama-server** keeps each slot's last prompt (and, with ``--cache-ram``, more
  prefixes in host memory); a request may name its slot (``id_slot``) and ask the
  server to reuse the slot's common prefix (``cache_prompt``, llama.cpp's server
  README). With several slots and no affinity, a conversation's next turn usually lands
  on a slot that another prompt has taken since. In mode ``slot`` the answer step of a
  conversation keeps one slot (:class:`SlotTable`), and the other steps' requests (the
  checks after the answer) are placed on other slots.

The mode is a provider setting (``prompt_cache`` in ``[providers.NAME]``); ``auto``
picks what is harmless where: ``slot`` for the embedded local model, ``key`` for
OpenAI's own API and Azure, ``off`` for other servers (a server that refuses unknown
parameters would refuse a key it does not know).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["AffinityMode", "PromptCacheMode", "SlotTable", "rendezvous_order", "resolve_mode"]

#: how a provider keeps a conversation on one prompt cache (see the module text)
PromptCacheMode = Literal["auto", "key", "slot", "off"]
#: a resolved mode (``auto`` decided)
AffinityMode = Literal["key", "slot", "off"]

#: hosts whose API takes ``prompt_cache_key`` (OpenAI's prompt caching guide)
KEY_HOSTS = ("api.openai.com",)


def rendezvous_order(key: str, names: Sequence[str]) -> list[int]:
    """Indexes of ``names`` ranked for ``key`` by rendezvous (highest random weight)
    hashing: the weight of a name is the first 8 bytes of BLAKE2b(key, name), highest
    first (Thaler and Ravishankar 1998). The same on every machine and process."""

    def weight(i: int) -> tuple[int, int]:
        h = hashlib.blake2b(f"{key}\x00{names[i]}".encode(), digest_size=8).digest()
        return (int.from_bytes(h, "big"), -i)

    return sorted(range(len(names)), key=weight, reverse=True)


def _slot_rank(key: str, slots: int) -> list[int]:
    """Each slot's place in ``key``'s order of ``slots`` slots (0: first), by rendezvous
    hashing (:func:`rendezvous_order`)."""
    rank = [0] * slots
    for place, s in enumerate(rendezvous_order(key, [f"slot-{i}" for i in range(slots)])):
        rank[s] = place
    return rank


def resolve_mode(mode: PromptCacheMode, *, kind: str, base_url: str | None) -> AffinityMode:
    """The mode a provider uses: ``mode`` itself unless it is ``auto``, which is
    ``slot`` for the embedded local model (``base_url`` None on an ``openai`` provider),
    ``key`` for Azure OpenAI and OpenAI's own API, ``off`` for any other server."""
    if mode != "auto":
        return mode
    if kind == "azure":
        return "key"
    if base_url is None:
        return "slot"
    host = urlsplit(base_url).hostname or ""
    return "key" if host in KEY_HOSTS else "off"


class SlotTable:
    """Which llama-server slot each conversation's answer step keeps, in one process.

    A conversation's answer request takes the slot it had last time when that slot is
    free; a conversation without one takes the free slot that no conversation keeps,
    else the free slot kept by the conversation seen longest ago (which then loses it),
    and keeps it from then on. While its slot is busy (a hedge's copy of the answer, a
    second turn of the conversation at once) the request goes elsewhere as a check does
    and the conversation keeps its slot. Any other request (a check after the answer, a
    request with no conversation) takes a free slot other than its conversation's,
    preferring slots that no conversation keeps, then the least recently kept. When
    every slot is busy with this provider's requests the request names no slot and the
    server places it (it queues a request that names a busy slot: a pinned answer would
    wait for another's).

    The table is this process's: processes sharing one server (``serve --workers``)
    keep tables of their own, so two of them may send conversations to one slot; the
    server's ``--cache-ram`` prompt cache then keeps the displaced prefix. Among slots
    equally free, a conversation new to the table takes the first in its own order of
    the slots (rendezvous hashing of the conversation id: the same in every process),
    so that two processes do not both give their first conversations slot 0, and a
    conversation whose next turn reaches another process finds the slot it had when
    that process has it free too.

    Args:
        slots: the server's slot count (``-np``; ``total_slots`` of ``GET /props``), >= 1.
        max_conversations: conversations remembered at most (the least recently seen
            forgotten first).

    Raises:
        ValueError: ``slots`` < 1.
    """

    def __init__(self, slots: int, max_conversations: int = 4096) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self._max = max_conversations
        #: conversation -> slot it keeps, least recently seen first
        self._slot_of: OrderedDict[str, int] = OrderedDict()
        self._keeper: list[str | None] = [None] * slots
        self._busy = [0] * slots
        self._kept_at = [0] * slots
        self._tick = 0

    def keeper(self, slot: int) -> str | None:
        """The conversation that keeps ``slot`` (None: none)."""
        return self._keeper[slot]

    def acquire(self, key: str | None, owner: bool) -> int | None:
        """The slot for one request (None: name none), marked busy until :meth:`release`.

        ``key``: its conversation (None: none); ``owner``: it is the conversation's
        answer step, which keeps the slot.
        """
        free = [s for s in range(self.slots) if self._busy[s] == 0]
        if not free:
            return None
        mine = self._slot_of.get(key) if key is not None else None
        if owner and key is not None and (mine is None or mine in free):
            slot = mine if mine is not None else self._coldest(free, key)
            self._keep(key, slot)
        else:
            # a check, or the answer while its own slot is busy (a hedge's copy, a second
            # turn of the conversation at once): elsewhere, the slot kept as it is
            others = [s for s in free if s != mine] or free
            slot = self._coldest(others)
        self._busy[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        """The request on ``slot`` ended."""
        self._busy[slot] = max(0, self._busy[slot] - 1)

    def _coldest(self, candidates: list[int], key: str | None = None) -> int:
        # a slot nobody keeps first, then the one kept longest ago; among equals, the
        # conversation's own order of the slots (the same in every process)
        rank = _slot_rank(key, self.slots) if key is not None else None
        return min(candidates, key=lambda s: (self._keeper[s] is not None, self._kept_at[s],
                                              rank[s] if rank is not None else s))

    def _keep(self, key: str, slot: int) -> None:
        old = self._slot_of.pop(key, None)
        if old is not None and old != slot:
            self._keeper[old] = None
        previous = self._keeper[slot]
        if previous is not None and previous != key:
            self._slot_of.pop(previous, None)
        self._tick += 1
        self._keeper[slot] = key
        self._kept_at[slot] = self._tick
        self._slot_of[key] = slot
        while len(self._slot_of) > self._max:
            gone, s = self._slot_of.popitem(last=False)
            if self._keeper[s] == gone:
                self._keeper[s] = None
