"""Counters of one hedged call site: fire rate, win rate, time saved per win.

These are the numbers FIELD practice asks for per hedged call site (and Finagle exports
as ``backups_sent``, ``backups_won``, ``budget_exhausted``): a hedge that fires often and
rarely wins costs load and saves nothing (Dean and Barroso: the copy wins only when the
primary's serving noise exceeds the copy's by more than the delay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chainrun.hedging.outcome import HedgeOutcome


@dataclass
class HedgeStats:
    """Accumulated counts of one call site. Rates are None until their denominator is > 0."""

    calls: int = 0
    #: calls whose hedge timer went off (a copy was due)
    fires: int = 0
    #: copies actually sent
    copies_sent: int = 0
    #: calls in which a copy fired and a copy won
    copy_wins: int = 0
    #: copies refused by the load budget
    budget_exhausted: int = 0
    #: copies not sent because the loop lagged or every target's circuit was open
    suppressed: int = 0
    time_saved_sum_ms: float = 0.0
    time_saved_count: int = 0

    def record(self, outcome: HedgeOutcome[Any]) -> None:
        """Count one finished call (time saved is counted by :meth:`record_time_saved`)."""
        self.calls += 1
        self.fires += outcome.fired
        self.copy_wins += outcome.fired and outcome.won_by_copy
        for attempt in outcome.attempts:
            self.copies_sent += attempt.number > 1 and attempt.sent
            self.budget_exhausted += attempt.outcome == "budget_exhausted"
            self.suppressed += attempt.outcome == "suppressed"

    def record_time_saved(self, ms: float) -> None:
        """Count the time one copy win saved, in ms (known only when a shadow primary finished)."""
        self.time_saved_sum_ms += ms
        self.time_saved_count += 1

    @property
    def fire_rate(self) -> float | None:
        """Fires per call."""
        return self.fires / self.calls if self.calls else None

    @property
    def win_rate(self) -> float | None:
        """Copy wins per fire."""
        return self.copy_wins / self.fires if self.fires else None

    @property
    def time_saved_per_win_ms(self) -> float | None:
        """Mean time saved per measured copy win, in ms."""
        return self.time_saved_sum_ms / self.time_saved_count if self.time_saved_count else None

    @property
    def extra_calls_per_call(self) -> float | None:
        """Copies sent per call: the extra load hedging adds."""
        return self.copies_sent / self.calls if self.calls else None
