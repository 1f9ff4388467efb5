"""The hedging engine: race an attempt against delayed copies of itself.

Dean and Barroso ("The Tail at Scale", CACM 56(2), 2013): if a request is still
outstanding after a delay d, send a copy to another replica, use whichever answers
first and cancel the rest. The details follow Finagle's ``BackupRequestFilter``
(percentile delay from a latency window, warm-up, a load budget, fast failures kept
out of the window) and gRPC's hedging policy (gRFC A6: attempt k at (k-1)·d, at most
``max_attempts``, a fatal status stops the call, a non-fatal one starts the next
attempt at once after any server pushback).

A copy the load budget refuses is not given up (Finagle gives it up): it stays due and
is tried again at each later tick (k·d) while the call is outstanding, recorded once as
``budget_exhausted``, and refusals do not count toward ``max_attempts``. A call that
answers soon after d drops out of the queue by itself; one still outstanding at 2d, 3d
(a slow path, the tail the copy exists for) gets the next token the budget earns. The
budget still bounds the copies: at most ``max_extra_load`` per call plus its reserve.

One departure from gRFC A6, whose attempts all go to one service: here copies go to
other targets (independent replicas), and a fatal error says nothing about another
target's answer. So while an attempt on another target is in flight, a fatal error
starts nothing more but cancels nothing: the attempts in flight run on, and the call
fails (with the last error) only when none of them answers. A copy sent to a backup that
has just died no longer cancels a healthy primary.

The engine knows nothing of what an attempt does: it calls ``attempt(info)`` and awaits
the result. Errors are not hedged (a copy of a request that failed on quota fails the
same way); only silence is. Hedge only idempotent reads.

Timing: race offsets and latencies use the running event loop's clock (the clock its
timers run on); the ``clock`` given to :class:`Hedger` ages the state shared between
calls (latency window, circuit breakers, copies-per-second cap).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from chainrun.hedging.advisor import HedgeController
from chainrun.hedging.breaker import BreakerRegistry, CircuitBreaker
from chainrun.hedging.budget import HedgeBudget
from chainrun.hedging.errors import CircuitOpen, DeadlineExceeded, NoAcceptableAnswer
from chainrun.hedging.looplag import LoopLagMonitor
from chainrun.hedging.outcome import (
    AttemptInfo,
    AttemptRecord,
    ErrorInfo,
    HedgeChange,
    HedgeOutcome,
)
from chainrun.hedging.policy import HedgePolicy
from chainrun.hedging.stats import HedgeStats
from chainrun.hedging.window import LatencyWindow

T = TypeVar("T")

logger = logging.getLogger(__name__)

# a timer may wake a hair before its due time (loop clock resolution): count that as due
_DUE_SLACK_S = 1e-6

_Mode = Literal["win", "error", "deadline"]


def default_classify_error(exc: BaseException) -> ErrorInfo:
    """Read ``exc.status`` (int or str) and ``exc.retry_after_s`` (seconds), if present."""
    status = getattr(exc, "status", None)
    if isinstance(status, bool) or not isinstance(status, int | str):
        status = None
    retry = getattr(exc, "retry_after_s", None)
    if isinstance(retry, bool) or not isinstance(retry, int | float) or not retry >= 0:
        retry = None
    return ErrorInfo(status, None if retry is None else float(retry))


async def _cancel_and_wait(tasks: Iterable[asyncio.Task[T]]) -> None:
    """Cancel ``tasks`` and wait until each has finished (its ``finally`` blocks have run).

    A cancellation of the caller while waiting is deferred until the tasks are done, then
    re-raised, so that no attempt is left running unowned.
    """
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        task.cancel()
    interrupted: asyncio.CancelledError | None = None
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError as exc:
            interrupted = exc
        pending = {task for task in pending if not task.done()}
    if interrupted is not None:
        raise interrupted


@dataclass(frozen=True)
class RaceSite(Generic[T]):
    """What one race (one :meth:`Hedger.run`) uses of its call site: the state shared
    between the site's calls, and the targets of this call in preference order.

    Attributes:
        policy: how to hedge (one attempt per call when the site has none).
        order: this call's targets, its primary first.
        breakers: the targets' circuit breakers.
        window: the site's latency window (answers and censored cut-offs, in ms).
        budget: the load budget copies draw on.
        controller: the delay and attempts per call, and the back-off.
        stats: the site's hedge statistics.
        loop_lag: the event-loop lag monitor (None: none).
        rng: the source of the shadow draws.
        running: attempts in flight (of every call of the site) -> when they started,
            in loop seconds.
        shadows: shadow watcher task -> the losing attempt's task it watches.
    """

    policy: HedgePolicy
    order: tuple[str, ...]
    breakers: BreakerRegistry
    window: LatencyWindow
    budget: HedgeBudget
    controller: HedgeController
    stats: HedgeStats
    loop_lag: LoopLagMonitor | None
    rng: random.Random
    running: dict[object, float]
    shadows: dict[asyncio.Task[None], asyncio.Task[T]]


class Hedger(Generic[T]):
    """The hedging state of one call site (one chain step): window, budget, breakers, stats.

    Args:
        policy: how to hedge; None = one attempt per call (breakers still apply).
        targets: target names (replicas, providers); ``targets[0]`` is the primary unless
            ``policy.rotate_primary``; copies go round-robin over the others (or to the
            same target if there is only one).
        breakers: a registry shared with other call sites; default: a private one built
            from the policy's ``breaker_*`` settings.
        clock: monotonic seconds for the state that ages between calls (window expiry and
            refresh, breaker windows and cool-down, copies-per-second cap).
        rng: source of the shadow draws; inject a seeded one for reproducible tests.
        loop_lag: a running :class:`LoopLagMonitor` to consult before firing copies.

    Raises:
        ValueError: no targets.
    """

    def __init__(
        self,
        policy: HedgePolicy | None,
        targets: Sequence[str],
        *,
        breakers: BreakerRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        loop_lag: LoopLagMonitor | None = None,
    ) -> None:
        if not targets:
            raise ValueError("a Hedger needs at least one target")
        self.policy = policy
        self.targets = tuple(targets)
        p = self._policy = policy if policy is not None else HedgePolicy(max_attempts=1)
        self.breakers = (
            breakers
            if breakers is not None
            else BreakerRegistry(
                p.breaker_failures, p.breaker_window_s, p.breaker_cooldown_s, clock=clock
            )
        )
        self.window = LatencyWindow(
            p.window_s,
            min_samples=p.min_samples,
            refresh_s=p.refresh_s,
            floor_ms=p.floor_ms,
            clock=clock,
        )
        self.budget = HedgeBudget(
            p.max_extra_load, max_copies_per_s=p.max_copies_per_s, clock=clock
        )
        self.stats = HedgeStats()
        self.loop_lag = loop_lag
        self.rng = rng if rng is not None else random.Random()
        #: attempts in flight (of every call) -> when they started, in loop seconds
        self._running: dict[object, float] = {}
        #: the delay and attempts per call: fixed, percentile or advised, and the back-off
        self.controller = HedgeController(
            p, self.window, clock=clock, running=self._running_ms, rng=self.rng
        )
        self._clock = clock
        #: the clock time (s) until which the window may hold seeded samples
        self._seeded_until = -math.inf
        self._calls = 0
        # shadow watcher task -> the losing attempt's task it watches
        self._shadows: dict[asyncio.Task[None], asyncio.Task[T]] = {}

    def current_delay_ms(self) -> float | None:
        """The hedge delay d in force, in ms; None = no timed copies.

        The fixed ``delay_ms``, the ``delay_percentile`` of the latency window, or the
        advised delay (while the window warms up: the policy's ``warmup_delay_ms``, which
        may be None); None when the policy has no delay or cannot hedge. A backed-off
        site arms only its probe calls with it (:mod:`chainrun.hedging.advisor`).
        """
        if not self._policy.hedges:
            return None
        return self.controller.setting.delay_ms

    def seed_window(self, samples_ms: Sequence[float]) -> int:
        """Record ``samples_ms`` (latencies in ms, e.g. the fleet's recent calls of this
        step read from the run log) in the latency window before the first call, so a
        new process hedges at the fleet's percentile instead of warming up. They expire
        with the window like any sample (after at most ``window_s``). Returns how many
        were recorded."""
        for value in samples_ms:
            self.window.record(value)
        if samples_ms:
            self._seeded_until = self._clock() + self._policy.window_s
        return len(samples_ms)

    def delay_seeded(self) -> bool:
        """Whether a call starting now gets its delay from a latency window that may still
        hold seeded samples (:meth:`seed_window`)."""
        p = self._policy
        if self._clock() >= self._seeded_until or p.delay_ms is not None or not p.hedges:
            return False
        if p.delay_percentile is not None:
            return self.window.percentile(p.delay_percentile) is not None
        # delay = "auto": advised from the window once it holds min_samples
        return self.current_delay_ms() is not None and len(self.window) >= p.min_samples

    async def run(
        self,
        attempt: Callable[[AttemptInfo], Awaitable[T]],
        *,
        release: Callable[[T], Awaitable[None]] | None = None,
        accept: Callable[[T], bool] | None = None,
        classify_error: Callable[[BaseException], ErrorInfo] | None = None,
        admit: Callable[[int, str], BaseException | None] | None = None,
    ) -> HedgeOutcome[T]:
        """Run one hedged call.

        Args:
            attempt: makes one attempt: called once per attempt sent, with its
                :class:`AttemptInfo`; awaited in its own task, cancelled if it loses.
            release: disposes of a value that lost (e.g. closes a stream); errors it raises
                are logged, not propagated.
            accept: quality gate; a value for which it returns False does not win
                (outcome ``rejected``) and the next attempt starts at once.
            classify_error: maps an attempt's exception to an :class:`ErrorInfo`
                (default :func:`default_classify_error`).
            admit: asked, without waiting, before a copy or retry (attempt number, target)
                is sent, once the budget paid for it: None sends it; an exception keeps
                it unsent (outcome ``suppressed`` with that error, the budget's token
                given back), e.g. a rate limit with no room now. The primary is not asked.

        Returns:
            The :class:`HedgeOutcome`; a failed call has ``error`` set (the fatal or last
            attempt error, :class:`DeadlineExceeded`, :class:`CircuitOpen` or
            :class:`NoAcceptableAnswer`) rather than raising: use ``outcome.result()``.

        Raises:
            asyncio.CancelledError: the caller cancelled; every attempt has been cancelled
                and awaited first.
        """
        site = RaceSite(
            self._policy, self._call_order(), self.breakers, self.window, self.budget,
            self.controller, self.stats, self.loop_lag, self.rng, self._running, self._shadows,
        )  # fmt: skip
        race = _Race(site, attempt, release, accept, classify_error or default_classify_error,
                     admit)
        try:
            outcome = await race.run()
        except BaseException as e:
            await race.settle_in_flight(None, "error")
            if isinstance(e, asyncio.CancelledError):
                # the call's hedging happened (a copy fired and was paid for): count it
                self.stats.record(race.outcome(None, e))
            raise
        self.stats.record(outcome)
        self.controller.observe(outcome, probe=outcome.probe)
        return outcome

    async def aclose(self) -> None:
        """Cancel the shadow losers still running (of every call) and wait for them.

        Their records end as ``cancelled``; their ``finally`` blocks have run on return.
        """
        watchers = list(self._shadows)
        for attempt in self._shadows.values():
            attempt.cancel()
        if watchers:
            await asyncio.wait(watchers)

    def _running_ms(self) -> list[float]:
        """How long each attempt still in flight has run, in ms (censored observations)."""
        if not self._running:
            return []
        now = asyncio.get_running_loop().time()
        return [(now - started) * 1000 for started in self._running.values()]

    def _call_order(self) -> tuple[str, ...]:
        """Targets in preference order for a new call: the call's primary first."""
        start = self._calls % len(self.targets) if self._policy.rotate_primary else 0
        self._calls += 1
        return self.targets[start:] + self.targets[:start]


