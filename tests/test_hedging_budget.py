"""HedgeBudget and CopyThrottler: the extra-load token bucket and the copies-per-second cap."""

from __future__ import annotations

import pytest

from chainrun.hedging import CopyThrottler, HedgeBudget


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_reserve_lets_the_first_call_hedge() -> None:
    budget = HedgeBudget(0.1)
    budget.deposit()
    assert budget.try_withdraw()
    assert not budget.try_withdraw()


def test_ten_deposits_of_a_tenth_pay_for_one_copy() -> None:
    budget = HedgeBudget(0.1, reserve=0.0)
    for _ in range(9):
        budget.deposit()
        assert not budget.try_withdraw()
    budget.deposit()  # 10 x 0.1 must count as a whole token despite float rounding
    assert budget.try_withdraw()
    assert budget.balance == pytest.approx(0.0)


def test_extra_load_over_many_calls() -> None:
    budget = HedgeBudget(0.1, reserve=1.0)
    copies = 0
    for _ in range(1000):
        budget.deposit()
        copies += budget.try_withdraw()
    assert copies <= 0.1 * 1000 + 1
    assert copies >= 0.1 * 1000 - 1


def test_balance_is_capped() -> None:
    budget = HedgeBudget(0.5, reserve=1.0, capacity=1.0)
    for _ in range(100):
        budget.deposit()
    assert budget.balance == 1.0
    assert budget.try_withdraw()
    assert not budget.try_withdraw()


def test_default_capacity_holds_the_deposits_of_100_calls() -> None:
    budget = HedgeBudget(0.1, reserve=1.0)
    assert budget.capacity == pytest.approx(10.0)
    for _ in range(1000):
        budget.deposit()
    assert budget.balance == pytest.approx(10.0)


def test_calls_in_flight_together_can_each_spend_their_deposit() -> None:
    # 20 calls start together, each deposits 1.0, then each wants one copy
    budget = HedgeBudget(1.0, reserve=0.0)
    for _ in range(20):
        budget.deposit()
    assert all(budget.try_withdraw() for _ in range(20))
    assert not budget.try_withdraw()


def test_capacity_follows_a_load_above_one() -> None:
    budget = HedgeBudget(2.0, reserve=0.0)  # two copies per call allowed
    budget.deposit()
    assert budget.try_withdraw() and budget.try_withdraw()
    assert not budget.try_withdraw()


def test_copies_per_second_cap() -> None:
    clock = FakeClock()
    budget = HedgeBudget(10.0, reserve=10.0, capacity=100.0, max_copies_per_s=2, clock=clock)
    assert budget.try_withdraw() and budget.try_withdraw()
    assert not budget.try_withdraw()  # third in the same second
    assert budget.balance == 8.0  # a throttled copy costs no token
    clock.now += 1.01
    assert budget.try_withdraw()


def test_fractional_rate_becomes_a_longer_period() -> None:
    throttler = CopyThrottler.per_second(0.5)
    assert (throttler.rate_limit, throttler.period) == (1, 2.0)
    throttler = CopyThrottler.per_second(2.5)
    assert throttler.rate_limit == 2
    assert throttler.period == pytest.approx(0.8)


def test_the_copy_cap_never_waits_and_frees_its_slots_with_time() -> None:
    clock = FakeClock()
    throttler = CopyThrottler(1, 1.0, clock=clock)
    assert throttler.try_acquire()
    assert not throttler.try_acquire()
    assert throttler.in_period == 1
    clock.now += 1.5
    assert throttler.in_period == 0
    assert throttler.try_acquire()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        HedgeBudget(0.0)
    with pytest.raises(ValueError):
        HedgeBudget(0.1, capacity=0.5)
    with pytest.raises(ValueError):
        CopyThrottler.per_second(0.0)
