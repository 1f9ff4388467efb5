"""LatencyWindow: warm-up, nearest-rank percentiles, bucket expiry, refresh cache, floor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chainrun.hedging import LatencyWindow
from chainrun.hedging.window import km_quantile
from chainrun.statistics.ranks import nearest_rank


class FakeClock:
    """Monotonic seconds that only move when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_warm_up_returns_none_until_min_samples() -> None:
    clock = FakeClock()
    window = LatencyWindow(30.0, min_samples=5, refresh_s=0, clock=clock)
    for ms in (10, 20, 30, 40):
        window.record(ms)
        assert window.percentile(95) is None
    window.record(50)
    assert window.percentile(95) == 50


def test_nearest_rank_percentile() -> None:
    window = LatencyWindow(30.0, min_samples=1, refresh_s=0, clock=FakeClock())
    for ms in range(1, 21):  # 1..20 ms
        window.record(float(ms))
    # nearest rank: ceil(p/100 * n)-th smallest; with 20 samples the p95 is the second-slowest
    assert window.percentile(95) == 19
    assert window.percentile(50) == 10
    assert window.percentile(100) == 20
    assert window.percentile(1) == 1


def test_floor_applies() -> None:
    window = LatencyWindow(30.0, min_samples=1, refresh_s=0, floor_ms=5.0, clock=FakeClock())
    window.record(0.2)
    assert window.percentile(50) == 5.0


def test_buckets_expire_with_the_clock() -> None:
    clock = FakeClock(0.0)
    window = LatencyWindow(30.0, buckets=3, min_samples=1, refresh_s=0, clock=clock)
    window.record(100.0)  # bucket [0, 10)
    clock.now = 15.0
    window.record(200.0)  # bucket [10, 20)
    assert len(window) == 2
    clock.now = 29.9  # still inside three buckets of the first sample
    assert len(window) == 2
    clock.now = 30.0  # the first bucket is three buckets old: dropped as a whole
    assert len(window) == 1
    assert window.percentile(50) == 200.0
    clock.now = 40.0
    assert len(window) == 0
    assert window.percentile(50) is None


def test_percentile_is_cached_for_refresh_s() -> None:
    clock = FakeClock(0.0)
    window = LatencyWindow(30.0, min_samples=1, refresh_s=3.0, clock=clock)
    window.record(10.0)
    assert window.percentile(95) == 10.0
    window.record(500.0)
    clock.now = 2.9
    assert window.percentile(95) == 10.0  # cached
    clock.now = 3.0
    assert window.percentile(95) == 500.0  # recomputed


def test_warm_up_is_checked_on_every_call_not_cached() -> None:
    clock = FakeClock(0.0)
    window = LatencyWindow(3.0, buckets=3, min_samples=2, refresh_s=100.0, clock=clock)
    window.record(10.0)
    window.record(20.0)
    assert window.percentile(50) == 10.0
    clock.now = 10.0  # everything expired, though the cached value is still "fresh"
    assert window.percentile(50) is None


def test_negative_latency_is_clamped() -> None:
    window = LatencyWindow(30.0, min_samples=1, refresh_s=0, floor_ms=0.0, clock=FakeClock())
    window.record(-3.0)
    assert window.percentile(50) == 0.0


@pytest.mark.parametrize("p", [0.0, -1.0, 100.5])
def test_bad_percentile_is_refused(p: float) -> None:
    with pytest.raises(ValueError):
        LatencyWindow().percentile(p)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        LatencyWindow(0.0)
    with pytest.raises(ValueError):
        LatencyWindow(30.0, buckets=0)


# ------------------------------------------------------------------ censored attempts


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=60),
    st.sampled_from([1, 5, 7, 10, 33.3, 50, 90, 95, 99, 99.9, 100]),
)
def test_kaplan_meier_without_censoring_is_the_nearest_rank(values: list[int], p: float) -> None:
    """The Kaplan-Meier path (taken as soon as one attempt is censored; one censored at
    -1 ms changes no survival) gives the nearest rank exactly, ties and p7 included."""
    answers = [(float(v), True) for v in values]
    rank = sorted(values)[nearest_rank(len(values), p) - 1]
    plain, km = km_quantile(answers, p), km_quantile([*answers, (-1.0, False)], p)
    assert plain is not None and km is not None
    assert plain.value_ms == km.value_ms == rank


def test_p7_of_100_is_the_seventh_value() -> None:
    # in floats ceil(0.07 * 100) is 8
    assert km_quantile([(float(v), True) for v in range(1, 101)], 7).value_ms == 7.0  # type: ignore[union-attr]


def test_a_cancelled_attempt_counts_as_longer_than_it_ran() -> None:
    """Half the calls answer in 100 ms; the other half were cancelled at 150 ms. Winners
    alone say the p75 is 100 ms; the window knows a quarter of calls take over 150 ms."""
    window = LatencyWindow(30.0, min_samples=1, refresh_s=0, clock=FakeClock())
    for _ in range(50):
        window.record(100.0)
        window.record_censored(150.0)
    est = window.estimate(75)
    assert est is not None and est.n == 100 and est.n_censored == 50
    assert est.value_ms == 150.0 and est.at_tail  # the censored mass, put at 150 ms
    assert window.percentile(40) == 100.0


def test_the_interval_brackets_the_percentile() -> None:
    window = LatencyWindow(30.0, min_samples=1, refresh_s=0, clock=FakeClock())
    for ms in range(1, 1001):
        window.record(float(ms))
        if ms % 4 == 0:
            window.record_censored(float(ms))
    est = window.estimate(95)
    assert est is not None
    lo, hi = est.ci95
    assert lo is not None and hi is not None and lo <= est.value_ms <= hi
    assert hi - lo < 60  # about +-1.4% of 1,000 values around the p95
