"""The load budget of hedging: a token bucket plus an optional copies-per-second cap.

Finagle's ``BackupRequestFilter`` keeps backups under ``maxExtraLoad`` with a retry
budget: every request deposits, every backup withdraws ``1 / maxExtraLoad`` times as
much. Here each call deposits ``max_extra_load`` tokens and each copy withdraws 1,
which is the same ratio: over many calls at most ``max_extra_load`` copies per call
(plus the initial reserve). gRPC's retry throttling (gRFC A6) is the same idea.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# tokens are sums of floats such as 0.1: ten deposits of 0.1 must make a whole token
_EPS = 1e-9


class CopyThrottler:
    """At most ``rate_limit`` copies per ``period`` s, asked without waiting: a sliding
    log of the times copies were allowed (the scheme of asyncio-throttle's ``Throttler``,
    whose ``acquire`` waits for a free slot; a hedge copy that would have to wait is
    pointless, so :meth:`try_acquire` answers at once instead). Monotonic seconds from an
    injectable clock.

    Raises:
        ValueError: ``rate_limit`` below 1 or a non-positive ``period``.
    """

    def __init__(
        self,
        rate_limit: int,
        period: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_limit < 1 or period <= 0:
            raise ValueError(f"need rate_limit >= 1 and period > 0, got {rate_limit=}, {period=}")
        self.rate_limit = rate_limit
        self.period = period
        self._clock = clock
        self._allowed: deque[float] = deque()

    @classmethod
    def per_second(
        cls, rate: float, *, clock: Callable[[], float] = time.monotonic
    ) -> CopyThrottler:
        """A throttler allowing ``rate`` copies per second on average (rate > 0).

        A fractional rate becomes a whole number per longer period: 2.5/s is 2 per 0.8 s,
        0.5/s is 1 per 2 s.

        Raises:
            ValueError: ``rate`` is not positive.
        """
        if rate <= 0:
            raise ValueError(f"copies per second must be > 0, got {rate}")
        limit = max(1, round(rate))
        return cls(limit, limit / rate, clock=clock)

    @property
    def in_period(self) -> int:
        """Copies allowed within the last ``period`` s."""
        self._forget()
        return len(self._allowed)

    def _forget(self) -> None:
        now = self._clock()
        while self._allowed and now - self._allowed[0] > self.period:
            self._allowed.popleft()

    def try_acquire(self) -> bool:
        """Take a slot if one is free now and return True; else return False without waiting."""
        self._forget()
        if len(self._allowed) >= self.rate_limit:
            return False
        self._allowed.append(self._clock())
        return True


#: how many calls' deposits the budget's bucket holds by default
CAPACITY_CALLS = 100


class HedgeBudget:
    """Token bucket bounding the extra load of hedge copies (Finagle/gRPC style).

    Args:
        max_extra_load: tokens each call deposits (:meth:`deposit`); a copy costs 1 token,
            so 0.1 allows about one copy per ten calls (10% extra load).
        reserve: tokens at the start, so the first calls may hedge before any deposit
            has accumulated (Finagle's ``minRetriesPerSec`` plays this role).
        capacity: the most tokens the bucket holds; deposits above it are lost, which
            bounds a burst of copies after a quiet spell. Default
            ``max(1, reserve, max_extra_load * CAPACITY_CALLS)``: the deposits of the
            last 100 calls, so that calls in flight together can each spend what they
            deposited (a capacity of one call's deposit refused the copies of
            concurrent calls), while a burst after a quiet spell stays bounded by
            ``max_extra_load`` × 100 copies. Finagle bounds the same burst in time
            (deposits expire after a 10 s TTL); counting calls needs no clock.
        max_copies_per_s: optional hard cap on copies per second, whatever the balance.
        clock: monotonic seconds, for the copies-per-second cap; injectable for tests.

    Raises:
        ValueError: a non-positive ``max_extra_load``, a negative ``reserve``, or a
            ``capacity`` below 1 (a copy could never be paid for).
    """

    def __init__(
        self,
        max_extra_load: float = 0.1,
        *,
        reserve: float = 1.0,
        capacity: float | None = None,
        max_copies_per_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_extra_load <= 0 or reserve < 0:
            raise ValueError(f"need max_extra_load > 0 and reserve >= 0, got {max_extra_load=}")
        self.max_extra_load = max_extra_load
        self.capacity = (
            max(1.0, reserve, max_extra_load * CAPACITY_CALLS) if capacity is None else capacity
        )
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1 (one copy costs 1), got {capacity}")
        self._balance = min(reserve, self.capacity)
        self.throttler = (
            None
            if max_copies_per_s is None
            else CopyThrottler.per_second(max_copies_per_s, clock=clock)
        )

    @property
    def balance(self) -> float:
        """Tokens available now (1 token pays for one copy)."""
        return self._balance

    def deposit(self) -> None:
        """Credit one call: add ``max_extra_load`` tokens, up to ``capacity``."""
        self._balance = min(self.capacity, self._balance + self.max_extra_load)

    def try_withdraw(self) -> bool:
        """Pay for one copy if the balance and the per-second cap allow; never waits.

        Returns True (1 token withdrawn, one per-second slot taken) or False (nothing taken).
        """
        if self._balance + _EPS < 1:
            return False
        if self.throttler is not None and not self.throttler.try_acquire():
            return False
        self._balance = max(0.0, self._balance - 1)
        return True

    def refund(self) -> None:
        """Give back one copy's token (a copy paid for and then not sent), up to
        ``capacity``; its per-second slot stays taken."""
        self._balance = min(self.capacity, self._balance + 1)

    def __repr__(self) -> str:
        rate = (
            ""
            if self.throttler is None
            else f", {self.throttler.rate_limit}/{self.throttler.period:g}s"
        )
        return f"HedgeBudget(balance={self._balance:.3g}/{self.capacity:g}{rate})"
