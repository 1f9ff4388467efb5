"""Exact nearest-rank percentiles: one rank rule everywhere a percentile is taken.

On floats ``ceil(n * p / 100)`` gives rank 8 for the p7 of 100 values
(0.07 * 100 = 7.000000000000001); numpy's ``inverted_cdf`` does the same.
"""

from __future__ import annotations

import ast
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chainrun.statistics.ranks
from chainrun.hedging.window import LatencyWindow
from chainrun.statistics.intervals import percentile, summarize
from chainrun.statistics.ranks import nearest_rank, percent_fraction


def _reference_rank(n: int, units: int, decimals: int) -> int:
    """The least k >= 1 with k / n >= p / 100, where p = units / 10**decimals; found by
    walking k up in integers (independent of the ceiling-division formula)."""
    scale = 100 * 10**decimals
    k = 1
    while k * scale < n * units:
        k += 1
    return k


# percentiles written with up to 3 decimals, as a config or a CLI flag would carry them
percents = st.integers(min_value=0, max_value=3).flatmap(
    lambda d: st.tuples(st.integers(min_value=1, max_value=100 * 10**d), st.just(d))
)


@settings(max_examples=3000, deadline=None)
@given(n=st.integers(min_value=1, max_value=5000), pd=percents)
def test_nearest_rank_is_exact_for_many_n_and_p(n: int, pd: tuple[int, int]) -> None:
    units, decimals = pd
    expected = _reference_rank(n, units, decimals)
    as_float = units / 10**decimals
    assert nearest_rank(n, as_float) == expected
    assert nearest_rank(n, Decimal(units).scaleb(-decimals)) == expected
    assert nearest_rank(n, Fraction(units, 10**decimals)) == expected
    assert nearest_rank(n, str(Decimal(units).scaleb(-decimals))) == expected


def test_every_integer_percentile_of_every_n_up_to_400() -> None:
    bad = [
        (n, p)
        for n in range(1, 401)
        for p in range(1, 101)
        if nearest_rank(n, p) != _reference_rank(n, p, 0)
        or nearest_rank(n, float(p)) != _reference_rank(n, p, 0)
    ]
    assert not bad, bad[:10]


def test_the_reported_case() -> None:
    assert nearest_rank(100, 7) == 7
    assert nearest_rank(100, 7.0) == 7
    assert nearest_rank(1000, 99.9) == 999
    assert nearest_rank(12, 90) == 11  # the p90 of 12 values is the second slowest


@pytest.mark.parametrize("p", [0, -1, 100.5, float("nan"), float("inf"), "abc", "1/0", "0"])
def test_out_of_range_percentiles_are_refused(p: float) -> None:
    with pytest.raises(ValueError, match="percent"):
        percent_fraction(p)


def test_n_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        nearest_rank(0, 50)


@settings(max_examples=500, deadline=None)
@given(n=st.integers(min_value=1, max_value=2000), pd=percents)
def test_stats_percentile_uses_the_exact_rank(n: int, pd: tuple[int, int]) -> None:
    units, decimals = pd
    p = units / 10**decimals
    if not 0 < p < 100:
        return  # stats.percentile takes (0, 100)
    values = [float(i) for i in range(1, n + 1)]
    assert percentile(values, p) == _reference_rank(n, units, decimals)


def test_summaries_use_the_exact_rank() -> None:
    # 0.07 * 100 is no integer in floats; the summaries' p50/p90/p99 keep the rank rule
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 7) == 7.0
    s = summarize(values)
    assert (s["p50_ms"], s["p90_ms"], s["p99_ms"]) == (50.0, 90.0, 99.0)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(min_value=1, max_value=400), pd=percents)
def test_hedge_window_percentile_uses_the_exact_rank(n: int, pd: tuple[int, int]) -> None:
    units, decimals = pd
    p = units / 10**decimals
    window = LatencyWindow(min_samples=1, floor_ms=0.0, refresh_s=0.0, clock=lambda: 0.0)
    for i in range(n, 0, -1):  # recorded in reverse: the window must sort
        window.record(float(i))
    assert window.percentile(p) == _reference_rank(n, units, decimals)


def test_the_rank_module_imports_only_the_stdlib() -> None:
    """The hedging engine imports it, and may import nothing of chainrun's LLM side."""
    tree = ast.parse(Path(chainrun.statistics.ranks.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
