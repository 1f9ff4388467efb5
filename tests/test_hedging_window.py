"""LatencyWindow: warm-up, nearest-rank percentiles, bucket expiry, refresh cache, floor."""

from __future__ import annotations

import pytest

from chainrun.hedging import LatencyWindow


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
