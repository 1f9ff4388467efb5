"""Percentiles, order-statistic intervals, quantile differences, paired tests, Wilson."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from chainrun.statistics.intervals import (
    QuantileDiff,
    order_stat_indices,
    paired_compare,
    pass_rate,
    percentile,
    practical_latency_verdict,
    practical_verdict,
    quantile_ci,
    quantile_diff,
    sign_test_p,
    summarize,
    wilson_interval,
)

latencies = st.lists(
    st.floats(min_value=0.0, max_value=60_000.0, allow_nan=False), min_size=1, max_size=300
)


def _sample(n: int, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(5, 0.8) for _ in range(n)]


# -- percentile ---------------------------------------------------------------------------


def test_p90_of_12_values_is_the_second_slowest() -> None:
    values = [float(v) for v in range(100, 1300, 100)]  # 12 values
    random.Random(0).shuffle(values)
    assert percentile(values, 90) == 1100.0  # second slowest
    assert percentile(values, 99) == 1200.0
    assert percentile(values, 50) == 600.0


@pytest.mark.parametrize("n", [1, 2, 12, 37, 100])
@pytest.mark.parametrize("p", [1, 50, 90, 95, 99])
def test_percentile_is_numpys_inverted_cdf(n: int, p: float) -> None:
    xs = _sample(n, seed=n)
    assert percentile(xs, p) == pytest.approx(np.percentile(xs, p, method="inverted_cdf"))


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError, match="percent"):
        percentile([1.0], 0)
    with pytest.raises(ValueError, match="percent"):
        percentile([1.0], 100)


# -- quantile intervals ------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5, 12, 20, 35, 36, 50, 71, 72, 100, 367, 368, 500])
@pytest.mark.parametrize("p", [50, 90, 95, 99])
@pytest.mark.parametrize("confidence", [0.95, 0.9])
def test_quantile_ci_matches_scipy(n: int, p: float, confidence: float) -> None:
    xs = _sample(n, seed=n + p)
    ref = sps.quantile_test(xs, p=p / 100).confidence_interval(confidence)
    ours = quantile_ci(xs, p, confidence)
    if math.isnan(ref.low) or math.isnan(ref.high):
        assert ours is None
    else:
        assert ours == (pytest.approx(ref.low), pytest.approx(ref.high))


def test_quantile_ci_by_hand_for_12_values() -> None:
    values = [float(v) for v in range(1, 13)]
    # p90 from 12 values: P(all 12 below the true p90) = 0.9**12 = 0.28 > 0.025, so no
    # order statistic bounds it from above.
    assert quantile_ci(values, 90) is None
    assert quantile_ci(values, 99) is None
    # Median, n = 12: P(B <= 2) = 79/4096 = 0.0193 <= 0.025 < P(B <= 3) = 0.073, so the
    # interval is [x_(3), x_(10)] with coverage 1 - 2 * 79/4096 = 0.961.
    assert quantile_ci(values, 50) == (3.0, 10.0)
    lo, hi = order_stat_indices(12, 50)
    assert (lo, hi) == (2, 9)
    coverage = sum(math.comb(12, k) for k in range(lo + 1, hi + 1)) / 2**12
    assert coverage == pytest.approx(1 - 2 * 79 / 4096)
    assert coverage >= 0.95


def test_upper_bounds_appear_at_field_md_sizes() -> None:
    # order statistics: about n >= 72 for the p95's upper bound, n >= 368 for the p99.
    assert order_stat_indices(71, 95)[1] is None
    assert order_stat_indices(72, 95)[1] is not None
    assert order_stat_indices(367, 99)[1] is None
    assert order_stat_indices(368, 99)[1] is not None
    assert quantile_ci(_sample(400), 99) is not None


@given(latencies)
@settings(max_examples=60, deadline=None)
def test_estimate_lies_inside_its_interval(xs: list[float]) -> None:
    for p in (50, 90, 99):
        ci = quantile_ci(xs, p)
        if ci is not None:
            assert ci[0] <= percentile(xs, p) <= ci[1]


def test_summarize_reports_n_and_nulls() -> None:
    s = summarize(_sample(12))
    assert s["n"] == 12
    assert set(s) == {"n", "p50_ms", "p90_ms", "p99_ms", "p50_ci", "p90_ci", "p99_ci"}
    assert s["p50_ci"] is not None and s["p90_ci"] is None and s["p99_ci"] is None
    empty = summarize([])
    assert empty["n"] == 0 and empty["p50_ms"] is None and empty["p50_ci"] is None
    tokens = summarize([10, 20, 30], unit="tokens")
    assert tokens["p50_tokens"] == 20


# -- differences of quantiles ----------------------------------------------------------


def test_quantile_diff_detects_a_clear_shift() -> None:
    a = _sample(300, seed=1)
    b = [x + 200.0 for x in _sample(300, seed=2)]
    d = quantile_diff(a, b, 50)
    assert d.ci is not None and d.ci[0] > 0
    assert d.verdict == "worse"
    assert quantile_diff(b, a, 50).verdict == "better"


def test_quantile_diff_is_null_where_a_side_cannot_be_bounded() -> None:
    d = quantile_diff(_sample(12), _sample(400), 90)
    assert d.estimate is not None and d.ci is None and d.verdict == "inconclusive"
    assert quantile_diff([], [1.0], 50).estimate is None


def test_quantile_diff_of_independent_same_distribution_rarely_worse() -> None:
    worse = sum(
        quantile_diff(_sample(100, seed=2 * i), _sample(100, seed=2 * i + 1), 50).verdict == "worse"
        for i in range(40)
    )
    assert worse <= 2  # the conservative interval errs on the side of "inconclusive"


@given(latencies)
@settings(max_examples=80, deadline=None)
def test_a_against_itself_is_inconclusive(xs: list[float]) -> None:
    for p in (50, 90, 99):
        d = quantile_diff(xs, list(reversed(xs)), p)
        assert d.verdict == "inconclusive"
        assert d.estimate == 0
        if d.ci is not None:
            assert d.ci[0] <= 0 <= d.ci[1]


# -- paired pass/fail ---------------------------------------------------------------------


def test_paired_compare_known_answer() -> None:
    a = {f"c{i}": True for i in range(20)}
    b = {f"c{i}": i >= 10 for i in range(20)}  # B fails 10 cases A passed, passes none A failed
    r = paired_compare(a, b)
    assert (r.a_only, r.b_only, r.n_pairs) == (10, 0, 20)
    assert r.p_value == pytest.approx(2 / 2**10)
    assert r.verdict == "worse"
    assert paired_compare(b, a).verdict == "better"


def test_paired_compare_few_discordant_pairs_is_inconclusive() -> None:
    a = {"x": True, "y": True, "z": True, "w": False, "v": True}
    b = {"x": False, "y": False, "z": False, "w": True, "v": True, "only_b": True}
    r = paired_compare(a, b)
    assert (r.a_only, r.b_only) == (3, 1)
    assert r.verdict == "inconclusive"
    assert r.unpaired_b == 1 and r.n_pairs == 5
    d = r.as_dict()
    assert d["a"]["n"] == 5 and d["a"]["passed"] == 4 and d["verdict"] == "inconclusive"


@pytest.mark.parametrize(("k", "n"), [(0, 0), (0, 5), (1, 9), (3, 10), (5, 10), (2, 30), (12, 13)])
def test_sign_test_matches_scipy_binomtest(k: int, n: int) -> None:
    expected = 1.0 if n == 0 else sps.binomtest(k, n, 0.5).pvalue
    assert sign_test_p(k, n) == pytest.approx(expected)


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.booleans(), max_size=60))
@settings(max_examples=100, deadline=None)
def test_paired_a_against_itself_is_inconclusive(outcomes: dict[str, bool]) -> None:
    r = paired_compare(outcomes, dict(outcomes))
    assert r.verdict == "inconclusive" and r.p_value == 1.0
    assert r.a_only == r.b_only == 0


# -- Wilson --------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (47, 50), (1, 1)])
def test_wilson_matches_scipy(k: int, n: int) -> None:
    ref = sps.binomtest(k, n).proportion_ci(0.95, method="wilson")
    lo, hi = wilson_interval(k, n) or (math.nan, math.nan)
    assert lo == pytest.approx(ref.low, abs=1e-12)
    assert hi == pytest.approx(ref.high, abs=1e-12)


def test_wilson_edge_cases() -> None:
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    pr = pass_rate(0, 0)
    assert pr == {"n": 0, "passed": 0, "pass_rate": None, "pass_rate_ci": None}


# -- a practical tolerance (compare --min-effect) ------------------------------------------


def test_practical_verdict_cases() -> None:
    def v(est: float, lo: float, hi: float, tol: float) -> str:
        return practical_verdict(QuantileDiff(50, est, (lo, hi)), tol)

    assert v(20, 18, 22, 0) == "worse" and v(-20, -22, -18, 0) == "better"
    assert v(20, 18, 22, 50) == "same"  # real, but within ±50
    assert v(0, -30, 30, 50) == "same"  # shown to be within ±50, real or not
    assert v(0, -30, 30, 10) == "inconclusive"  # may be larger than 10 either way
    assert v(60, 55, 70, 50) == "worse" and v(-60, -70, -55, 50) == "better"
    assert v(8, 5, 14, 10) == "inconclusive"  # real, under 10, but may be more
    assert v(12, 1, 40, 10) == "worse"  # real, and the estimate is beyond 10
    assert practical_verdict(QuantileDiff(90, 5.0, None), 10) == "inconclusive"
    assert practical_verdict(QuantileDiff(90, None, None), 10) == "inconclusive"
    with pytest.raises(ValueError, match="tolerance"):
        v(0, -1, 1, -1)


@given(st.floats(-1000, 1000), st.floats(0, 500), st.floats(0, 500))
@settings(max_examples=200, deadline=None)
def test_practical_verdict_without_tolerance_keeps_worse_and_better(
    est: float, below: float, above: float
) -> None:
    d = QuantileDiff(50, est, (est - below, est + above))
    got = practical_verdict(d, 0.0)
    if d.verdict in ("worse", "better"):
        assert got == d.verdict
    else:
        assert got in ("same", "inconclusive")  # same only for a [0, 0] interval
        assert got == "inconclusive" or d.ci == (0.0, 0.0)


def test_practical_latency_verdict_needs_every_bounded_percentile_same() -> None:
    same = QuantileDiff(50, 1.0, (-2.0, 3.0))
    wide = QuantileDiff(90, 1.0, (-40.0, 45.0))
    unbounded = QuantileDiff(99, 1.0, None)
    worse = QuantileDiff(90, 30.0, (20.0, 40.0))
    assert practical_latency_verdict([same, unbounded], [10, 10]) == ("same", 0)
    assert practical_latency_verdict([same, wide, unbounded], [10, 10, 10]) == (
        "inconclusive", None)  # fmt: skip
    assert practical_latency_verdict([same, worse], [10, 10]) == ("worse", 1)
    assert practical_latency_verdict([unbounded], [10]) == ("inconclusive", None)


def test_exact_order_statistic_indices_agree_with_scipy() -> None:
    """The exact binomial sums give SciPy's ``ppf``/``isf`` indices (quantile_test's
    construction) at every n up to 150 and a few larger ones, for the percentiles and
    levels chainrun reports."""
    from scipy.stats import binom

    from chainrun.statistics.intervals import order_stat_indices

    for n in [*range(1, 151), 367, 368, 999, 1000]:
        for p in (50, 90, 95, 99):
            for conf in (0.9, 0.95):
                d, a = binom(n, p / 100), (1 - conf) / 2
                lo, hi = int(d.ppf(a)) - 1, int(d.isf(a))
                expected = (lo if lo >= 0 else None, hi if hi < n else None)
                assert order_stat_indices(n, p, conf) == expected, (n, p, conf)
