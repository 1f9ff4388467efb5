"""A provider's rate limits in this process: requests and tokens per minute.

``[providers.NAME] requests_per_minute`` and ``tokens_per_minute`` give a provider one
:class:`RateLimiter`, shared by every step of the chain that calls it. It is a sliding
log over the last :attr:`RateLimiter.period_s` seconds (60): at most ``requests`` grants
and ``tokens`` tokens in any window of that length, which is how OpenAI states its
limits (requests and tokens per minute, per model and organisation; a hedged copy counts
against both like any request). A grant's tokens are the request's estimate (its
prompt's estimated tokens plus its ``max_tokens``) until the usage comes back
(:meth:`Grant.correct`).

- A primary (the first attempt of a call's round) **waits** for its grant, first come
  first served, within its step's deadline (:meth:`RateLimiter.acquire`); the wait is
  logged in ``calls.rate_limit_wait_ms``.
- A hedge copy (and a retry) **never waits** (:meth:`RateLimiter.try_acquire`): with no
  room now, or primaries waiting, it is not sent, counted ``rate_limited`` among the
  copies not sent (``chainrun hedge-stats``), as the hedge budget's refusals are.
- A 429 answer with ``Retry-After`` **holds** the limiter that long
  (:meth:`RateLimiter.hold`): no grant to any step of the process until then.

Why not ``asyncio-throttle`` (its ``Throttler(rate_limit, period)`` is an async context
manager a caller awaits): it counts requests only (no tokens, no correction), it has no
way to ask without waiting (a copy must not wait) but by reading its private log, no
hold, it reads ``time.monotonic()`` instead of the event loop's clock (so no virtual
time in tests), and a waiter polls every 10 ms. Each of those would be written around
it; the one log here does all of it, and a waiter sleeps until the first moment a
grant can fit.

Per process: a limit of R per minute over N processes that share a provider's quota
is R/N each (see the many-processes guide for what sharing one limiter would take).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chainrun.conversations.tokens import estimate_tokens
from chainrun.errors import ProviderError

if TYPE_CHECKING:
    from chainrun.providers.base import ChatRequest
    from chainrun.providers.config import ProviderConfig

__all__ = ["PERIOD_S", "Grant", "RateLimited", "RateLimiter", "limiters_for", "request_tokens"]

#: the window the limits are counted over, in s (requests and tokens *per minute*)
PERIOD_S = 60.0


class RateLimited(ProviderError):
    """The provider's rate limit in this process had no room: a primary whose grant
    could not come before its step's deadline, or a copy not sent (it never waits)."""

    error_type = "rate_limited"


@dataclass(eq=False)
class Grant:
    """One request's place in the limiter's log.

    Attributes:
        at: when it was granted (the limiter's clock, s).
        tokens: the tokens it counts for (the estimate until :meth:`correct`).
        waited_s: how long its request waited for it (0 for one granted at once).
    """

    at: float
    tokens: int
    waited_s: float = 0.0
    _limiter: RateLimiter | None = field(default=None, repr=False)

    def correct(self, tokens: int) -> None:
        """Count the tokens the provider reported (prompt + completion) instead of the
        estimate; a waiter the correction makes room for is woken."""
        if self._limiter is not None:
            self._limiter._correct(self, max(0, tokens))


