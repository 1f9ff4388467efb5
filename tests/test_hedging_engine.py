"""The hedging engine (Hedger.run), one test per rule of the spec.

Most tests run on a virtual-time event loop (:class:`VirtualClockLoop`): its clock jumps
to the next timer instead of sleeping, so scripted latencies of seconds take no wall time
and every offset is exact. A few run on the real loop (pytest-asyncio) with small delays
to show the same behaviour there.

The fake backend (:class:`FakeBackend`) is an attempt factory built from
``asyncio.sleep`` with a scripted latency and result per attempt, and an event log.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from virtual_time import run_virtual, vloop

from chainrun.hedging import (
    AttemptInfo,
    AttemptRecord,
    CircuitOpen,
    DeadlineExceeded,
    ErrorInfo,
    HedgeBudget,
    HedgeOutcome,
    HedgePolicy,
    Hedger,
    LoopLagMonitor,
    NoAcceptableAnswer,
    default_classify_error,
)

R = TypeVar("R")

# ------------------------------------------------------------------ the fake backend


class StatusError(Exception):
    """An attempt failure with a status, as a provider adapter would raise it."""

    def __init__(self, status: int | str, retry_after_s: float | None = None) -> None:
        super().__init__(f"status {status}")
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass
class Step:
    """What one attempt does: wait ``latency_s`` seconds, then return ``value`` or raise."""

    latency_s: float
    value: str | None = None
    error: Callable[[], BaseException] | None = None


@dataclass
class FakeBackend:
    """Attempt factory: the step for each attempt comes from ``script(info)``.

    ``log`` holds (loop time in s, event, attempt number, target); events are
    start, answer, raise, cancelled, finally. ``released`` holds released values.
    """

    script: Callable[[AttemptInfo], Step]
    log: list[tuple[float, str, int, str]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    infos: list[AttemptInfo] = field(default_factory=list)

    async def __call__(self, info: AttemptInfo) -> str:
        loop = asyncio.get_running_loop()
        step = self.script(info)
        self.infos.append(info)
        self._note(loop, "start", info)
        try:
            await asyncio.sleep(step.latency_s)
            if step.error is not None:
                self._note(loop, "raise", info)
                raise step.error()
            self._note(loop, "answer", info)
            return step.value if step.value is not None else f"answer-{info.number}"
        except asyncio.CancelledError:
            self._note(loop, "cancelled", info)
            raise
        finally:
            self._note(loop, "finally", info)  # stands for "the stream was closed"

    async def release(self, value: str) -> None:
        self.released.append(value)

    def _note(self, loop: asyncio.AbstractEventLoop, event: str, info: AttemptInfo) -> None:
        self.log.append((loop.time(), event, info.number, info.target))

    def events(self, event: str) -> list[int]:
        return [number for _, e, number, _ in self.log if e == event]

    def times(self, event: str) -> list[float]:
        return [t for t, e, _, _ in self.log if e == event]


def by_number(steps: dict[int, Step]) -> Callable[[AttemptInfo], Step]:
    return lambda info: steps[info.number]


def outcomes(outcome: HedgeOutcome[Any]) -> list[str]:
    return [a.outcome for a in outcome.attempts]


# ------------------------------------------------------------------ single attempt


def test_no_policy_is_one_attempt() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(5.0)}))
        hedger: Hedger[str] = Hedger(None, ["a", "b"])
        outcome = await hedger.run(backend)
        assert outcome.result() == "answer-1"
        assert outcome.delay_ms is None and not outcome.fired and outcome.winner == 1
        assert outcomes(outcome) == ["not_fired"]
        assert outcome.attempts[0].target == "a"
        assert outcome.attempts[0].answered_offset_ms == pytest.approx(5000)

    run_virtual(main)


def test_max_attempts_one_is_still_deadline_bounded() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(5.0)}))
        hedger: Hedger[str] = Hedger(
            HedgePolicy(delay_ms=100, max_attempts=1, deadline_s=2.0), ["a", "b"]
        )
        outcome = await hedger.run(backend)
        assert isinstance(outcome.error, DeadlineExceeded)
        assert vloop().time() == pytest.approx(2.0)
        assert outcomes(outcome) == ["error"] and outcome.delay_ms is None
        assert backend.events("start") == [1] and backend.events("finally") == [1]
        with pytest.raises(DeadlineExceeded):
            outcome.result()

    run_virtual(main)


# ------------------------------------------------------------------ the race


def test_fast_primary_never_starts_a_copy() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(0.010), 2: Step(0.001)}))
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=50, max_attempts=3), ["a", "b"])
        outcome = await hedger.run(backend)
        await asyncio.sleep(1.0)  # long past d: still nothing else started
        assert outcome.value == "answer-1"
        assert outcomes(outcome) == ["not_fired"]
        assert not outcome.fired and not outcome.won_by_copy and outcome.delay_ms == 50
        assert backend.events("start") == [1]
        assert hedger.budget.balance == pytest.approx(1.1)  # reserve + one deposit, none spent

    run_virtual(main)


def test_slow_primary_gets_a_copy_at_d_and_the_copy_wins() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(2.0), 2: Step(0.3)}))
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=500, max_attempts=2), ["a", "b"])
        outcome = await hedger.run(backend, release=backend.release)
        primary, copy = outcome.attempts
        assert outcome.value == "answer-2" and outcome.winner == 2
        assert outcome.fired and outcome.won_by_copy
        assert (primary.outcome, copy.outcome) == ("cancelled", "duplicate")
        assert (primary.target, copy.target) == ("a", "b")
        assert copy.started_offset_ms == pytest.approx(500)
        assert copy.answered_offset_ms == pytest.approx(800)
        assert primary.answered_offset_ms is None
        # the loser was cancelled and its finally (stream close) ran before run() returned
        assert backend.events("cancelled") == [1] and 1 in backend.events("finally")
        assert vloop().time() == pytest.approx(0.8)
        assert outcome.time_saved_ms is None  # the primary did not run to its end

    run_virtual(main)


def test_primary_wins_a_race_in_which_a_copy_fired() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(0.7), 2: Step(1.0)}))
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=500, max_attempts=2), ["a", "b"])
        outcome = await hedger.run(backend)
        assert outcome.value == "answer-1"
        assert outcomes(outcome) == ["primary", "cancelled"]
        assert outcome.fired and not outcome.won_by_copy
        assert backend.events("finally") == [2, 1] or sorted(backend.events("finally")) == [1, 2]

    run_virtual(main)


def test_three_second_deadline_one_second_copies_at_most_three_calls() -> None:
    """A bimodal classifier, 3 s deadline, a copy every second: calls at 0, 1, 2 s."""

    async def main() -> None:
        policy = HedgePolicy(delay_ms=1000, max_attempts=3, deadline_s=3.0, max_extra_load=2.0)
        backend = FakeBackend(lambda info: Step(10.0))  # every call draws the cold path
        hedger: Hedger[str] = Hedger(policy, ["a", "b", "c"])
        outcome = await hedger.run(backend)
        assert isinstance(outcome.error, DeadlineExceeded)
        assert backend.times("start") == pytest.approx([0.0, 1.0, 2.0])
        assert [a.target for a in outcome.attempts] == ["a", "b", "c"]
        assert outcomes(outcome) == ["error"] * 3
        assert all(isinstance(a.error, DeadlineExceeded) for a in outcome.attempts)
        assert vloop().time() == pytest.approx(3.0)
        assert sorted(backend.events("finally")) == [1, 2, 3]

        # the warm path on the third call answers inside the deadline
        steps = {1: Step(10.0), 2: Step(10.0), 3: Step(0.2)}
        backend = FakeBackend(by_number(steps))
        start = vloop().time()
        outcome = await hedger.run(backend)
        assert outcome.winner == 3 and outcomes(outcome) == ["cancelled", "cancelled", "duplicate"]
        assert vloop().time() - start == pytest.approx(2.2)

    run_virtual(main)


def test_copies_round_robin_over_the_other_targets() -> None:
    async def main() -> None:
        policy = HedgePolicy(delay_ms=100, max_attempts=4, max_extra_load=5.0)
        backend = FakeBackend(lambda info: Step(1.0))
        hedger: Hedger[str] = Hedger(policy, ["a", "b", "c"])
        outcome = await hedger.run(backend)
        assert [a.target for a in outcome.attempts] == ["a", "b", "c", "b"]
        assert [i.target for i in backend.infos] == ["a", "b", "c", "b"]
        assert outcome.winner == 1  # started first, same latency

        single: Hedger[str] = Hedger(policy, ["only"])
        outcome = await single.run(FakeBackend(lambda info: Step(1.0)))
        assert [a.target for a in outcome.attempts] == ["only"] * 4

    run_virtual(main)


def test_rotate_primary_round_robins_the_primary_per_call() -> None:
    async def main() -> None:
        policy = HedgePolicy(delay_ms=100, max_attempts=2, rotate_primary=True, max_extra_load=5)
        hedger: Hedger[str] = Hedger(policy, ["a", "b", "c"])
        seen = []
        for _ in range(4):
            outcome = await hedger.run(FakeBackend(by_number({1: Step(0.5), 2: Step(0.1)})))
            seen.append([a.target for a in outcome.attempts])
        assert seen == [["a", "b"], ["b", "c"], ["c", "a"], ["a", "b"]]

    run_virtual(main)


def test_attempt_info_is_passed_to_the_factory() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(1.0), 2: Step(0.1)}))
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=250), ["a", "b"])
        await hedger.run(backend)
        first, second = backend.infos
        assert (first.number, first.target, first.loop_lag_ms) == (1, "a", None)
        assert (second.number, second.target) == (2, "b")
        assert second.started_offset_ms == pytest.approx(250)
        assert second.loop_lag_ms == pytest.approx(0, abs=1e-6)  # the timer was on time

    run_virtual(main)


def test_same_instant_loser_is_released() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(1.0), 2: Step(0.5)}))
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=500), ["a", "b"])
        outcome = await hedger.run(backend, release=backend.release)
        # both answer at t = 1.0 s: the earlier-started attempt wins the tie
        assert outcome.winner == 1
        assert outcomes(outcome) == ["primary", "cancelled"]
        assert outcome.attempts[1].answered_offset_ms == pytest.approx(1000)
        assert backend.released == ["answer-2"]
        assert backend.events("cancelled") == []

    run_virtual(main)


# ------------------------------------------------------------------ errors


def test_an_error_ends_the_race_without_a_copy() -> None:
    async def main() -> None:
        steps = {1: Step(0.010, error=lambda: StatusError(500))}
        backend = FakeBackend(by_number(steps))
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=50, max_attempts=3), ["a", "b"])
        outcome = await hedger.run(backend)
        await asyncio.sleep(1.0)
        assert isinstance(outcome.error, StatusError)
        assert outcomes(outcome) == ["error"] and outcome.attempts[0].error_status == 500
        assert backend.events("start") == [1] and not outcome.fired
        assert len(hedger.window) == 0
        with pytest.raises(StatusError):
            outcome.result()

    run_virtual(main)


def test_a_fatal_error_of_a_copy_on_another_target_does_not_cancel_the_primary() -> None:
    """The copy's target (a backup that just died) fails fast: the primary, on another
    target, runs on and wins; no further copy starts after the fatal error."""

    async def main() -> None:
        steps = {1: Step(5.0), 2: Step(0.05, error=lambda: StatusError("unavailable"))}
        backend = FakeBackend(by_number(steps))
        policy = HedgePolicy(delay_ms=100, max_attempts=3, max_extra_load=5)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        outcome = await hedger.run(backend)
        assert outcome.error is None and outcome.winner == 1
        assert outcomes(outcome) == ["primary", "error"]
        assert outcome.attempts[1].error_status == "unavailable"
        assert backend.events("start") == [1, 2]  # no third attempt after the fatal error
        assert vloop().time() == pytest.approx(5.0)

    run_virtual(main)


def test_a_fatal_error_with_no_other_target_in_flight_ends_the_call() -> None:
    """One target (copies go to the same service, as in gRFC A6): a fatal error of the
    copy cancels the primary at once."""

    async def main() -> None:
        steps = {1: Step(5.0), 2: Step(0.1, error=lambda: StatusError("unavailable"))}
        backend = FakeBackend(by_number(steps))
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=100), ["a"])
        outcome = await hedger.run(backend)
        assert isinstance(outcome.error, StatusError)
        assert outcomes(outcome) == ["cancelled", "error"]
        assert backend.events("cancelled") == [1]
        assert vloop().time() == pytest.approx(0.2)

    run_virtual(main)


def test_non_fatal_429_with_retry_after_starts_the_next_copy_after_the_wait() -> None:
    async def main() -> None:
        steps = {1: Step(0.010, error=lambda: StatusError(429, retry_after_s=0.3)), 2: Step(0.05)}
        backend = FakeBackend(by_number(steps))
        policy = HedgePolicy(delay_ms=1000, max_attempts=3, non_fatal=frozenset({429}))
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        outcome = await hedger.run(backend)
        assert outcome.value == "answer-2"
        assert outcomes(outcome) == ["error", "duplicate"]
        assert outcome.attempts[0].error_status == 429
        assert outcome.attempts[1].target == "b"
        assert outcome.attempts[1].started_offset_ms == pytest.approx(310)
        assert not outcome.fired  # no hedge timer went off: this was a retry
        assert len(hedger.window) == 1  # the copy's latency, not the error's

    run_virtual(main)


def test_non_fatal_without_retry_after_starts_the_next_at_once() -> None:
    async def main() -> None:
        steps = {1: Step(0.010, error=lambda: StatusError(503)), 2: Step(0.05)}
        backend = FakeBackend(by_number(steps))
        policy = HedgePolicy(delay_ms=1000, non_fatal=frozenset({503}))
        outcome = await Hedger[str](policy, ["a", "b"]).run(backend)
        assert outcome.attempts[1].started_offset_ms == pytest.approx(10)
        assert outcome.value == "answer-2"

    run_virtual(main)


def test_pushback_beyond_the_deadline_ends_the_call_with_that_error() -> None:
    async def main() -> None:
        steps = {1: Step(0.010, error=lambda: StatusError(429, retry_after_s=30.0))}
        backend = FakeBackend(by_number(steps))
        policy = HedgePolicy(delay_ms=500, deadline_s=3.0, non_fatal=frozenset({429}))
        outcome = await Hedger[str](policy, ["a", "b"]).run(backend)
        assert isinstance(outcome.error, StatusError) and outcome.error.status == 429
        assert vloop().time() == pytest.approx(0.010)  # did not sit out the deadline
        assert backend.events("start") == [1]

    run_virtual(main)


def test_when_every_attempt_fails_the_error_is_the_last_one() -> None:
    async def main() -> None:
        errors = iter([StatusError(429), StatusError(503), StatusError(429)])
        backend = FakeBackend(lambda info: Step(0.01, error=lambda: next(errors)))
        policy = HedgePolicy(
            delay_ms=500, max_attempts=3, non_fatal=frozenset({429, 503}), max_extra_load=5
        )
        outcome = await Hedger[str](policy, ["a", "b"]).run(backend)
        assert outcomes(outcome) == ["error", "error", "error"]
        assert outcome.error is outcome.attempts[-1].error
        assert [a.error_status for a in outcome.attempts] == [429, 503, 429]

    run_virtual(main)


def test_custom_error_classifier() -> None:
    async def main() -> None:
        steps = {1: Step(0.01, error=lambda: ConnectionResetError()), 2: Step(0.01)}

        def classify(exc: BaseException) -> ErrorInfo:
            if isinstance(exc, ConnectionError):
                return ErrorInfo("connection", 0.1)
            return default_classify_error(exc)

        policy = HedgePolicy(delay_ms=500, non_fatal=frozenset({"connection"}))
        outcome = await Hedger[str](policy, ["a", "b"]).run(
            FakeBackend(by_number(steps)), classify_error=classify
        )
        assert outcome.value == "answer-2"
        assert outcome.attempts[1].started_offset_ms == pytest.approx(110)

    run_virtual(main)


def test_default_classifier_reads_status_and_retry_after() -> None:
    assert default_classify_error(StatusError(429, 1.5)) == ErrorInfo(429, 1.5)
    assert default_classify_error(ValueError()) == ErrorInfo(None, None)
    odd = StatusError(503, retry_after_s=-1.0)
    assert default_classify_error(odd) == ErrorInfo(503, None)


# ------------------------------------------------------------------ load budget


def test_budget_caps_extra_load_over_100_calls() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(1.0), 2: Step(0.01)}))
        policy = HedgePolicy(delay_ms=10, max_attempts=2, max_extra_load=0.1)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        results = [await hedger.run(backend) for _ in range(100)]
        sent = sum(o.attempts[1].started_offset_ms is not None for o in results)
        refused = [o for o in results if o.attempts[1].outcome == "budget_exhausted"]
        assert sent <= 100 * 0.1 + 1  # ~10 copies plus the initial reserve
        assert sent >= 9
        assert len(refused) == 100 - sent
        assert all(o.fired for o in results)  # the copy was due every time
        assert all(o.winner == 1 and o.attempts[0].outcome == "primary" for o in refused)
        assert all(o.attempts[1].target == "b" for o in refused)
        stats = hedger.stats
        assert stats.calls == 100 and stats.fires == 100
        assert stats.budget_exhausted == len(refused) and stats.copies_sent == sent
        assert stats.extra_calls_per_call == pytest.approx(sent / 100)

    run_virtual(main)


def test_a_copy_the_budget_refused_waits_for_the_next_tick() -> None:
    """Refused at d, the copy is due again at 2d and goes once another call has deposited.

    Before: the refusal used up attempt 2 of ``max_attempts = 2`` and the slow primary
    was waited out (5 s). Refusals are recorded once and do not count as attempts.
    """

    async def main() -> None:
        loop = vloop()
        policy = HedgePolicy(delay_ms=100, max_attempts=2, max_extra_load=0.5)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        hedger.budget = HedgeBudget(0.5, reserve=0.0)  # empty: A's own deposit is 0.5
        slow = FakeBackend(by_number({1: Step(5.0), 2: Step(0.05), 3: Step(0.05)}))
        fast = FakeBackend(by_number({1: Step(0.01)}))

        async def later_call() -> HedgeOutcome[str]:
            await asyncio.sleep(0.15)  # after A's refusal at 0.1 s, before its tick at 0.2 s
            return await hedger.run(fast)

        a, b = await asyncio.gather(hedger.run(slow), later_call())
        assert b.winner == 1
        assert outcomes(a) == ["cancelled", "budget_exhausted", "duplicate"]
        assert a.winner == 3 and a.attempts[2].target == "b"
        assert a.attempts[1].started_offset_ms is None
        assert a.attempts[2].started_offset_ms == pytest.approx(200)
        assert loop.time() == pytest.approx(0.25)
        assert hedger.stats.budget_exhausted == 1 and hedger.stats.copies_sent == 1

    run_virtual(main)


def test_a_copy_waiting_for_the_budget_is_recorded_once() -> None:
    """No deposit comes: the copy is refused at every tick, one record, the primary wins."""

    async def main() -> None:
        policy = HedgePolicy(delay_ms=10, max_attempts=3, max_extra_load=0.1)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        hedger.budget = HedgeBudget(0.1, reserve=0.0)
        backend = FakeBackend(by_number({1: Step(1.0)}))
        outcome = await hedger.run(backend)  # 99 ticks while the primary runs
        assert outcomes(outcome) == ["primary", "budget_exhausted"]
        assert backend.events("start") == [1]

    run_virtual(main)


def test_copies_per_second_cap() -> None:
    async def main() -> None:
        loop = vloop()
        backend = FakeBackend(by_number({1: Step(0.1), 2: Step(0.01)}))
        policy = HedgePolicy(delay_ms=10, max_extra_load=5.0, max_copies_per_s=2)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"], clock=loop.time)
        results = [await hedger.run(backend) for _ in range(10)]  # 10 calls in 0.2 s
        assert [o.attempts[1].outcome for o in results] == ["duplicate"] * 2 + [
            "budget_exhausted"
        ] * 8
        await asyncio.sleep(1.5)
        outcome = await hedger.run(backend)
        assert outcome.attempts[1].outcome == "duplicate"

    run_virtual(main)


# ------------------------------------------------------------------ percentile delay


def test_percentile_delay_warm_up_and_window_expiry() -> None:
    async def main() -> None:
        loop = vloop()
        policy = HedgePolicy(
            delay_percentile=50.0, min_samples=5, window_s=3.0, refresh_s=0.0, max_extra_load=5
        )
        latencies = iter([0.1, 0.2, 0.3, 0.4, 0.5])
        warm = FakeBackend(lambda info: Step(next(latencies)))
        hedger: Hedger[str] = Hedger(policy, ["a", "b"], clock=loop.time)
        for _ in range(5):  # warm-up: no hedging at all
            outcome = await hedger.run(warm)
            assert outcome.delay_ms is None and len(outcome.attempts) == 1
        assert len(warm.log) == 5 * 3  # start, answer, finally; no copies
        assert hedger.current_delay_ms() == pytest.approx(300)  # p50 of 100..500 ms

        slow = FakeBackend(by_number({1: Step(2.0), 2: Step(0.1)}))
        outcome = await hedger.run(slow)
        assert outcome.delay_ms == pytest.approx(300)
        assert outcome.attempts[1].started_offset_ms == pytest.approx(300)
        assert outcome.won_by_copy

        await asyncio.sleep(10.0)  # every bucket expires: warm-up again
        assert len(hedger.window) == 0
        outcome = await hedger.run(FakeBackend(by_number({1: Step(0.05)})))
        assert outcome.delay_ms is None

    run_virtual(main)


def test_errors_never_enter_the_window() -> None:
    async def main() -> None:
        policy = HedgePolicy(delay_percentile=95.0, min_samples=1, breaker_failures=100)
        hedger: Hedger[str] = Hedger(policy, ["a"])
        failing = FakeBackend(lambda info: Step(0.001, error=lambda: StatusError(500)))
        for _ in range(10):
            await hedger.run(failing)
        assert len(hedger.window) == 0  # fast failures would drag the delay down
        await hedger.run(FakeBackend(lambda info: Step(0.25)))
        assert len(hedger.window) == 1
        assert hedger.window.percentile(95) == pytest.approx(250)

    run_virtual(main)


# ------------------------------------------------------------------ circuit breakers


def test_breaker_opens_sends_the_call_elsewhere_unhedged_and_closes_again() -> None:
    async def main() -> None:
        loop = vloop()
        policy = HedgePolicy(
            delay_ms=100, breaker_failures=2, breaker_window_s=30.0, breaker_cooldown_s=5.0
        )
        hedger: Hedger[str] = Hedger(policy, ["a", "b"], clock=loop.time)
        failing = FakeBackend(lambda info: Step(0.01, error=lambda: StatusError(500)))
        for _ in range(2):
            await hedger.run(failing)
        assert hedger.breakers.states() == {"a": "open"}

        # primary open: the call goes to the next closed target, without hedging
        backend = FakeBackend(by_number({1: Step(1.0)}))
        outcome = await hedger.run(backend)
        assert outcome.value == "answer-1" and outcome.delay_ms is None
        assert [(a.target, a.outcome) for a in outcome.attempts] == [("b", "not_fired")]
        assert backend.events("start") == [1]

        await asyncio.sleep(5.0)  # cool-down over: half-open, one probe to "a"
        assert hedger.breakers.get("a").state == "half_open"
        outcome = await hedger.run(FakeBackend(by_number({1: Step(0.01)})))
        assert outcome.attempts[0].target == "a" and outcome.delay_ms == 100
        assert hedger.breakers.get("a").state == "closed"

    run_virtual(main)


def test_failed_probe_reopens_the_breaker() -> None:
    async def main() -> None:
        loop = vloop()
        policy = HedgePolicy(delay_ms=100, breaker_failures=1, breaker_cooldown_s=5.0)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"], clock=loop.time)
        failing = FakeBackend(lambda info: Step(0.01, error=lambda: StatusError(500)))
        await hedger.run(failing)
        await asyncio.sleep(5.0)
        outcome = await hedger.run(failing)  # the probe
        assert outcome.attempts[0].target == "a"
        assert hedger.breakers.get("a").state == "open"

    run_virtual(main)


def test_all_targets_open_fails_fast_without_calling() -> None:
    async def main() -> None:
        policy = HedgePolicy(delay_ms=100, breaker_failures=1)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        for target in ("a", "b"):
            hedger.breakers.get(target).record_failure()
        backend = FakeBackend(lambda info: Step(0.01))
        outcome = await hedger.run(backend)
        assert isinstance(outcome.error, CircuitOpen)
        assert outcomes(outcome) == ["suppressed"] and backend.log == []

    run_virtual(main)


def test_copy_to_an_open_target_is_suppressed() -> None:
    async def main() -> None:
        policy = HedgePolicy(delay_ms=100, breaker_failures=1)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        hedger.breakers.get("b").record_failure()
        outcome = await hedger.run(FakeBackend(by_number({1: Step(0.5)})))
        assert outcomes(outcome) == ["primary", "suppressed"]
        assert isinstance(outcome.attempts[1].error, CircuitOpen)
        assert outcome.attempts[1].started_offset_ms is None
        assert hedger.budget.balance == pytest.approx(1.1)  # a suppressed copy costs nothing

    run_virtual(main)


def test_breakers_are_shared_and_cancelled_losers_count_as_neither() -> None:
    async def main() -> None:
        policy = HedgePolicy(delay_ms=100, breaker_failures=1, max_extra_load=5.0)
        step_one: Hedger[str] = Hedger(policy, ["a", "b"])
        step_two: Hedger[str] = Hedger(policy, ["a", "b"], breakers=step_one.breakers)
        # "a" is cancelled as a loser on every call: it must not open
        for _ in range(3):
            outcome = await step_one.run(FakeBackend(by_number({1: Step(5.0), 2: Step(0.1)})))
            assert outcome.attempts[0].outcome == "cancelled"
        assert step_one.breakers.states() == {"a": "closed", "b": "closed"}
        failing = FakeBackend(lambda info: Step(0.01, error=lambda: StatusError(500)))
        await step_one.run(failing)
        outcome = await step_two.run(FakeBackend(by_number({1: Step(0.01)})))
        assert outcome.attempts[0].target == "b"  # step two sees step one's failure

    run_virtual(main)


# ------------------------------------------------------------------ quality gate


def test_rejected_answer_does_not_win_and_the_next_copy_starts_at_once() -> None:
    async def main() -> None:
        steps = {1: Step(0.05, value="bad"), 2: Step(0.05, value="good")}
        backend = FakeBackend(by_number(steps))
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=1000), ["a", "b"])
        outcome = await hedger.run(
            backend, release=backend.release, accept=lambda value: value != "bad"
        )
        assert outcome.value == "good" and outcome.winner == 2
        assert outcomes(outcome) == ["rejected", "duplicate"]
        assert outcome.attempts[1].started_offset_ms == pytest.approx(50)
        assert backend.released == ["bad"]
        assert len(hedger.window) == 1  # only the accepted answer

    run_virtual(main)


def test_all_answers_rejected() -> None:
    async def main() -> None:
        backend = FakeBackend(lambda info: Step(0.05, value="bad"))
        policy = HedgePolicy(delay_ms=1000, max_attempts=2)
        outcome = await Hedger[str](policy, ["a", "b"]).run(
            backend, release=backend.release, accept=lambda value: False
        )
        assert isinstance(outcome.error, NoAcceptableAnswer) and outcome.error.rejected == 2
        assert backend.released == ["bad", "bad"]

    run_virtual(main)


# ------------------------------------------------------------------ shadows


def test_shadow_loser_finishes_and_time_saved_is_measured() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(3.0), 2: Step(0.5)}))
        policy = HedgePolicy(delay_ms=1000, shadow_fraction=1.0)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"], rng=random.Random(1))
        outcome = await hedger.run(backend, release=backend.release)
        assert outcome.value == "answer-2" and vloop().time() == pytest.approx(1.5)
        assert outcome.time_saved_ms is None  # not known yet: the primary still runs
        assert backend.events("cancelled") == []
        await outcome.shadows_done()
        primary = outcome.attempts[0]
        assert primary.outcome == "shadow_finished"
        assert primary.answered_offset_ms == pytest.approx(3000)
        assert outcome.time_saved_ms == pytest.approx(1500)
        assert backend.released == ["answer-1"]
        assert len(hedger.window) == 2  # winner and shadow loser
        assert hedger.stats.time_saved_per_win_ms == pytest.approx(1500)
        assert hedger.stats.win_rate == 1.0

    run_virtual(main)


def test_shadow_is_bounded_by_the_deadline() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(30.0), 2: Step(0.5)}))
        policy = HedgePolicy(delay_ms=1000, shadow_fraction=1.0, deadline_s=3.0)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        outcome = await hedger.run(backend)
        await outcome.shadows_done()
        assert vloop().time() == pytest.approx(3.0)
        assert outcome.attempts[0].outcome == "cancelled"
        assert isinstance(outcome.attempts[0].error, DeadlineExceeded)
        assert outcome.time_saved_ms is None

    run_virtual(main)


def test_aclose_cancels_running_shadows() -> None:
    async def main() -> None:
        backend = FakeBackend(by_number({1: Step(30.0), 2: Step(0.5)}))
        policy = HedgePolicy(delay_ms=1000, shadow_fraction=1.0)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        outcome = await hedger.run(backend, release=backend.release)
        await hedger.aclose()
        assert outcome.attempts[0].outcome == "cancelled"
        assert backend.events("cancelled") == [1] and 1 in backend.events("finally")
        await outcome.shadows_done()  # already done: returns at once

    run_virtual(main)


# ------------------------------------------------------------------ loop lag


def test_copy_fired_late_by_a_stalled_loop_is_suppressed() -> None:
    async def main() -> None:
        loop = vloop()
        policy = HedgePolicy(delay_ms=100, max_loop_lag_ms=50)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])

        async def stall() -> None:
            await asyncio.sleep(0.05)
            loop.block(0.2)  # CPU-bound work: the loop is busy for 200 ms

        staller = asyncio.create_task(stall())
        outcome = await hedger.run(FakeBackend(by_number({1: Step(0.4)})))
        await staller
        copy = outcome.attempts[1]
        assert copy.outcome == "suppressed" and copy.started_offset_ms is None
        assert copy.loop_lag_ms == pytest.approx(150)  # due at 100 ms, run at 250 ms
        assert copy.fired_during_loop_lag
        assert hedger.budget.balance == pytest.approx(1.1)  # reserve + deposit, none spent

    run_virtual(main)


def test_loop_lag_monitor_suppresses_copies_and_flags_attempts() -> None:
    async def main() -> None:
        loop = vloop()
        monitor = LoopLagMonitor(interval_s=0.05)
        async with monitor:
            await asyncio.sleep(0.06)
            loop.block(0.3)
            await asyncio.sleep(0.06)
            assert monitor.lag_ms == pytest.approx(260)
            suppress = HedgePolicy(delay_ms=100, max_loop_lag_ms=200)
            hedger: Hedger[str] = Hedger(suppress, ["a", "b"], loop_lag=monitor)
            backend = FakeBackend(by_number({1: Step(0.5)}))
            outcome = await hedger.run(backend)
            assert outcomes(outcome) == ["primary", "suppressed"]
            assert backend.infos[0].loop_lag_ms == pytest.approx(260)

            # no threshold set: copies go out, flagged when lag > d/2
            flag = HedgePolicy(delay_ms=100)
            hedger = Hedger(flag, ["a", "b"], loop_lag=monitor)
            outcome = await hedger.run(FakeBackend(by_number({1: Step(0.5), 2: Step(0.1)})))
            assert outcomes(outcome) == ["cancelled", "duplicate"]
            assert all(a.fired_during_loop_lag for a in outcome.attempts)

    run_virtual(main)


# ------------------------------------------------------------------ cancellation


def test_outside_cancellation_cancels_and_awaits_every_attempt() -> None:
    async def main() -> None:
        backend = FakeBackend(lambda info: Step(10.0))
        policy = HedgePolicy(delay_ms=100, max_attempts=3, max_extra_load=5.0, shadow_fraction=1)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        task = asyncio.create_task(hedger.run(backend))
        await asyncio.sleep(0.25)
        assert backend.events("start") == [1, 2, 3]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sorted(backend.events("cancelled")) == [1, 2, 3]
        assert sorted(backend.events("finally")) == [1, 2, 3]
        # run_virtual then checks that no task is left

    run_virtual(main)


def test_outside_cancellation_during_a_timeout() -> None:
    async def main() -> None:
        async def outer() -> HedgeOutcome[str]:
            async with asyncio.timeout(0.15):
                return await Hedger[str](HedgePolicy(delay_ms=100), ["a", "b"]).run(backend)

        backend = FakeBackend(lambda info: Step(10.0))
        with pytest.raises(TimeoutError):
            await outer()
        assert sorted(backend.events("finally")) == [1, 2]

    run_virtual(main)


# ------------------------------------------------------------------ on the real loop


async def test_real_loop_copy_wins_and_loser_is_closed() -> None:
    backend = FakeBackend(by_number({1: Step(0.5), 2: Step(0.01)}))
    hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=20), ["a", "b"])
    outcome = await hedger.run(backend, release=backend.release)
    assert outcome.value == "answer-2" and outcomes(outcome) == ["cancelled", "duplicate"]
    assert backend.events("cancelled") == [1] and 1 in backend.events("finally")
    copy = outcome.attempts[1]
    assert copy.started_offset_ms is not None
    assert copy.started_offset_ms >= 20  # not before its delay


async def test_real_loop_outside_cancellation_leaves_no_task() -> None:
    backend = FakeBackend(lambda info: Step(1.0))
    hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=10), ["a", "b"])
    task = asyncio.create_task(hedger.run(backend))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(backend.events("finally")) == [1, 2]
    current = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not current] == []


# ------------------------------------------------------------------ policy and stats


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="only one of"):
        HedgePolicy(delay_ms=10, delay_percentile=95)
    with pytest.raises(ValueError, match="max_attempts"):
        HedgePolicy(max_attempts=0)
    with pytest.raises(ValueError, match="shadow_fraction"):
        HedgePolicy(shadow_fraction=1.5)
    with pytest.raises(ValueError):
        Hedger(None, [])


def test_stats_rates() -> None:
    async def main() -> None:
        hedger: Hedger[str] = Hedger(HedgePolicy(delay_ms=100, max_extra_load=5), ["a", "b"])
        assert hedger.stats.fire_rate is None and hedger.stats.win_rate is None
        await hedger.run(FakeBackend(by_number({1: Step(0.05)})))  # no fire
        await hedger.run(FakeBackend(by_number({1: Step(1.0), 2: Step(0.1)})))  # copy wins
        await hedger.run(FakeBackend(by_number({1: Step(0.15), 2: Step(1.0)})))  # fire, loses
        stats = hedger.stats
        assert (stats.calls, stats.fires, stats.copy_wins, stats.copies_sent) == (3, 2, 1, 2)
        assert stats.fire_rate == pytest.approx(2 / 3)
        assert stats.win_rate == pytest.approx(0.5)
        assert stats.extra_calls_per_call == pytest.approx(2 / 3)
        assert stats.time_saved_per_win_ms is None

    run_virtual(main)


# ------------------------------------------------------------------ property


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[HedgePolicy, list[tuple[int, str]]]:
    """A policy and, per attempt, (latency in ms, kind) with kind in ok/bad/fail/busy."""
    max_attempts = draw(st.integers(1, 4))
    policy = HedgePolicy(
        delay_ms=draw(st.integers(0, 500)),
        max_attempts=max_attempts,
        deadline_s=draw(st.none() | st.integers(1, 3000).map(lambda ms: ms / 1000)),
        non_fatal=frozenset({429}),
        max_extra_load=10.0,
        shadow_fraction=draw(st.sampled_from([0.0, 0.5, 1.0])),
    )
    kinds = st.sampled_from(["ok", "ok", "bad", "fail", "busy"])
    steps = draw(st.lists(st.tuples(st.integers(0, 2000), kinds), min_size=4, max_size=4))
    return policy, steps


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), seed=st.integers(0, 2**16))
@example(  # found by hypothesis: a fatal error and another target's rejected answer at 1 ms
    scenario=(
        HedgePolicy(delay_ms=0, max_attempts=4, non_fatal=frozenset({429}), max_extra_load=10.0),
        [(0, "bad"), (1, "fail"), (1, "bad"), (2, "ok")],
    ),
    seed=0,
)
def test_winner_is_the_earliest_accepted_answer(
    scenario: tuple[HedgePolicy, list[tuple[int, str]]], seed: int
) -> None:
    policy, steps = scenario

    def script(info: AttemptInfo) -> Step:
        ms, kind = steps[info.number - 1]
        if kind == "fail":
            return Step(ms / 1000, error=lambda: StatusError(500))
        if kind == "busy":
            return Step(ms / 1000, error=lambda: StatusError(429))
        return Step(ms / 1000, value=kind)

    async def main() -> HedgeOutcome[str]:
        backend = FakeBackend(script)
        hedger: Hedger[str] = Hedger(policy, ["a", "b", "c"], rng=random.Random(seed))
        outcome = await hedger.run(
            backend, release=backend.release, accept=lambda value: value == "ok"
        )
        await outcome.shadows_done()
        started = backend.events("start")
        assert len(started) <= policy.max_attempts
        assert sorted(backend.events("finally")) == sorted(started)  # every attempt closed
        return outcome

    outcome = run_virtual(main)
    sent = [a for a in outcome.attempts if a.started_offset_ms is not None]
    assert [a.number for a in sent] == sorted(a.number for a in sent)

    # the call is decided by the earliest attempt that answered "ok", or by an attempt
    # that failed fatally while no attempt on another target was in flight
    def finish_ms(a: AttemptRecord) -> float:
        return (a.started_offset_ms or 0.0) + steps[a.number - 1][0]

    def in_flight_elsewhere(failed: AttemptRecord, at_ms: float) -> bool:
        return any(
            o.target != failed.target and (o.started_offset_ms or 0.0) <= at_ms < finish_ms(o)
            for o in sent
        )  # fmt: skip

    first = math.inf
    # at one instant the engine handles answers before errors (a tie in virtual time)
    for a in sorted(sent, key=lambda a: (finish_ms(a), steps[a.number - 1][1] in ("fail", "busy"),
                                         a.number)):  # fmt: skip
        kind = steps[a.number - 1][1]
        if kind == "ok" or (kind == "fail" and not in_flight_elsewhere(a, finish_ms(a))):
            first = finish_ms(a)
            break
    deadline_ms = math.inf if policy.deadline_s is None else policy.deadline_s * 1000
    if outcome.winner is not None:
        winner = outcome.attempts[outcome.winner - 1]
        assert steps[winner.number - 1][1] == "ok" and winner.answered_offset_ms is not None
        assert winner.answered_offset_ms == pytest.approx(first, abs=1e-6)
        assert winner.answered_offset_ms <= deadline_ms + 1e-6
        assert outcome.result() == "ok"
    elif isinstance(outcome.error, DeadlineExceeded):
        assert first >= deadline_ms - 1e-6
    elif isinstance(outcome.error, StatusError) and outcome.error.status == 500:
        failed = next(a for a in sent if a.error is outcome.error)
        # the deciding failure, or the last error after every other attempt ended unaccepted
        assert finish_ms(failed) == pytest.approx(first) or first == math.inf
    else:  # every attempt answered "bad", 429 or failed, and no attempt was left
        assert all(steps[a.number - 1][1] in ("bad", "busy", "fail") for a in sent)
        assert isinstance(outcome.error, (StatusError, NoAcceptableAnswer))


# ------------------------------------------------------------------ warm-up and many attempts


def test_warm_up_uses_the_initial_delay_then_the_percentile() -> None:
    """No unprotected warm-up: until min_samples answers, d = initial_delay_ms (default: a
    third of the deadline); after that, the window's percentile."""

    async def main() -> None:
        loop = vloop()
        policy = HedgePolicy(
            delay_percentile=50.0, min_samples=3, deadline_s=3.0, refresh_s=0.0,
            max_extra_load=5, max_attempts=3,
        )  # fmt: skip
        assert policy.warmup_delay_ms == pytest.approx(1000.0)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"], clock=loop.time)
        slow_first = FakeBackend(by_number({1: Step(20.0), 2: Step(0.2)}))
        outcome = await hedger.run(slow_first)
        assert outcome.delay_ms == pytest.approx(1000.0) and outcome.won_by_copy
        assert outcome.attempts[1].started_offset_ms == pytest.approx(1000.0)
        for latency in (0.1, 0.3):
            await hedger.run(FakeBackend(by_number({1: Step(latency)})))
        # three answers in the window (0.2 from the copy, 0.1, 0.3): the p50 takes over
        assert hedger.current_delay_ms() == pytest.approx(200.0)

        warm_policy = HedgePolicy(
            delay_percentile=95.0, initial_delay_ms=250.0, max_attempts=2, max_extra_load=5
        )
        explicit = Hedger(warm_policy, ["a"], clock=loop.time)
        assert explicit.current_delay_ms() == 250.0
        # no deadline and no initial delay: Finagle's behaviour, no copies while warming up
        assert Hedger(HedgePolicy(delay_percentile=95.0), ["a"]).current_delay_ms() is None

    run_virtual(main)


