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

In mode ``slot`` the requests that follow their turn's answer (its checks, which
nobody waits for) also let other turns' answers go first (:class:`AnswerFirst`):
llama-server computes the pending prompt tokens of every slot together, so a
follow-up's short prompt computed beside a check's longer one waits for both.

The mode is a provider setting (``prompt_cache`` in ``[providers.NAME]``); ``auto``
picks what is harmless where: ``slot`` for the embedded local model, ``key`` for
OpenAI's own API and Azure, ``off`` for other servers (a server that refuses unknown
parameters would refuse a key it does not know).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["ANSWER_FIRST_MAX_WAIT_S", "AffinityMode", "AnswerFirst", "PromptCacheMode",
           "SlotTable", "resolve_mode"]

#: how a provider keeps a conversation on one prompt cache (see the module text)
PromptCacheMode = Literal["auto", "key", "slot", "off"]
#: a resolved mode (``auto`` decided)
AffinityMode = Literal["key", "slot", "off"]

#: hosts whose API takes ``prompt_cache_key`` (OpenAI's prompt caching guide)
KEY_HOSTS = ("api.openai.com",)


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
    server's ``--cache-ram`` prompt cache then keeps the displaced prefix.

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
            slot = mine if mine is not None else self._coldest(free)
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

    def _coldest(self, candidates: list[int]) -> int:
        # a slot nobody keeps first, then the one kept longest ago
        return min(candidates, key=lambda s: (self._keeper[s] is not None, self._kept_at[s], s))

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


#: the longest a request that follows its turn's answer waits for other turns' answers
#: to compute their prompts, in s (:class:`AnswerFirst`): about one first turn's prompt
#: on the embedded model (0.6-1.5 s on 2 CPUs, benchmarks/README.md), so a steady
#: stream of answers delays a check by at most that, never starves it
ANSWER_FIRST_MAX_WAIT_S = 2.0


class AnswerFirst:
    """On one llama-server, a request that follows its turn's answer (a check of the
    answer: nothing the shopper waits for) waits while another turn's answer computes
    its prompt, at most ``max_wait_s``.

    llama-server computes the pending prompt tokens of all its busy slots in one batch
    per step: a conversation's follow-up, 60-100 new tokens on a cached prefix (about
    0.2 s alone on the embedded model), sent while a check's prompt of a few hundred
    tokens is computed, gets its first token only when both are done (1.6-1.8 s,
    measured with 19-27 ms per prompt token instead of 2.3-3.7). The answers of this
    process's turns mark their prompt phase (:meth:`begin` when sent, :meth:`end` at
    their first token or their end); the checks :meth:`wait` before they are sent.
    Per process, as the :class:`SlotTable` is.

    Args:
        max_wait_s: the longest one :meth:`wait` lasts, in s (>= 0).
    """

    def __init__(self, max_wait_s: float = ANSWER_FIRST_MAX_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._computing = 0
        self._idle: asyncio.Event | None = None  # made on first use, in the running loop

    @property
    def computing(self) -> int:
        """Answers of this process sent and not yet at their first token."""
        return self._computing

    def _event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            if self._computing == 0:
                self._idle.set()
        return self._idle

    def begin(self) -> None:
        """An answer's request is sent: its prompt is being computed."""
        self._computing += 1
        self._event().clear()

    def end(self) -> None:
        """That answer's first token came (or the request ended without one)."""
        self._computing = max(0, self._computing - 1)
        if self._computing == 0:
            self._event().set()

    async def wait(self, until: float | None = None) -> float:
        """Wait until no answer of this process is computing its prompt, at most
        :attr:`max_wait_s` and not past ``until`` (the caller's deadline on the event
        loop's clock); returns the seconds waited (0.0 when none was)."""
        if self._computing == 0:
            return 0.0
        loop = asyncio.get_running_loop()
        end = loop.time() + self.max_wait_s
        if until is not None:
            end = min(end, until)
        t0 = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(end):
                await self._event().wait()
        return time.perf_counter() - t0