class RateLimiter:
    """Requests and tokens per :attr:`period_s` for one provider (see the module text).

    Args:
        requests: grants per period at most (None: no request limit).
        tokens: tokens per period at most (None: no token limit). A single request
            estimated above it is granted when the log is empty (it could never fit).
        period_s: the window, in s.
        clock: the time in s; default the running event loop's (virtual in tests).

    Raises:
        ValueError: a limit below 1, or a non-positive period.
    """

    def __init__(
        self,
        requests: int | None = None,
        tokens: int | None = None,
        *,
        period_s: float = PERIOD_S,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if (requests is not None and requests < 1) or (tokens is not None and tokens < 1):
            raise ValueError(f"limits must be >= 1, got {requests=}, {tokens=}")
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.requests = requests
        self.tokens = tokens
        self.period_s = period_s
        self._clock = clock
        self._log: deque[Grant] = deque()
        self._tokens_in_log = 0
        #: no grant before this time (a 429's Retry-After), on the limiter's clock
        self.held_until = -math.inf
        #: the primaries waiting, in order: each waits for its future, set when it is first
        self._waiters: deque[asyncio.Future[None]] = deque()
        #: the first waiter's sleep, cut short when a correction may have made room
        self._nudge: asyncio.Future[None] | None = None

    def now(self) -> float:
        """The limiter's clock, in s."""
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    # -- the log -----------------------------------------------------------------------
    def _forget(self, now: float) -> None:
        while self._log and now - self._log[0].at >= self.period_s:
            self._tokens_in_log -= self._log.popleft().tokens

    def _free_at(self, tokens: int, now: float) -> float:
        """The first time (>= now) a grant of ``tokens`` fits, were nothing else granted."""
        self._forget(now)
        at = max(now, self.held_until)
        log = self._log
        if self.requests is not None and len(log) >= self.requests:
            at = max(at, log[len(log) - self.requests].at + self.period_s)
        if self.tokens is not None and log and self._tokens_in_log + tokens > self.tokens:
            left = self._tokens_in_log
            for g in log:  # the oldest grants leave the window first
                left -= g.tokens
                if left + tokens <= self.tokens:
                    at = max(at, g.at + self.period_s)
                    break
        return at

    def _grant(self, tokens: int, now: float, waited_s: float) -> Grant:
        g = Grant(now, tokens, waited_s, self)
        self._log.append(g)
        self._tokens_in_log += tokens
        return g

    def _correct(self, g: Grant, tokens: int) -> None:
        if any(x is g for x in self._log):
            self._tokens_in_log += tokens - g.tokens
        g.tokens = tokens
        self._wake()

    # -- asking ----------------------------------------------------------------------
    def try_acquire(self, tokens: int) -> Grant | None:
        """A grant now, or None: never waits, and leaves room to primaries waiting."""
        now = self.now()
        if self._waiters or self._free_at(tokens, now) > now:
            return None
        return self._grant(tokens, now, 0.0)

    async def acquire(self, tokens: int, *, deadline: float | None = None) -> Grant:
        """Wait for a grant of ``tokens`` (first come, first served).

        Args:
            tokens: the request's estimated tokens.
            deadline: the latest time (the limiter's clock) the grant may come (None: no
                bound).

        Raises:
            RateLimited: no grant can come before ``deadline`` (raised as soon as that
                is known, not at the deadline).
        """
        start = now = self.now()
        if not self._waiters and self._free_at(tokens, now) <= now:
            return self._grant(tokens, now, 0.0)
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            if len(self._waiters) > 1:
                await turn  # the waiters before this one go first
            while True:
                now = self.now()
                at = self._free_at(tokens, now)
                if at <= now:
                    return self._grant(tokens, now, now - start)
                if deadline is not None and at > deadline:
                    raise RateLimited(self._why(at - now, deadline - now))
                await self._sleep_until_room(at - now)
        finally:
            self._waiters.remove(turn)
            self._wake()

    async def _sleep_until_room(self, seconds: float) -> None:
        """The first waiter's sleep: until its grant can fit, or sooner when a usage
        correction may have made room (:meth:`_wake`)."""
        loop = asyncio.get_running_loop()
        nudge: asyncio.Future[None] = loop.create_future()
        self._nudge = nudge
        def due() -> None:
            if not nudge.done():
                nudge.set_result(None)

        timer = loop.call_later(seconds, due)
        try:
            await nudge
        finally:
            timer.cancel()
            self._nudge = None

    def hold(self, seconds: float) -> None:
        """No grant for ``seconds`` from now (a 429's ``Retry-After``); a longer hold
        already in force stays."""
        self.held_until = max(self.held_until, self.now() + max(0.0, seconds))

    def _wake(self) -> None:
        """Let the first waiter look again: the one sleeping until its grant can fit,
        or the next in line when none is."""
        if self._nudge is not None and not self._nudge.done():
            self._nudge.set_result(None)
        elif self._waiters and not self._waiters[0].done():
            self._waiters[0].set_result(None)

    def _why(self, wait_s: float, left_s: float) -> str:
        held = self.held_until > self.now()
        cause = ("held by the provider's Retry-After" if held else
                 f"its limits ({self._limits()}) are used")  # fmt: skip
        return (f"rate limit: the next request could go in {wait_s:.1f} s ({cause}), past "
                f"the step's deadline in {max(left_s, 0.0):.1f} s")

    def _limits(self) -> str:
        parts = []
        if self.requests is not None:
            parts.append(f"{self.requests} requests")
        if self.tokens is not None:
            parts.append(f"{self.tokens} tokens")
        return " and ".join(parts) + f" per {self.period_s:g} s"

    @property
    def in_window(self) -> tuple[int, int]:
        """(grants, tokens) in the window now."""
        self._forget(self.now())
        return len(self._log), self._tokens_in_log


def request_tokens(request: ChatRequest) -> int:
    """What a request counts for in a tokens-per-minute limit until its usage comes back:
    its messages' estimated tokens (:func:`chainrun.conversations.tokens.estimate_tokens`,
    the script-aware character estimate) plus its ``max_output_tokens`` (0 when unset)."""
    prompt = 0
    for m in request.messages:
        content = m.get("content")
        if isinstance(content, str):
            prompt += estimate_tokens(content)
        elif isinstance(content, list):  # parts: count their text
            prompt += sum(estimate_tokens(str(p.get("text", ""))) for p in content
                          if isinstance(p, dict))  # fmt: skip
    return prompt + (request.max_output_tokens or 0)


def limiters_for(providers: Mapping[str, ProviderConfig]) -> dict[str, RateLimiter]:
    """One :class:`RateLimiter` per provider that sets ``requests_per_minute`` or
    ``tokens_per_minute``, by name."""
    return {name: RateLimiter(p.requests_per_minute, p.tokens_per_minute)
            for name, p in providers.items()
            if p.requests_per_minute is not None or p.tokens_per_minute is not None}  # fmt: skip