def test_copies_every_400_ms_fit_seven_useful_attempts_into_3_s() -> None:
    """A bimodal classifier: every attempt slow except the 7th; 8 attempts (more than gRFC
    A6's 5), all inside the deadline; the copy due at 2.8 s is the last one sent."""

    async def main() -> None:
        policy = HedgePolicy(delay_ms=400, max_attempts=8, deadline_s=3.0, max_extra_load=10)
        hedger: Hedger[str] = Hedger(policy, ["a", "b"])
        script = {n: Step(5.0) for n in range(1, 11)}
        script[7] = Step(0.25)  # starts at 2.4 s, answers at 2.65 s
        outcome = await hedger.run(FakeBackend(by_number(script)))
        assert outcome.winner == 7 and outcome.result() == "answer-7"
        starts = [a.started_offset_ms for a in outcome.attempts]
        assert starts == pytest.approx([0, 400, 800, 1200, 1600, 2000, 2400])

        slow = FakeBackend(by_number({n: Step(5.0) for n in range(1, 11)}))
        failed = await hedger.run(slow)
        assert isinstance(failed.error, DeadlineExceeded)
        sent = [a.started_offset_ms for a in failed.attempts if a.sent]
        assert len(sent) == 8 and max(sent) == pytest.approx(2800)
        with pytest.raises(ValueError, match="at most 8 attempts fit"):
            HedgePolicy(delay_ms=400, max_attempts=9, deadline_s=3.0)  # 3200 ms would be late
        assert HedgePolicy(delay_ms=100, max_attempts=10).max_attempts == 10

    run_virtual(main)
