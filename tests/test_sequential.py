"""Confidence sequences (chainrun.statistics.sequential): the formula by hand on a small
case, the running intersection, and the A/A guarantee on simulated sequences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from chainrun.statistics.sequential import (
    eb_bounds,
    faster_share_cs,
    mean_cs,
    paired_difference_cs,
    two_sample_difference_cs,
)


def _by_hand(x: list[float], alpha: float) -> tuple[float, float, float]:
    """Waudby-Smith and Ramdas (2024), Theorem 2 with eq. 13's lambda, written out."""
    log_term = math.log(2 / alpha)
    mu_prev, s2_prev = 0.5, 0.25
    sum_x = sum_sq = sum_lam = sum_lx = sum_vpsi = 0.0
    lo_run, hi_run = 0.0, 1.0
    for t, xi in enumerate(x, start=1):
        lam = min(math.sqrt(2 * log_term / (s2_prev * t * math.log(1 + t))), 0.5)
        v = 4 * (xi - mu_prev) ** 2
        psi = (-math.log(1 - lam) - lam) / 4
        sum_lam += lam
        sum_lx += lam * xi
        sum_vpsi += v * psi
        centre = sum_lx / sum_lam
        width = (log_term + sum_vpsi) / sum_lam
        lo_run = max(lo_run, min(max(centre - width, 0), 1))
        hi_run = min(hi_run, min(max(centre + width, 0), 1))
        sum_x += xi
        mu = (0.5 + sum_x) / (t + 1)
        sum_sq += (xi - mu) ** 2
        mu_prev, s2_prev = mu, (0.25 + sum_sq) / (t + 1)
    return centre, lo_run, hi_run


def test_the_bounds_follow_the_published_formula() -> None:
    x = [1, 0, 1, 1, 0.5, 1, 0, 1, 1, 1] * 6
    centre, lo, hi = eb_bounds(np.array(x, dtype=float), alpha=0.05)
    assert (centre[-1], lo[-1], hi[-1]) == pytest.approx(_by_hand(x, 0.05), abs=1e-12)


def test_the_interval_only_narrows_and_holds_its_estimate() -> None:
    rng = np.random.default_rng(7)
    x = rng.random(400)
    _centre, lo, hi = eb_bounds(x)
    assert np.all(np.diff(lo) >= 0) and np.all(np.diff(hi) <= 0)
    assert lo[-1] < 0.5 < hi[-1] and hi[-1] - lo[-1] < 0.25


def test_an_aa_sequence_rarely_decides_and_an_ab_one_does() -> None:
    rng = np.random.default_rng(11)
    a = rng.random((300, 300)) < 0.7
    b = rng.random((300, 300)) < 0.7
    _, lo, hi = eb_bounds((b.astype(float) - a + 1) / 2)
    assert ((lo > 0.5) | (hi < 0.5)).any(axis=1).mean() <= 0.05
    a1 = [bool(v) for v in rng.permutation([True] * 40 + [False] * 160)]
    b1 = [True] * 200  # B passes every case A fails
    cs = paired_difference_cs(a1, b1)
    assert cs.verdict == "decided_higher" and cs.decided_at is not None
    assert cs.lower > 0 and cs.upper <= 1 and cs.estimate == pytest.approx(0.8, abs=0.05)


def test_the_three_comparisons_name_their_null_and_scale() -> None:
    same = faster_share_cs([100.0] * 50, [100.0] * 50)  # ties count 1/2
    assert same.null == 0.5 and same.verdict == "not_yet" and same.lower < 0.5 < same.upper
    faster = faster_share_cs([900.0] * 120, [400.0] * 120)
    assert faster.verdict == "decided_higher"
    rng = np.random.default_rng(3)
    b = [bool(v) for v in rng.permutation([True] * 60 + [False] * 140)]
    unpaired = two_sample_difference_cs([False] * 200, b)
    assert unpaired.verdict == "decided_higher" and -1 <= unpaired.lower < unpaired.upper <= 1
    assert mean_cs([]).verdict == "not_yet" and mean_cs([]).n == 0


def test_values_outside_the_unit_interval_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        eb_bounds(np.array([0.2, 1.5]))
    with pytest.raises(ValueError, match="paired"):
        paired_difference_cs([True], [True, False])


def test_a_rate_that_changed_during_the_window_gets_no_verdict() -> None:
    """All ones, then all zeros: no single mean fits; the running intersection empties."""
    drifted = mean_cs([1.0] * 150 + [0.0] * 150)
    assert drifted.drifted and drifted.verdict == "not_yet" and drifted.decided_at is None
