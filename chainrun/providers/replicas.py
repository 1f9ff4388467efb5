"""Replicas of one model server behind one provider, a conversation kept on one of them.

A shop that outgrows one model server runs several copies of it (llama-server or vLLM
replicas, each with its own prompt cache). :class:`ReplicaPool` is one provider over R
OpenAI-compatible base URLs (``[providers.NAME] replicas``); every call goes to one
replica, chosen by the provider's ``replica_policy``:

- ``affinity``: a conversation's calls go to its *home* replica, the first of the
  replicas ranked by rendezvous hashing of the conversation id and each replica's URL
  (highest random weight: Thaler and Ravishankar, "Using name-based mappings to
  increase hit rates", IEEE/ACM Trans. Networking 6(1), 1998). The ranking depends on
  nothing but the id and the URLs, so every serve worker and every process sends a
  conversation to the same replica without talking to each other, and removing one
  replica moves only the conversations whose home it was. A hedge copy of a call
  (``x-chainrun-attempt`` >= 2) goes to the next replica of the ranking, one that has
  not seen the conversation (a *cold* target), so that the copy does not queue behind
  its own primary. Calls without a conversation are taken round-robin.
- ``round_robin`` and ``random``: every call to the next replica in turn, or to one
  drawn at random (the comparison policies).

A replica that refuses the connection (:class:`~chainrun.errors.ProviderUnavailable`
before any chunk) is marked down for :data:`DOWN_S` and the call goes on to the next
replica of its ranking, in the same call: the turn is answered. A conversation whose
answer step is then served elsewhere than the replica that served it last has *moved*;
each move is counted (:attr:`ReplicaPool.moves`) and logged once, with the replica it
left and the one it went to. Under ``affinity`` the next replica of the ranking is the
same in every process, so the conversation moves once and stays there while its home is
down.

Each replica is an :class:`~chainrun.providers.openai_compat.OpenAICompatProvider` of
its own (its connection pools, and in prompt-cache mode ``slot`` its slot table: slot
affinity per replica). Where a call went is its :class:`Placement`, which
:class:`~chainrun.providers.base.ChatStream` asks for before sending (:meth:`ReplicaPool.
place`) and the call's log row reads (``calls.server_address`` is the replica's).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal

from chainrun.errors import ProviderUnavailable
from chainrun.providers.affinity import rendezvous_order
from chainrun.providers.base import ChatRequest
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.timing import Chunk

__all__ = ["DOWN_S", "Placement", "ReplicaPolicy", "ReplicaPool", "rendezvous_order"]

log = logging.getLogger(__name__)

#: how a :class:`ReplicaPool` picks a call's replica (see the module text)
ReplicaPolicy = Literal["affinity", "round_robin", "random"]

#: s a replica that refused a connection is passed over before it is tried again
DOWN_S = 5.0

#: the request header that numbers a call's attempts (1: the primary, 2+: hedge copies)
ATTEMPT_HEADER = "x-chainrun-attempt"


@dataclass
class Placement:
    """Where one call goes (and, after a failover, went).

    Attributes:
        replica: the replica's index in the pool's ``replicas``.
        address: its ``host:port`` (the call's ``server_address``).
        warm: the replica served this conversation's answer step before (its prompt
            cache may hold the conversation); False for a call without a conversation.
        order: the replicas to try, in order (the first is ``replica`` until a failover).
        failed_over: replicas that refused this call before it was placed where it is.
    """

    replica: int
    address: str
    warm: bool
    order: tuple[int, ...]
    failed_over: int = 0


class ReplicaPool:
    """One provider over several replicas of a model server (see the module text).

    Args:
        name: the provider's name in the config.
        replicas: one provider per replica (each over one base URL), >= 1; closed by
            :meth:`aclose`.
        policy: ``affinity``, ``round_robin`` or ``random``.
        down_s: s a replica that refused a connection is passed over.
        seed: the ``random`` policy's seed (None: from the OS).
        max_conversations: conversations whose last replica is remembered at most (the
            least recently seen forgotten first).

    Raises:
        ValueError: no replicas.
    """

    def __init__(
        self,
        name: str,
        replicas: Sequence[OpenAICompatProvider],
        policy: ReplicaPolicy = "affinity",
        *,
        down_s: float = DOWN_S,
        seed: int | None = None,
        max_conversations: int = 65536,
    ) -> None:
        if not replicas:
            raise ValueError(f"provider {name!r}: a replica pool needs at least one replica")
        self.name = name
        self.replicas = tuple(replicas)
        self.policy: ReplicaPolicy = policy
        self.down_s = down_s
        self._names = [r.where for r in self.replicas]
        #: the replicas' URLs, for messages
        self.where = ", ".join(self._names)
        #: a replica's base URL (the first that answered the startup check): where the
        #: chain asks for the model's tokenizer (every replica serves the same model)
        self.base_url: str | None = self.replicas[0].base_url
        self.server_address: str | None = self.replicas[0].server_address
        self.reasoning_in_content = self.replicas[0].reasoning_in_content
        self._rng = random.Random(seed)
        self._turn = itertools.count()
        self._down_until = [0.0] * len(self.replicas)
        #: the clock of the down marks (monotonic s)
        self._now = time.monotonic
        #: conversation -> the replica that last served its answer step
        self._last: OrderedDict[str, int] = OrderedDict()
        self._max = max_conversations
        #: conversations moved to another replica (see the module text)
        self.moves = 0
        #: calls placed on each replica (by index), failovers included
        self.calls = [0] * len(self.replicas)
        #: calls that a refusing replica sent on to the next
        self.failovers = 0

    # ------------------------------------------------------------------ placement

    def ranking(self, key: str) -> list[int]:
        """The replicas in ``key``'s preference order under ``affinity`` (its home first)."""
        return rendezvous_order(key, self._names)

    def is_up(self, i: int) -> bool:
        """Whether replica ``i`` is not marked down."""
        return self._down_until[i] <= self._now()

    _up = is_up

    def _order(self, request: ChatRequest) -> list[int]:
        n = len(self.replicas)
        key = request.cache_key
        if self.policy == "affinity" and key is not None:
            ranked = self.ranking(key)
            up = [i for i in ranked if self._up(i)] or ranked
            rest = [i for i in ranked if i not in up]
            order = up + rest
            attempt = request.headers.get(ATTEMPT_HEADER, "1")
            if attempt != "1" and len(up) > 1:
                # a hedge copy: the next replica of the ranking, not the primary's
                k = (int(attempt) - 1) % len(up) if attempt.isdigit() else 1
                order = order[k:] + order[:k]
            return order
        if self.policy == "random":
            start = self._rng.randrange(n)
        else:
            start = next(self._turn) % n
        order = [(start + j) % n for j in range(n)]
        up = [i for i in order if self._up(i)]
        return up + [i for i in order if i not in up]

    def place(self, request: ChatRequest) -> Placement:
        """Where ``request`` goes first, and the replicas to try after it."""
        order = self._order(request)
        first = order[0]
        key = request.cache_key
        warm = key is not None and self._last.get(key) == first
        return Placement(first, self.replicas[first].server_address or "", warm, tuple(order))

    def _served(self, request: ChatRequest, i: int, why: str) -> None:
        """Note that ``request`` was answered from replica ``i`` (the primary attempt of an
        answer step: its conversation's last replica, a move counted when it changed)."""
        key = request.cache_key
        if key is None or not request.cache_owner:
            return
        if request.headers.get(ATTEMPT_HEADER, "1") != "1":
            return  # a hedge copy: sent off the conversation's replica on purpose
        before = self._last.pop(key, None)
        self._last[key] = i
        if len(self._last) > self._max:
            self._last.popitem(last=False)
        if before is not None and before != i and why:
            self.moves += 1
            log.warning(
                "provider %s: conversation %s moved from replica %s to %s (%s)",
                self.name, key, self._names[before], self._names[i], why,
            )  # fmt: skip

    # ------------------------------------------------------------------ the call

    async def chunks(
        self, request: ChatRequest, placement: Placement | None = None
    ) -> AsyncIterator[Chunk]:
        """Stream ``request`` from its replica; a replica that refuses the connection
        before any chunk is marked down and the next of ``placement.order`` is tried.

        Raises:
            ProviderUnavailable: every replica refused.
            ProviderError: any other failure of the replica that took the call (hedging
                and retries decide what follows).
        """
        p = placement if placement is not None else self.place(request)
        last_error: ProviderUnavailable | None = None
        for i in p.order:
            if i != p.order[0] and not self._up(i) and any(self._up(j) for j in p.order):
                continue  # down: try it only when every replica is
            p.replica, p.address = i, self.replicas[i].server_address or ""
            self.calls[i] += 1
            got = False
            try:
                async for chunk in self.replicas[i].chunks(request):
                    if not got:
                        got = True
                        why = (f"{self._names[p.order[0]]} refused the connection"
                               if p.failed_over else "")  # fmt: skip
                        self._served(request, i, why or self._moved_why(request, i))
                    yield chunk
                return
            except ProviderUnavailable as e:
                if got:
                    raise
                self._down_until[i] = self._now() + self.down_s
                p.failed_over += 1
                self.failovers += 1
                last_error = e
                log.info("provider %s: replica %s refused (%s); trying the next",
                         self.name, self._names[i], e)  # fmt: skip
        assert last_error is not None
        raise last_error

    def _moved_why(self, request: ChatRequest, i: int) -> str:
        """Why an answer step went elsewhere than its last replica without a failover in
        this call ("" under round-robin and random, where that is the policy)."""
        if self.policy != "affinity" or request.cache_key is None:
            return ""
        before = self._last.get(request.cache_key)
        if before is None or before == i:
            return ""
        if not self._up(before):
            return f"{self._names[before]} is down"
        if i == self.ranking(request.cache_key)[0]:
            return "its home replica answers again"
        return "its replica was passed over"

    def summary(self) -> dict[str, object]:
        """The pool's counts: ``{"policy", "replicas": [address...], "calls": [n...],
        "failovers", "moves", "down": [address...]}``."""
        return {
            "policy": self.policy,
            "replicas": [r.server_address for r in self.replicas],
            "calls": list(self.calls),
            "failovers": self.failovers,
            "moves": self.moves,
            "down": [self.replicas[i].server_address for i in range(len(self.replicas))
                     if not self._up(i)],
        }  # fmt: skip

    async def check(self) -> None:
        """Fail fast when no replica can be reached (``GET .../models`` on each); a
        replica that cannot is marked down and said on the log.

        Raises:
            ProviderUnavailable: no replica answered the startup check.
        """
        errors: list[ProviderUnavailable] = []
        for i, r in enumerate(self.replicas):
            try:
                await r.check()
            except ProviderUnavailable as e:
                errors.append(e)
                self._down_until[i] = self._now() + self.down_s
                log.warning("provider %s: replica %s is not reachable: %s",
                            self.name, self._names[i], e)  # fmt: skip
        if len(errors) == len(self.replicas):
            raise errors[0]
        self.base_url = next(r.base_url for i, r in enumerate(self.replicas) if self.is_up(i))

    async def aclose(self) -> None:
        """Close every replica's clients."""
        for r in self.replicas:
            await r.aclose()
