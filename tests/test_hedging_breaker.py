"""CircuitBreaker and BreakerRegistry: closed → open → half-open → closed, on a fake clock."""

from __future__ import annotations

from chainrun.hedging import BreakerRegistry, CircuitBreaker


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_opens_after_failures_within_the_window() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=3, window_s=10.0, cooldown_s=5.0, clock=clock)
    for _ in range(2):
        breaker.record_failure()
    assert breaker.state == "closed" and breaker.allow()
    breaker.record_failure()
    assert breaker.state == "open"
    assert not breaker.available and not breaker.allow()


def test_old_failures_leave_the_window() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=2, window_s=10.0, cooldown_s=5.0, clock=clock)
    breaker.record_failure()
    clock.now += 11
    breaker.record_failure()
    assert breaker.state == "closed"


def test_success_resets_the_count() -> None:
    breaker = CircuitBreaker(failures=2, clock=FakeClock())
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state == "closed"


def test_half_open_allows_one_probe_and_success_closes() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=1, window_s=10.0, cooldown_s=5.0, clock=clock)
    breaker.record_failure()
    clock.now += 4.9
    assert breaker.state == "open"
    clock.now += 0.1
    assert breaker.state == "half_open"
    assert breaker.available  # looking takes nothing
    assert breaker.allow()  # the probe
    assert not breaker.available and not breaker.allow()  # only one
    breaker.record_success()
    assert breaker.state == "closed" and breaker.allow() and breaker.allow()


def test_failed_probe_reopens_for_another_cooldown() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=1, window_s=10.0, cooldown_s=5.0, clock=clock)
    breaker.record_failure()
    clock.now += 5
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state == "open"
    clock.now += 4.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow()


def test_cancelled_probe_frees_the_slot() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=1, cooldown_s=5.0, clock=clock)
    breaker.record_failure()
    clock.now += 5
    assert breaker.allow()
    breaker.record_cancelled()  # neither success nor failure
    assert breaker.state == "half_open"
    assert breaker.allow()


def test_cancelled_attempt_does_not_count_as_failure() -> None:
    breaker = CircuitBreaker(failures=1, clock=FakeClock())
    breaker.record_cancelled()
    assert breaker.state == "closed"


def test_registry_shares_breakers_by_target() -> None:
    clock = FakeClock()
    registry = BreakerRegistry(failures=1, cooldown_s=5.0, clock=clock)
    assert registry.get("a") is registry.get("a")
    registry.get("a").record_failure()
    assert registry.states() == {"a": "open"}
    assert registry.get("b").state == "closed"
    assert registry.states() == {"a": "open", "b": "closed"}
