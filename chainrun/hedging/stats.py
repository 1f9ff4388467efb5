"""The economics of one hedged call site: fire rate, win rate, time saved per win, extra calls.

The one definition of these numbers in chainrun: the engine's live counters
(:class:`HedgeStats`) and the log report (``chainrun hedge-stats``,
:mod:`chainrun.analysis.summary`)
both compute them with the functions here. They are the numbers hedging practice asks for
per hedged call site (Finagle exports ``backups_sent``, ``backups_won``,
``budget_exhausted``): a hedge that fires often and rarely wins costs load and saves
nothing (Dean and Barroso, "The Tail at Scale", CACM 2013: the copy wins only when the
primary's serving noise exceeds the copy's by more than the delay).

Definitions (each None while its denominator is 0):

* **fire rate** = fires / armed calls: of the calls with a hedge delay in force, the share
  whose primary was still outstanding at the delay d (a copy was *due*, whether it was sent
  or not). It says how often the timer went off, which is what the delay controls and what
  ``chainrun advise`` predicts; it is not how often a copy went out.
* **copies sent per call** = attempts beyond each call's first that were actually sent /
  calls: the load hedging really added. A due copy is not sent when the load budget
  refuses it (``budget_exhausted``), every copy target's circuit breaker is open
  (``circuit_open``), the client's event loop lags (``loop_lag``) or the target's rate
  limit has no room now (``rate_limited``): :func:`unsent_reason`.
  With a dead backup every fire is such a copy: fire rate 1.0, copies sent per call 0.
* **win rate** = copy wins / fires: of the fires, the share a copy won. A copy started at
  once after a non-fatal error is a retry, not a hedge: a win counts only after a fire.
* **time saved per win** = mean of (primary's answer − winning copy's answer) in ms over the
  wins whose primary was left to finish unseen (a shadow); other wins are unmeasured.
* **extra calls per turn** = attempts sent beyond the first of each call / turns (per call
  for the engine, where one call is one turn of the step).
* **fires with no copy sent** = fires after which every due copy was refused or
  suppressed: their "loss" says nothing of the copy, which never ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chainrun.hedging.errors import CircuitOpen
from chainrun.hedging.outcome import HedgeOutcome

#: why a due copy was not sent (Finagle counts ``budget_exhausted`` the same way)
UNSENT_REASONS = ("budget_exhausted", "circuit_open", "loop_lag", "rate_limited")


def unsent_reason(outcome: str | None, error_type: str | None = None) -> str | None:
    """Why an attempt was due but not sent: one of :data:`UNSENT_REASONS`, or None for an
    attempt that was sent (or a row with no outcome).

    ``outcome`` is the attempt's (``budget_exhausted``, ``suppressed``, ...);
    ``error_type`` tells the kinds of ``suppressed`` apart: ``circuit_open`` (every
    copy target's breaker open), ``rate_limited`` (the target's rate limit had no room
    now: a copy never waits) or none (the client's event loop lagged).
    """
    if outcome == "budget_exhausted":
        return "budget_exhausted"
    if outcome == "suppressed":
        return error_type if error_type in ("circuit_open", "rate_limited") else "loop_lag"
    return None


def fire_rate(fires: int, armed: int) -> float | None:
    """Fires per armed call (calls with a hedge delay in force); None when ``armed`` is 0."""
    return fires / armed if armed else None


def win_rate(wins: int, fires: int) -> float | None:
    """Copy wins per fire; None when ``fires`` is 0."""
    return wins / fires if fires else None


def time_saved_per_win_ms(saved_ms: Sequence[float]) -> float | None:
    """Mean time saved over the measured wins, in ms; None when none was measured."""
    return sum(saved_ms) / len(saved_ms) if saved_ms else None


def copies_sent_per_call(copies_sent: int, calls: int) -> float | None:
    """Attempts actually sent beyond each call's first, per call; None when ``calls`` is 0."""
    return copies_sent / calls if calls else None


def extra_calls_per_turn(extra_calls: int, turns: int) -> float | None:
    """Attempts sent beyond each call's first, per turn; None when ``turns`` is 0."""
    return extra_calls / turns if turns else None


@dataclass
class HedgeStats:
    """Counts of one call site, from the engine's outcomes or read back from the log.

    Rates are None until their denominator is > 0 (see the module's definitions).
    """

    calls: int = 0
    #: calls with a hedge delay in force (a copy could be timed)
    armed: int = 0
    #: calls whose hedge timer went off (a copy was due)
    fires: int = 0
    #: copies and retries actually sent (attempts beyond each call's first)
    copies_sent: int = 0
    #: calls in which a copy fired and a copy won
    copy_wins: int = 0
    #: copies refused by the load budget
    budget_exhausted: int = 0
    #: copies not sent because the loop lagged or every target's circuit was open
    suppressed: int = 0
    #: due copies not sent, by reason (:data:`UNSENT_REASONS`)
    unsent: dict[str, int] = field(default_factory=lambda: dict.fromkeys(UNSENT_REASONS, 0))
    #: fires after which no copy was sent (every due copy refused or suppressed)
    fires_unsent: int = 0
    #: time saved by each measured copy win, in ms
    time_saved_ms: list[float] = field(default_factory=list)

    def record(self, outcome: HedgeOutcome[Any]) -> None:
        """Count one finished call (time saved is counted by :meth:`record_time_saved`)."""
        self.add_call(
            armed=outcome.delay_ms is not None,
            fired=outcome.fired,
            won_by_copy=outcome.won_by_copy,
        )
        sent = 0
        for attempt in outcome.attempts[1:]:  # the primary is no copy (sent or not)
            sent += attempt.sent
            kind = ("circuit_open" if isinstance(attempt.error, CircuitOpen)
                    else getattr(attempt.error, "error_type", None))  # fmt: skip
            self.add_unsent(unsent_reason(attempt.outcome, kind))
        self.copies_sent += sent
        self.fires_unsent += outcome.fired and not sent

    def add_unsent(self, reason: str | None) -> None:
        """Count one due copy that was not sent (``reason`` from :func:`unsent_reason`;
        None counts nothing)."""
        if reason is None:
            return
        self.unsent[reason] += 1
        self.budget_exhausted += reason == "budget_exhausted"
        self.suppressed += reason != "budget_exhausted"

    def add_call(self, *, armed: bool, fired: bool, won_by_copy: bool) -> None:
        """Count one call's hedge state (a win counts only when the hedge fired)."""
        self.calls += 1
        self.armed += armed
        self.fires += fired
        self.copy_wins += fired and won_by_copy

    def record_time_saved(self, ms: float) -> None:
        """Count the time one copy win saved, in ms (known only when a shadow primary finished)."""
        self.time_saved_ms.append(ms)

    @property
    def fire_rate(self) -> float | None:
        """Fires per armed call (:func:`fire_rate`)."""
        return fire_rate(self.fires, self.armed)

    @property
    def win_rate(self) -> float | None:
        """Copy wins per fire (:func:`win_rate`)."""
        return win_rate(self.copy_wins, self.fires)

    @property
    def time_saved_per_win_ms(self) -> float | None:
        """Mean time saved per measured copy win, in ms (:func:`time_saved_per_win_ms`)."""
        return time_saved_per_win_ms(self.time_saved_ms)

    @property
    def copies_sent_per_call(self) -> float | None:
        """Attempts actually sent beyond the first, per call (:func:`copies_sent_per_call`)."""
        return copies_sent_per_call(self.copies_sent, self.calls)

    @property
    def extra_calls_per_call(self) -> float | None:
        """Attempts sent beyond the first, per call: the extra load hedging adds."""
        return extra_calls_per_turn(self.copies_sent, self.calls)
