"""What a call site asks of the hedging engine: :class:`HedgePolicy`.

This is the one definition of the hedging settings, their defaults and their checks: the
config's ``[steps.NAME.hedge]`` table (:class:`chainrun.config.HedgeConfig`) is this
model plus the copy targets, and :func:`chainrun.config.policy_from_config` turns
it into the engine's policy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chainrun.hedging.breaker import BREAKER_COOLDOWN_S, BREAKER_FAILURES, BREAKER_WINDOW_S

#: gRFC A6 caps hedged attempts at 5, and 5 stays the recommended cap. The engine allows
#: up to 10 for classifiers whose fast path is much shorter than the deadline (copies
#: every 0.4 s fit seven attempts into 3 s), always inside the deadline and the load budget.
MAX_ATTEMPTS_LIMIT = 10

#: Back-off defaults: a hedge whose copies won under 5% of its last 30 fires does not pay
#: (the audit's rule for the win rate; 30 fires is where a win rate of 0 has a 95% upper
#: bound near 0.11, Wilson), so the site keeps 1% extra calls as probes and hedges again
#: once 2 of 10 probe fires win.
MIN_WIN_RATE = 0.05
MIN_FIRES = 30
PROBE_RATE = 0.01
RESUME_WIN_RATE = 0.2
PROBE_FIRES = 10

#: Without ``initial_delay_ms``, a percentile delay's warm-up uses this share of the deadline.
INITIAL_DELAY_SHARE_OF_DEADLINE = 1 / 3


class HedgePolicy(BaseModel):
    """How one call site (a chain step) is hedged. Times in ms unless the name ends in ``_s``.

    Delay (Dean and Barroso, "The Tail at Scale", CACM 2013: send a copy if the request
    is still outstanding after d; d = p95 limits extra load to about 5%):

    * ``delay_ms``: a fixed hedge delay d, in ms; or
    * ``delay_percentile``: d = this percentile (e.g. 95.0) of the call site's latency
      window (Finagle ``BackupRequestFilter``). Until the window holds ``min_samples``
      answers, d = ``initial_delay_ms`` (default: a third of ``deadline_s``), so the first
      calls after a start are not the unprotected ones; with neither an initial delay nor
      a deadline, nothing is hedged during warm-up (Finagle's behaviour).
    * ``delay_auto`` (config ``delay = "auto"``): the delay and the number of attempts
      (up to ``max_attempts``) are re-derived from the window at most every
      ``advise_interval_s`` seconds, within ``max_extra_load`` and the deadline, for
      ``target``: ``"p99"`` (the least p99) or ``"in_deadline"`` (the largest share
      answered within ``deadline_s``); see :mod:`chainrun.hedging.advisor`. Warm-up as
      for a percentile delay.
    * none of these: no timed copies; ``max_attempts`` then only bounds the attempts
      started by non-fatal errors and rejected answers.

    Back-off (:mod:`chainrun.hedging.advisor`): when copies won under ``min_win_rate`` of
    the last ``min_fires`` fires that sent one, only a random share of calls is hedged,
    costing about ``probe_rate`` extra calls per call; hedging resumes once
    ``resume_win_rate`` of ``probe_fires`` probe fires win. ``min_win_rate = 0`` turns
    the back-off off.

    Attempts (gRFC A6 hedging policy): ``max_attempts`` counts the original plus copies
    (1..10; 5 is the gRFC cap and the recommended one); copy k starts at (k-1)·d while
    none has answered, all inside ``deadline_s`` (seconds): a copy due at or after the
    deadline is never sent. An error whose status is in ``non_fatal`` starts the next
    attempt at once (after the error's ``retry_after_s`` pushback); any other error ends
    the call.

    Load (Finagle budget): each call deposits ``max_extra_load`` tokens, each copy costs 1;
    ``max_copies_per_s`` optionally caps copies per second. A copy the budget refuses
    waits for the next tick (k·d) instead of being dropped, and does not count toward
    ``max_attempts`` (see :mod:`chainrun.hedging.engine`).

    Measurement: ``shadow_fraction`` of the losers are left to finish unseen to measure
    the time saved per win.

    Latency window: ``min_samples`` (warm-up), ``floor_ms``, ``window_s``, ``refresh_s``
    (Finagle: 3 buckets of 10 s, refreshed every 3 s, floor 1 ms).

    ``max_loop_lag_ms``: suppress copies while the event loop lags more than this.
    ``rotate_primary``: round-robin the primary target over the targets per call.
    Circuit breakers: ``breaker_failures`` failures within ``breaker_window_s`` seconds
    open a target for ``breaker_cooldown_s`` seconds (defaults in
    :mod:`chainrun.hedging.breaker`).

    Raises:
        pydantic.ValidationError (a ValueError): inconsistent values (both delays set,
            max_attempts outside 1..10, a percentile outside (0, 100), a fraction outside
            [0, 1], non-positive times or loads, or a fixed delay whose last attempt could
            only start at or after the deadline).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: a fixed hedge delay d, in ms
    delay_ms: float | None = Field(default=None, ge=0)
    delay_percentile: float | None = Field(default=None, gt=0, lt=100)
    #: the delay and attempts re-derived from the window at run time (``delay = "auto"``)
    delay_auto: bool = False
    #: what ``delay_auto`` optimises: the least p99, or the largest share within the deadline
    target: Literal["p99", "in_deadline"] = "p99"
    #: how often ``delay_auto`` re-derives the delay, in s (sooner only while the window
    #: doubles, right after warm-up)
    advise_interval_s: float = Field(default=10.0, gt=0)
    #: back off when copies win less than this share of the last ``min_fires`` fires
    min_win_rate: float = Field(default=MIN_WIN_RATE, ge=0, lt=1)
    #: fires (that sent a copy and were answered) the back-off's win rate is read over
    min_fires: int = Field(default=MIN_FIRES, ge=1)
    #: extra calls per call kept as probes while backed off
    probe_rate: float = Field(default=PROBE_RATE, ge=0, le=1)
    #: hedge again when this share of the last ``probe_fires`` probe fires won
    resume_win_rate: float = Field(default=RESUME_WIN_RATE, gt=0, le=1)
    #: probe fires (that sent a copy and were answered) the resume's win rate is read over
    probe_fires: int = Field(default=PROBE_FIRES, ge=1)
    #: hedge delay while a percentile delay's window warms up, in ms (None: deadline / 3)
    initial_delay_ms: float | None = Field(default=None, ge=0)
    #: the original plus copies started at d, 2d, ... (gRFC A6's cap of 5 is recommended)
    max_attempts: int = Field(default=2, ge=1, le=MAX_ATTEMPTS_LIMIT)
    deadline_s: float | None = Field(default=None, gt=0)
    #: statuses (HTTP codes or names such as "timeout") that start the next attempt at once
    non_fatal: frozenset[int | str] = frozenset()
    #: cap on copies as a fraction of calls, token-bucket style (Finagle BackupRequestFilter);
    #: fewer than MAX_ATTEMPTS_LIMIT copies per call can ever be sent
    max_extra_load: float = Field(default=0.1, gt=0, le=MAX_ATTEMPTS_LIMIT)
    #: cap on copies per second (a sliding window); None = no cap
    max_copies_per_s: float | None = Field(default=None, gt=0)
    #: fraction of losers left to finish unseen so that time saved per win is measured
    shadow_fraction: float = Field(default=0.0, ge=0, le=1)
    #: warm-up: no percentile delay until the window holds this many samples
    min_samples: int = Field(default=20, ge=1)
    #: floor of a percentile delay, in ms (Finagle uses 1 ms)
    floor_ms: float = Field(default=1.0, ge=0)
    #: length of the latency window, in s (Finagle: 3 buckets of 10 s)
    window_s: float = Field(default=30.0, gt=0)
    #: how often the percentile delay is recomputed, in s (Finagle: 3 s)
    refresh_s: float = Field(default=3.0, ge=0)
    #: suppress copies while the client's own event-loop lag exceeds this, in ms
    max_loop_lag_ms: float | None = Field(default=None, ge=0)
    #: rotate which target is primary so the backup does not see only slow leftovers
    rotate_primary: bool = False
    #: circuit breaker: failures within ``breaker_window_s`` that open a target
    breaker_failures: int = Field(default=BREAKER_FAILURES, ge=1)
    #: the window the breaker counts failures in, in s
    breaker_window_s: float = Field(default=BREAKER_WINDOW_S, gt=0)
    #: how long an open breaker stays open, in s
    breaker_cooldown_s: float = Field(default=BREAKER_COOLDOWN_S, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> HedgePolicy:
        delays = (self.delay_ms is not None) + (self.delay_percentile is not None)
        if delays + self.delay_auto > 1:
            raise ValueError("set only one of delay_ms, delay_percentile and delay_auto")
        problem = self.deadline_problem(self.deadline_s)
        if problem:
            raise ValueError(problem)
        return self

    def deadline_problem(self, deadline_s: float | None) -> str | None:
        """Why a fixed delay cannot fit ``max_attempts`` inside ``deadline_s``, or None.

        With ``delay_ms`` fixed and no ``non_fatal`` statuses (which start attempts off the
        schedule), attempt k starts at (k-1)·d; an attempt due at or after the deadline is
        never sent, so such a ``max_attempts`` promises copies that cannot exist.
        """
        if deadline_s is None or self.delay_ms is None or self.non_fatal:
            return None
        last_ms = (self.max_attempts - 1) * self.delay_ms
        if self.max_attempts > 1 and last_ms >= deadline_s * 1000:
            fit = 1 + int((deadline_s * 1000 - 1e-9) // self.delay_ms)  # delay_ms > 0 here
            return (
                f"max_attempts = {self.max_attempts} with delay_ms = {self.delay_ms:g}: attempt "
                f"{self.max_attempts} would start at {last_ms:g} ms, not before the deadline "
                f"({deadline_s:g} s); at most {fit} attempts fit"
            )
        return None

    def for_deadline(self, deadline_s: float | None) -> HedgePolicy:
        """This policy with ``deadline_s`` set (a step's deadline), checked again.

        Raises:
            ValueError: the delays cannot fit ``max_attempts`` inside the new deadline.
        """
        problem = self.deadline_problem(deadline_s)
        if problem:
            raise ValueError(problem)
        return self.model_copy(update={"deadline_s": deadline_s})

    @property
    def warmup_delay_ms(self) -> float | None:
        """The delay used while a percentile delay's window warms up, in ms (None: no copies).

        ``initial_delay_ms``, else a third of ``deadline_s`` (the calls right after
        a start are the ones most exposed to the tail), else None.
        """
        if self.initial_delay_ms is not None:
            return self.initial_delay_ms
        if self.deadline_s is not None:
            return self.deadline_s * 1000 * INITIAL_DELAY_SHARE_OF_DEADLINE
        return None

    @property
    def hedges(self) -> bool:
        """Whether this policy can ever send more than one attempt per call."""
        return self.max_attempts > 1
