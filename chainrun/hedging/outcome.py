"""What the hedging engine reports: per-attempt records and the outcome of a call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, TypeVar, cast

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

#: What became of one attempt of a hedged call.
AttemptOutcome = Literal[
    "not_fired",  # the winner, and no copy was ever due (or no hedging at all)
    "primary",  # the first attempt won a race in which a copy fired
    "duplicate",  # a copy won
    "cancelled",  # a loser, cancelled (or released) when the race settled
    "shadow_finished",  # a loser left running unseen (shadow) that answered later
    "budget_exhausted",  # a copy the load budget refused (never sent)
    "suppressed",  # a copy not sent: event loop lagging, or circuit open for every target
    "rejected",  # answered, but failed the quality gate
    "error",  # raised, or was still running at the deadline
]


class ErrorInfo(NamedTuple):
    """How an attempt's exception is to be treated.

    ``status`` is matched against ``HedgePolicy.non_fatal`` (an HTTP status such as 429 or
    a name such as ``"unavailable"``); ``retry_after_s`` is server pushback in seconds
    (``Retry-After``, gRPC ``grpc-retry-pushback-ms``) before the next attempt may start.
    """

    status: int | str | None
    retry_after_s: float | None = None


@dataclass(frozen=True)
class AttemptInfo:
    """Passed to the attempt factory: which attempt this is and where it goes."""

    #: 1 = the primary, 2.. = copies
    number: int
    #: the target (replica, provider) this attempt must use
    target: str
    #: when the attempt started, in ms since the race started
    started_offset_ms: float
    #: event-loop lag at start, in ms (None = unknown: no monitor and not timer-started)
    loop_lag_ms: float | None


@dataclass
class AttemptRecord:
    """One attempt of a call: sent or refused, and what became of it. Offsets in ms since start."""

    number: int
    target: str
    #: None if the attempt was never sent (budget_exhausted, suppressed)
    started_offset_ms: float | None
    outcome: AttemptOutcome
    #: when it settled (answered or raised), ms since the race started; None if it never did
    answered_offset_ms: float | None = None
    error: BaseException | None = None
    error_status: int | str | None = None
    loop_lag_ms: float | None = None
    #: the event loop lagged more than the threshold when this attempt was due
    fired_during_loop_lag: bool = False

    @property
    def latency_ms(self) -> float | None:
        """Its own latency (answered - started) in ms, if it was sent and settled."""
        if self.started_offset_ms is None or self.answered_offset_ms is None:
            return None
        return self.answered_offset_ms - self.started_offset_ms

    @property
    def sent(self) -> bool:
        """Whether the attempt was actually started."""
        return self.started_offset_ms is not None


#: what a call site's hedge is doing (:class:`HedgeSetting`)
Mode = Literal["warm_up", "hedging", "backed_off"]


@dataclass(frozen=True)
class HedgeSetting:
    """What is in force: delay in ms (None: no timed copy), attempts, mode."""

    delay_ms: float | None
    max_attempts: int
    mode: Mode

    def describe(self) -> str:
        """One phrase: ``"d = 412 ms, 3 attempts"``, ``"backed off (probes at d = ...)"``."""
        base = (
            "no timed copy"
            if self.delay_ms is None
            else f"d = {self.delay_ms:.0f} ms, {self.max_attempts} attempts"
        )
        if self.mode == "backed_off":
            return f"backed off ({base} on probe calls only)"
        return f"warm-up ({base})" if self.mode == "warm_up" else base


@dataclass(frozen=True)
class HedgeChange:
    """One decision of the controller. ``at`` is wall time (Unix seconds, UTC);
    ``prediction`` holds the advisor's numbers for the new setting (delay changes)."""

    at: float
    old: HedgeSetting
    new: HedgeSetting
    why: str
    kind: Literal["advised", "backed_off", "resumed"]
    prediction: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{at, kind, old, new, why, prediction}`` (settings as dicts)."""
        return asdict(self)


@dataclass
class HedgeOutcome(Generic[T]):
    """The result of one hedged call (one ``Hedger.run``).

    Shadow losers keep running after ``run`` returns; they update :attr:`attempts` and
    :attr:`time_saved_ms` when they finish: ``await outcome.shadows_done()`` to wait.
    """

    value: T | None
    error: BaseException | None
    #: number of the winning attempt; None if the call failed
    winner: int | None
    #: hedge delay d in force, in ms; None = no timed copies this call (warm-up, circuit
    #: open on the primary, no delay configured, or no policy)
    delay_ms: float | None
    #: the hedge timer went off while nothing had answered (a copy was due: sent or refused)
    fired: bool
    won_by_copy: bool
    #: primary's answer minus the winning copy's answer, in ms, once the primary (left to
    #: finish as a shadow) answered; None when unknown or when the primary won
    time_saved_ms: float | None
    attempts: list[AttemptRecord]
    #: the call was one of the probes a backed-off site still hedges
    probe: bool = False
    #: decisions of the site's controller made just before this call (to log with it)
    changes: tuple[HedgeChange, ...] = ()
    _shadows: list[asyncio.Task[None]] = field(default_factory=list, repr=False)

    def watch_shadow(self, task: asyncio.Task[None]) -> None:
        """Count ``task`` (the engine's watcher of a loser left running as a shadow) among
        this call's shadows (:attr:`shadows_pending`, :meth:`shadows_done`)."""
        self._shadows.append(task)

    @property
    def shadows_pending(self) -> bool:
        """Whether a shadow loser of this call is still running."""
        return any(not task.done() for task in self._shadows)

    async def shadows_done(self) -> None:
        """Wait until every shadow loser of this call has finished (or been cancelled)."""
        import asyncio  # here, not at the top: the run log's rows import this module

        pending = [task for task in self._shadows if not task.done()]
        if pending:
            await asyncio.wait(pending)

    def result(self) -> T:
        """The winning value.

        Raises:
            BaseException: the call's error (an attempt's own error, or a HedgingError).
        """
        if self.error is not None:
            raise self.error
        return cast(T, self.value)