class _Attempt(Generic[T]):
    """An attempt in flight: its record, its task and when it settled (loop seconds)."""

    task: asyncio.Task[T]

    def __init__(self, record: AttemptRecord, breaker: CircuitBreaker) -> None:
        self.record = record
        self.breaker = breaker
        self.settled_at: float | None = None


class _Race(Generic[T]):
    """The state of one ``Hedger.run`` call."""

    def __init__(
        self,
        site: RaceSite[T],
        factory: Callable[[AttemptInfo], Awaitable[T]],
        release: Callable[[T], Awaitable[None]] | None,
        accept: Callable[[T], bool] | None,
        classify: Callable[[BaseException], ErrorInfo],
        admit: Callable[[int, str], BaseException | None] | None = None,
    ) -> None:
        self.site = site
        self.admit = admit
        self.policy = site.policy
        self.factory = factory
        self.release = release
        self.accept = accept
        self.classify = classify
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        deadline_s = self.policy.deadline_s
        self.deadline_at = math.inf if deadline_s is None else self.t0 + deadline_s
        self.order = site.order
        self.copy_targets: tuple[str, ...] = ()
        self.records: list[AttemptRecord] = []
        self.in_flight: list[_Attempt[T]] = []
        self.delay_ms: float | None = None
        self.max_attempts = self.policy.max_attempts
        self.probe = False
        self.changes: tuple[HedgeChange, ...] = ()
        self.fired = False
        self.last_error: BaseException | None = None
        self.rejected = 0
        self.next_due = math.inf
        self.next_is_hedge = False
        self.winner: AttemptRecord | None = None
        #: a fatal error was seen while other targets' attempts ran on: start nothing more
        self.stopped = False
        #: copies the load budget refused (each recorded once as ``budget_exhausted``);
        #: they do not count toward ``max_attempts``
        self.budget_refusals = 0
        #: the copy that is due was refused by the budget and waits for the next tick
        self.waiting_for_budget = False
        #: what :meth:`_race` awaits while attempts are in flight (see _wait_settled)
        self._waiter: asyncio.Future[None] | None = None

    # ----------------------------------------------------------------- the race

    async def run(self) -> HedgeOutcome[T]:
        breakers = self.site.breakers
        primary = next((t for t in self.order if breakers.get(t).available), None)
        if primary is None:
            error = CircuitOpen(self.order)
            self.records.append(
                AttemptRecord(
                    1,
                    self.order[0],
                    None,
                    "suppressed",
                    error=error,
                    loop_lag_ms=self._monitor_lag(),
                )
            )
            return self.outcome(None, error)
        if self.policy.hedges:
            self.site.budget.deposit()
        plan = self.site.controller.plan()
        self.max_attempts, self.changes = plan.max_attempts, plan.changes
        # an open primary sends the call elsewhere, unhedged: copies would pile onto the
        # remaining targets just when capacity is short
        if primary == self.order[0]:
            self.delay_ms, self.probe = plan.delay_ms, plan.probe
        self.copy_targets = tuple(t for t in self.order if t != primary) or (primary,)
        self._start(1, primary, self._monitor_lag())
        if self.delay_ms is not None:
            self._schedule(self.t0 + self.delay_ms / 1000, hedge=True)
        return await self._race()

    async def _race(self) -> HedgeOutcome[T]:
        while True:
            now = self.loop.time()
            if now >= self.deadline_at:
                await self.settle_in_flight(None, "deadline")
                return self.outcome(None, DeadlineExceeded(self.policy.deadline_s or 0.0))
            if self.next_due <= now + _DUE_SLACK_S and self._pending():
                self._fire_due(now)
            if not self.in_flight and not self._pending():
                error = self.last_error or NoAcceptableAnswer(self.rejected)
                return self.outcome(None, error)
            wake = min(self.next_due if self._pending() else math.inf, self.deadline_at)
            if self.in_flight:
                await self._wait_settled(wake)
            else:
                await asyncio.sleep(0.0 if wake == math.inf else max(0.0, wake - now))
            outcome = await self._process_settled()
            if outcome is not None:
                return outcome

    async def _wait_settled(self, wake_at: float) -> None:
        """Return once an attempt in flight has settled or the loop clock reaches
        ``wake_at`` (loop seconds; ``math.inf``: no timer).

        What ``asyncio.wait(FIRST_COMPLETED, timeout=...)`` does, for less: the attempt's
        own task wakes this waiter as it settles (:meth:`_call`), one loop turn instead
        of two (no done-callback hop, no callbacks added to and removed from every task),
        and the hedge timer or deadline is one timer handle (``loop.call_at``).
        """
        if any(a.task.done() for a in self.in_flight):
            return
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._waiter = waiter
        timer = None if wake_at == math.inf else self.loop.call_at(wake_at, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _process_settled(self) -> HedgeOutcome[T] | None:
        """Handle the attempts that settled, earliest first; return the outcome if decided."""
        # earliest first; at one instant answers before errors, so a fatal error never
        # beats an answer that arrived at the same time
        settled = [a for a in self.in_flight if a.task.done()]
        if len(settled) > 1:
            settled.sort(
                key=lambda a: (
                    a.settled_at if a.settled_at is not None else math.inf,
                    a.task.cancelled() or a.task.exception() is not None,
                    a.record.number,
                )
            )
        for att in settled:
            rec = att.record
            now = self.loop.time()
            if att.task.cancelled():
                # cancelled from inside the attempt: an error without a status (fatal)
                exc: BaseException | None = asyncio.CancelledError()
            else:
                exc = att.task.exception()
            rec.answered_offset_ms = self._offset_ms(_or(att.settled_at, now))
            if exc is None:
                value = att.task.result()
                if self.accept is None or self.accept(value):
                    self.in_flight.remove(att)
                    return await self._win(att, value)
                self.in_flight.remove(att)
                rec.outcome = "rejected"
                self.rejected += 1
                att.breaker.record_success()  # it answered: the target is up
                await self._release(value)
                self._schedule(now, hedge=False)
                continue
            self.in_flight.remove(att)
            info = self.classify(exc)
            rec.outcome, rec.error, rec.error_status = "error", exc, info.status
            att.breaker.record_failure()
            self.last_error = exc
            if info.status is None or info.status not in self.policy.non_fatal:
                # "in flight" = not settled yet: one that settled at this instant has
                # answered (it was handled first, above) or failed
                if not any(
                    a.record.target != rec.target and not a.task.done() for a in self.in_flight
                ):
                    await self.settle_in_flight(None, "error")
                    return self.outcome(None, exc)
                # another target may still answer: start nothing more, let the attempts
                # in flight run (the module text); the race ends on their outcome
                self.stopped = True
                self.next_due = math.inf
                continue
            self._schedule(now + (info.retry_after_s or 0.0), hedge=False)
        return None

    async def _win(self, att: _Attempt[T], value: T) -> HedgeOutcome[T]:
        rec = att.record
        if rec.number > 1:
            rec.outcome = "duplicate"
        else:
            rec.outcome = "primary" if self.fired else "not_fired"
        self.winner = rec
        att.breaker.record_success()
        if rec.latency_ms is not None:
            self.site.window.record(rec.latency_ms)
        outcome = self.outcome(value, None)
        await self.settle_in_flight(outcome, "win")
        return outcome

    # ------------------------------------------------------------ starting attempts

    def _pending(self) -> bool:
        """Whether another attempt is scheduled that may still start."""
        if self.next_due == math.inf or self._attempts_used() >= self.max_attempts:
            return False
        if self.next_due >= self.deadline_at:
            return False
        # a hedge copies something in flight; with nothing in flight there is nothing to copy
        return not (self.next_is_hedge and not self.in_flight)

    def _schedule(self, at: float, *, hedge: bool) -> None:
        """Set when the next attempt is due (loop seconds); a retry overrides a pending hedge."""
        if not self.stopped and self._attempts_used() < self.max_attempts:
            self.next_due, self.next_is_hedge = at, hedge

    def _attempts_used(self) -> int:
        """Attempts that count toward ``max_attempts``: all but the budget's refusals."""
        return len(self.records) - self.budget_refusals

    def _fire_due(self, now: float) -> None:
        """Start (or refuse) the attempt that is due, and schedule the next hedge."""
        scheduled, is_hedge = self.next_due, self.next_is_hedge
        self.next_due = math.inf
        if is_hedge:
            self.fired = True
        number = len(self.records) + 1
        lag_ms = _max_or_none(self._monitor_lag(), max(0.0, now - scheduled) * 1000)
        intended = self.copy_targets[(number - 2) % len(self.copy_targets)]
        max_lag = self.policy.max_loop_lag_ms
        if max_lag is not None and lag_ms is not None and lag_ms > max_lag:
            self._refuse(number, intended, "suppressed", lag_ms)
        else:
            target = self._copy_target(number)
            if target is None:
                self._refuse(number, intended, "suppressed", lag_ms, CircuitOpen(self.copy_targets))
            elif not self.site.budget.try_withdraw():
                # the copy waits: it is due again at the next tick (recorded once)
                if not self.waiting_for_budget:
                    self._refuse(number, target, "budget_exhausted", lag_ms)
                    self.budget_refusals += 1
                self.waiting_for_budget = is_hedge
            else:
                self.waiting_for_budget = False
                refused = self.admit(number, target) if self.admit is not None else None
                if refused is not None:
                    self.site.budget.refund()
                    self._refuse(number, target, "suppressed", lag_ms, refused)
                else:
                    self._start(number, target, lag_ms)
        if self.delay_ms is not None:
            # attempt k at (k-1)·d; after a stall, do not fire the missed copies in a burst
            due = scheduled + self.delay_ms / 1000
            self._schedule(due if due > now else now + self.delay_ms / 1000, hedge=True)

    def _copy_target(self, number: int) -> str | None:
        """Round-robin over the copy targets, skipping those whose breaker is open."""
        n = len(self.copy_targets)
        for i in range(n):
            target = self.copy_targets[(number - 2 + i) % n]
            if self.site.breakers.get(target).available:
                return target
        return None

    def _start(self, number: int, target: str, lag_ms: float | None) -> None:
        breaker = self.site.breakers.get(target)
        breaker.allow()  # the caller checked `available`; this takes a half-open probe slot
        now = self.loop.time()
        offset = self._offset_ms(now)
        rec = AttemptRecord(
            number,
            target,
            offset,
            "cancelled",  # provisional until the attempt settles
            loop_lag_ms=lag_ms,
            fired_during_loop_lag=self._lagging(lag_ms),
        )
        att: _Attempt[T] = _Attempt(rec, breaker)
        self.site.running[att] = now
        info = AttemptInfo(number, target, offset, lag_ms)
        att.task = self.loop.create_task(self._call(att, info), name=f"hedge-{number}-{target}")
        self.records.append(rec)
        self.in_flight.append(att)

    def _refuse(
        self,
        number: int,
        target: str,
        outcome: Literal["suppressed", "budget_exhausted"],
        lag_ms: float | None,
        error: BaseException | None = None,
    ) -> None:
        self.records.append(
            AttemptRecord(
                number,
                target,
                None,
                outcome,
                error=error,
                loop_lag_ms=lag_ms,
                fired_during_loop_lag=self._lagging(lag_ms),
            )
        )

    async def _call(self, att: _Attempt[T], info: AttemptInfo) -> T:
        """One attempt's task: await the factory, note when it settled and wake the race.

        The wake-up is the last thing the task does before it ends in the same step, so
        the race, which resumes on a later loop turn, finds the task done.
        """
        try:
            value = await self.factory(info)
            att.settled_at = self.loop.time()
            return value
        except asyncio.CancelledError:
            raise
        except BaseException:
            att.settled_at = self.loop.time()
            raise
        finally:
            self.site.running.pop(att, None)
            waiter = self._waiter
            if waiter is not None:
                _wake(waiter)

    # ------------------------------------------------------------------ settling

    async def settle_in_flight(self, outcome: HedgeOutcome[T] | None, mode: _Mode) -> None:
        """Dispose of every attempt still in flight once the race is decided.

        ``win``: each unsettled loser becomes a shadow with probability ``shadow_fraction``
        (needs ``outcome``), the others are cancelled. ``error``: all are cancelled.
        ``deadline``: all are cancelled and recorded as errors (DeadlineExceeded).
        Losers that settled in the same instant are released or recorded as they ended.
        """
        if not self.in_flight:  # the common case: the only attempt won
            return
        settled = [a for a in self.in_flight if a.task.done()]
        to_cancel: list[_Attempt[T]] = []
        cut_at = self._offset_ms(self.loop.time())
        for att in self.in_flight:
            if att.task.done():
                continue
            if outcome is not None and mode == "win" and self._draw_shadow():
                self._shadow(att, outcome)
            else:
                to_cancel.append(att)
                self._censor(att.record, cut_at)
        # cancel first (a cancellation of run() is deferred until these are done), release after
        self.in_flight = settled + to_cancel
        await _cancel_and_wait([a.task for a in to_cancel])
        self.in_flight = settled
        for att in to_cancel:
            await self._after_cancel(att, deadline=mode == "deadline")
        while self.in_flight:
            await self._close_settled_loser(self.in_flight.pop(0))

    def _censor(self, rec: AttemptRecord, cut_at_ms: float) -> None:
        """Put an attempt cut short into the window: its latency is longer than it ran
        (the window's Kaplan-Meier estimate counts it; see :mod:`chainrun.hedging.window`)."""
        if rec.started_offset_ms is not None:
            self.site.window.record_censored(cut_at_ms - rec.started_offset_ms)

    async def _close_settled_loser(self, att: _Attempt[T]) -> None:
        """A loser that settled before it could be cancelled: release or record it."""
        rec = att.record
        if att.task.cancelled():
            rec.outcome = "cancelled"
            att.breaker.record_cancelled()
            return
        if att.settled_at is not None:
            rec.answered_offset_ms = self._offset_ms(att.settled_at)
        exc = att.task.exception()
        if exc is None:
            rec.outcome = "cancelled"
            att.breaker.record_success()
            if rec.latency_ms is not None:
                self.site.window.record(rec.latency_ms)  # it answered, a hair too late
            await self._release(att.task.result())
        else:
            rec.outcome, rec.error = "error", exc
            rec.error_status = self.classify(exc).status
            att.breaker.record_failure()

    async def _after_cancel(self, att: _Attempt[T], *, deadline: bool) -> None:
        """Record an attempt we cancelled (neither success nor failure for its breaker)."""
        rec = att.record
        att.breaker.record_cancelled()
        if deadline:
            rec.outcome = "error"
            rec.error = DeadlineExceeded(self.policy.deadline_s or 0.0)
        else:
            rec.outcome = "cancelled"
        if not att.task.cancelled() and att.task.exception() is None:
            await self._release(att.task.result())  # it ignored the cancellation and answered

    def _draw_shadow(self) -> bool:
        """Whether a loser is left running as a shadow (probability ``shadow_fraction``)."""
        fraction = self.policy.shadow_fraction
        return fraction > 0 and self.site.rng.random() < fraction

    def _shadow(self, att: _Attempt[T], outcome: HedgeOutcome[T]) -> None:
        task = self.loop.create_task(
            self._watch_shadow(att, outcome), name=f"hedge-shadow-{att.record.number}"
        )
        outcome.watch_shadow(task)
        shadows = self.site.shadows
        shadows[task] = att.task
        task.add_done_callback(lambda done: shadows.pop(done, None))

    async def _watch_shadow(self, att: _Attempt[T], outcome: HedgeOutcome[T]) -> None:
        """Let a loser run to its end (within the deadline) to measure it, then release it."""
        timeout = (
            None if self.deadline_at == math.inf else max(0.0, self.deadline_at - self.loop.time())
        )
        try:
            done, _ = await asyncio.wait({att.task}, timeout=timeout)
        except asyncio.CancelledError:
            await _cancel_and_wait([att.task])
            await self._after_cancel(att, deadline=False)
            raise
        if not done:
            self._censor(att.record, self._offset_ms(self.loop.time()))
            await _cancel_and_wait([att.task])
            await self._after_cancel(att, deadline=False)
            att.record.error = DeadlineExceeded(self.policy.deadline_s or 0.0)
            return
        if att.task.cancelled() or att.task.exception() is not None:
            await self._close_settled_loser(att)
            return
        rec = att.record
        value = att.task.result()
        rec.answered_offset_ms = self._offset_ms(_or(att.settled_at, self.loop.time()))
        att.breaker.record_success()
        try:
            accepted = self.accept is None or self.accept(value)
        except Exception:
            # nobody awaits this task's result: a failing gate is logged, not raised
            logger.warning("quality gate failed on a shadow answer", exc_info=True)
            accepted = False
        if accepted:
            rec.outcome = "shadow_finished"
            if rec.latency_ms is not None:
                self.site.window.record(rec.latency_ms)
            self._note_time_saved(rec, outcome)
        else:
            rec.outcome = "rejected"
        await self._release(value)

    def _note_time_saved(self, loser: AttemptRecord, outcome: HedgeOutcome[T]) -> None:
        """Time saved = when the primary would have answered - when the winning copy did."""
        winner = self.winner
        if loser.number != 1 or winner is None or winner.number == 1:
            return
        if loser.answered_offset_ms is None or winner.answered_offset_ms is None:
            return
        saved = loser.answered_offset_ms - winner.answered_offset_ms
        outcome.time_saved_ms = saved
        self.site.stats.record_time_saved(saved)

    async def _release(self, value: T) -> None:
        if self.release is None:
            return
        try:
            await self.release(value)
        except Exception:
            # a loser's disposal failing must not spoil the winner's answer
            logger.warning("releasing a losing hedge attempt's value failed", exc_info=True)

    # ------------------------------------------------------------------- helpers

    def outcome(self, value: T | None, error: BaseException | None) -> HedgeOutcome[T]:
        winner = self.winner
        return HedgeOutcome(
            value=value,
            error=error,
            winner=None if winner is None else winner.number,
            delay_ms=self.delay_ms,
            fired=self.fired,
            won_by_copy=winner is not None and winner.number > 1,
            time_saved_ms=None,
            attempts=self.records,
            probe=self.probe,
            changes=self.changes,
        )

    def _offset_ms(self, at: float) -> float:
        return (at - self.t0) * 1000

    def _monitor_lag(self) -> float | None:
        monitor = self.site.loop_lag
        return None if monitor is None else monitor.lag_ms

    def _lagging(self, lag_ms: float | None) -> bool:
        """Whether ``lag_ms`` exceeds max_loop_lag_ms or, if unset, half the hedge delay."""
        threshold = self.policy.max_loop_lag_ms
        if threshold is None and self.delay_ms is not None:
            threshold = 0.5 * self.delay_ms
        return threshold is not None and lag_ms is not None and lag_ms > threshold


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _max_or_none(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
