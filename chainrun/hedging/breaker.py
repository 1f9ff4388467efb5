"""Circuit breakers per hedge target (closed → open → half-open → closed).

The pattern is Nygard's ("Release It!", 2007): after repeated failures stop sending to
a target for a cool-down, then let a single probe through; its success closes the
circuit, its failure opens it again. gRPC's retry throttling (gRFC A6) stops hedging
when failures are frequent for the same reason: copies of requests to a failing
server fail the same way and only add load.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]

#: Default breaker settings (the one place they are defined; HedgePolicy and the config use
#: them): 5 failures within 30 s open a target for 10 s.
BREAKER_FAILURES = 5
BREAKER_WINDOW_S = 30.0
BREAKER_COOLDOWN_S = 10.0


class CircuitBreaker:
    """The breaker of one target.

    * closed: every attempt is allowed; ``failures`` failures within ``window_s`` seconds open it.
    * open: nothing is allowed for ``cooldown_s`` seconds, then it is half-open.
    * half-open: one probe is allowed; its success closes the breaker, its failure re-opens it
      (for another ``cooldown_s``); a probe that was cancelled frees the slot for another probe.

    Checking is split in two so a caller can look before it commits: :attr:`available`
    has no side effect, :meth:`allow` takes the probe slot when half-open.

    Args:
        failures: failures within the window that open the breaker (>= 1).
        window_s: the failure-counting window, in seconds.
        cooldown_s: how long the breaker stays open, in seconds.
        clock: monotonic seconds; injectable for tests.
    """

    def __init__(
        self,
        failures: int = BREAKER_FAILURES,
        window_s: float = BREAKER_WINDOW_S,
        cooldown_s: float = BREAKER_COOLDOWN_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1 or window_s <= 0 or cooldown_s < 0:
            raise ValueError(
                f"need failures >= 1, window_s > 0, cooldown_s >= 0; "
                f"got {failures=}, {window_s=}, {cooldown_s=}"
            )
        self.failures = failures
        self.window_s = window_s
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._state: BreakerState = "closed"
        self._failure_times: deque[float] = deque()
        self._opened_at = 0.0
        self._open_for = cooldown_s
        self._probe_in_flight = False

    @property
    def state(self) -> BreakerState:
        """The current state; an open breaker whose cool-down has passed reports half-open."""
        if self._state == "open" and self._clock() - self._opened_at >= self._open_for:
            self._state = "half_open"
            self._probe_in_flight = False
        return self._state

    @property
    def available(self) -> bool:
        """Whether :meth:`allow` would return True now (no side effect)."""
        state = self.state
        return state == "closed" or (state == "half_open" and not self._probe_in_flight)

    def allow(self) -> bool:
        """Ask to send one attempt; when half-open this takes the single probe slot."""
        if not self.available:
            return False
        if self._state == "half_open":
            self._probe_in_flight = True
        return True

    def record_success(self) -> None:
        """The target answered: close the breaker and forget past failures."""
        self._state = "closed"
        self._failure_times.clear()
        self._probe_in_flight = False

    def record_failure(self) -> None:
        """The target failed: count it (closed) or re-open the breaker (half-open)."""
        now = self._clock()
        state = self.state
        if state == "open":
            return
        if state == "half_open":
            self._open(now)
            return
        self._failure_times.append(now)
        while self._failure_times and now - self._failure_times[0] > self.window_s:
            self._failure_times.popleft()
        if len(self._failure_times) >= self.failures:
            self._open(now)

    def record_cancelled(self) -> None:
        """An attempt was cancelled before it answered: neither success nor failure.

        When half-open, the cancelled attempt was the probe: free the slot for the next one.
        """
        if self.state == "half_open":
            self._probe_in_flight = False

    def trip(self, for_s: float | None = None) -> None:
        """Open the breaker now, without failures counted: for a target known to be down
        before any attempt (e.g. unreachable at start). It stays open ``for_s`` seconds
        (default ``cooldown_s``; ``math.inf``: until :meth:`record_success`)."""
        self._open(self._clock())
        self._open_for = self.cooldown_s if for_s is None else for_s

    def _open(self, now: float) -> None:
        self._state = "open"
        self._opened_at = now
        self._open_for = self.cooldown_s
        self._failure_times.clear()
        self._probe_in_flight = False

    def __repr__(self) -> str:
        return f"CircuitBreaker(state={self.state!r}, failures={len(self._failure_times)})"


class BreakerRegistry:
    """Circuit breakers keyed by target name, created on first use with shared settings.

    Share one registry between call sites (chain steps) that use the same targets, so
    that failures seen by one step keep the others away from a failing target too.
    Arguments are those of :class:`CircuitBreaker`.
    """

    def __init__(
        self,
        failures: int = BREAKER_FAILURES,
        window_s: float = BREAKER_WINDOW_S,
        cooldown_s: float = BREAKER_COOLDOWN_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.window_s = window_s
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, target: str) -> CircuitBreaker:
        """The breaker of ``target`` (created closed on first use)."""
        breaker = self._breakers.get(target)
        if breaker is None:
            breaker = CircuitBreaker(
                self.failures, self.window_s, self.cooldown_s, clock=self._clock
            )
            self._breakers[target] = breaker
        return breaker

    def states(self) -> dict[str, BreakerState]:
        """Current state of every breaker created so far, by target name."""
        return {target: breaker.state for target, breaker in self._breakers.items()}
