"""What a call site asks of the hedging engine: :class:`HedgePolicy`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HedgePolicy:
    """How one call site (a chain step) is hedged. Times in ms unless the name ends in ``_s``.

    Delay (Dean and Barroso, "The Tail at Scale", CACM 2013: send a copy if the request
    is still outstanding after d; d = p95 limits extra load to about 5%):

    * ``delay_ms``: a fixed hedge delay d, in ms; or
    * ``delay_percentile``: d = this percentile (e.g. 95.0) of the call site's latency
      window (Finagle ``BackupRequestFilter``); no hedging while the window warms up.
    * neither: no timed copies; ``max_attempts`` then only bounds the attempts started by
      non-fatal errors and rejected answers.

    Attempts (gRFC A6 hedging policy): ``max_attempts`` counts the original plus copies;
    copy k starts at (k-1)·d while none has answered, all inside ``deadline_s`` (seconds).
    An error whose status is in ``non_fatal`` starts the next attempt at once (after the
    error's ``retry_after_s`` pushback); any other error ends the call.

    Load (Finagle budget): each call deposits ``max_extra_load`` tokens, each copy costs 1;
    ``max_copies_per_s`` optionally caps copies per second.

    Measurement: ``shadow_fraction`` of the losers are left to finish unseen to measure
    the time saved per win.

    Latency window: ``min_samples`` (warm-up), ``floor_ms``, ``window_s``, ``refresh_s``.

    ``max_loop_lag_ms``: suppress copies while the event loop lags more than this.
    ``rotate_primary``: round-robin the primary target over the targets per call.
    Circuit breakers: ``breaker_failures`` failures within ``breaker_window_s`` seconds
    open a target for ``breaker_cooldown_s`` seconds.

    Raises:
        ValueError: inconsistent values (both delays set, max_attempts < 1, a percentile
            outside (0, 100), a fraction outside [0, 1], non-positive times or loads).
    """

    delay_ms: float | None = None
    delay_percentile: float | None = None
    max_attempts: int = 2
    deadline_s: float | None = None
    non_fatal: frozenset[int | str] = frozenset()
    max_extra_load: float = 0.1
    max_copies_per_s: float | None = None
    shadow_fraction: float = 0.0
    min_samples: int = 20
    floor_ms: float = 1.0
    window_s: float = 30.0
    refresh_s: float = 3.0
    max_loop_lag_ms: float | None = None
    rotate_primary: bool = False
    breaker_failures: int = 5
    breaker_window_s: float = 30.0
    breaker_cooldown_s: float = 10.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.delay_ms is not None and self.delay_percentile is not None:
            problems.append("set delay_ms or delay_percentile, not both")
        if self.delay_ms is not None and self.delay_ms < 0:
            problems.append(f"delay_ms must be >= 0, got {self.delay_ms}")
        if self.delay_percentile is not None and not 0 < self.delay_percentile < 100:
            problems.append(f"delay_percentile must be in (0, 100), got {self.delay_percentile}")
        if self.max_attempts < 1:
            problems.append(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.deadline_s is not None and self.deadline_s <= 0:
            problems.append(f"deadline_s must be > 0, got {self.deadline_s}")
        if self.max_extra_load <= 0:
            problems.append(f"max_extra_load must be > 0, got {self.max_extra_load}")
        if self.max_copies_per_s is not None and self.max_copies_per_s <= 0:
            problems.append(f"max_copies_per_s must be > 0, got {self.max_copies_per_s}")
        if not 0 <= self.shadow_fraction <= 1:
            problems.append(f"shadow_fraction must be in [0, 1], got {self.shadow_fraction}")
        if self.max_loop_lag_ms is not None and self.max_loop_lag_ms < 0:
            problems.append(f"max_loop_lag_ms must be >= 0, got {self.max_loop_lag_ms}")
        if problems:
            raise ValueError("invalid HedgePolicy: " + "; ".join(problems))

    @property
    def hedges(self) -> bool:
        """Whether this policy can ever send more than one attempt per call."""
        return self.max_attempts > 1
