"""Confidence sequences: intervals that stay valid however often you look.

A fixed-n 95% interval is valid once, at the n it was computed for. A shop watching an
A/B comparison looks after every batch of turns; checked after every turn, a fixed-n
interval excludes a true difference of 0 far more often than 5% of the time (see
``benchmarks/sequential_aa.py`` for the rate). A **confidence sequence** (CS) is a
sequence of intervals ``C_1, C_2, ...`` that contain the true value at *every* time at
once with probability at least ``1 - alpha`` (Howard, Ramdas, McAuliffe and Sekhon,
"Time-uniform, nonparametric, nonasymptotic confidence sequences", Annals of Statistics
49(2), 2021), so a decision may be taken the first time it excludes 0, at any look.

The CS here is the **predictable plug-in empirical-Bernstein CS** for the mean of
observations bounded in [0, 1] (Waudby-Smith and Ramdas, "Estimating means of bounded
random variables by betting", JRSS-B 86(1), 2024, Theorem 2 with the predictable
``lambda`` of their eq. 13, truncation ``c = 1/2``), intersected over time (the running
intersection of a CS is a CS). With ``X_i`` in [0, 1]::

    mu_t      = (1/2 + sum_{i<=t} X_i) / (t + 1)                     (mu_0 = 1/2)
    sigma2_t  = (1/4 + sum_{i<=t} (X_i - mu_i)^2) / (t + 1)          (sigma2_0 = 1/4)
    lambda_t  = min(sqrt(2 log(2/alpha) / (sigma2_{t-1} t log(1 + t))), 1/2)
    v_t       = 4 (X_t - mu_{t-1})^2
    psi(l)    = (-log(1 - l) - l) / 4
    C_t       = sum(lambda_i X_i) / sum(lambda_i)
                +- (log(2/alpha) + sum(v_i psi(lambda_i))) / sum(lambda_i)

It assumes only that the observations are bounded and that each one's conditional mean
given the past is the same ``mu`` (independent pairs of an A/B comparison are; no
normality, no known variance).

What chainrun compares with it, each as the mean of a bounded quantity:

- a **paired pass-rate difference** (the same eval cases in two runs): per case
  ``d = pass_B - pass_A`` in {-1, 0, 1}, observed as ``X = (d + 1) / 2``; the CS of
  ``E[d]`` is the CS of ``E[X]`` mapped back (:func:`paired_difference_cs`);
- an **unpaired rate difference** (the ungrounded share of live traffic against a
  replay's): a CS for each side at ``alpha / 2`` (a union bound), the difference's CS
  from their ends (:func:`two_sample_difference_cs`);
- **answer TTFT, paired by request**: the share of requests that B answers first,
  ``X = 1[ttft_B < ttft_A] + 1/2 1[tie]`` (the sign of the paired difference: the
  median of the paired differences is below 0 exactly when this share is above 1/2, so
  it decides which side is faster at the median without assuming a distribution; a mean
  of TTFT would be dominated by its heavy tail, and a bounded transform is what the CS
  above needs) (:func:`faster_share_cs`).

All functions are pure (NumPy only) and O(n).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: the truncation of the betting fraction (Waudby-Smith and Ramdas 2024 use 1/2 or 3/4)
LAMBDA_MAX = 0.5

SequenceVerdict = Literal["decided_higher", "decided_lower", "not_yet"]


@dataclass(frozen=True)
class ConfidenceSequence:
    """A confidence sequence's state after ``n`` observations.

    Attributes:
        n: observations so far.
        estimate: the weighted mean the CS is centred on (None before any observation).
        lower, upper: the running-intersection interval at ``n`` (valid at every n at once).
        alpha: the error rate over all looks (0.05: 95% time-uniform coverage).
        method: the CS's name, for reports (``"betting-eb"``).
        decided_at: the first n at which the interval excluded ``null`` (None: never yet).
        verdict: ``decided_higher`` (the interval lies above ``null``), ``decided_lower``,
            or ``not_yet``.
        drifted: the running intersection came out empty (``lower > upper``): the
            observations do not fit one mean over time (traffic that changed during the
            window, an order that is not random), so no verdict is given. Under the
            CS's assumption this happens with probability at most ``alpha``.
    """

    n: int
    estimate: float | None
    lower: float
    upper: float
    alpha: float
    method: str
    null: float
    decided_at: int | None
    verdict: SequenceVerdict
    drifted: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"n": self.n, "estimate": self.estimate, "lower": self.lower,
                "upper": self.upper, "alpha": self.alpha, "method": self.method,
                "null": self.null, "decided_at": self.decided_at,
                "verdict": self.verdict, "drifted": self.drifted}  # fmt: skip


def eb_bounds(x: np.ndarray, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The empirical-Bernstein CS of the mean of ``x`` after every observation.

    Args:
        x: observations in [0, 1], shape ``(n,)`` or ``(k, n)`` (k sequences at once, for
            simulation); in the order they arrived.
        alpha: the error rate over all times (two-sided).

    Returns:
        ``(estimate, lower, upper)``, each of ``x``'s shape: after observation ``t`` the
        centre and the running-intersection interval, clipped to [0, 1].

    Raises:
        ValueError: a value outside [0, 1], or ``alpha`` outside (0, 1).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a value in (0, 1), got {alpha}")
    x = np.asarray(x, dtype=float)
    if x.size and (np.nanmin(x) < 0 or np.nanmax(x) > 1 or np.isnan(x).any()):
        raise ValueError("observations must lie in [0, 1]")
    n = x.shape[-1]
    t = np.arange(1, n + 1, dtype=float)
    mu = (0.5 + np.cumsum(x, axis=-1)) / (t + 1)  # mu_t, t = 1..n
    mu_prev = np.concatenate([np.full((*x.shape[:-1], 1), 0.5), mu[..., :-1]], axis=-1)
    sq = (x - mu) ** 2
    sigma2 = (0.25 + np.cumsum(sq, axis=-1)) / (t + 1)
    sigma2_prev = np.concatenate([np.full((*x.shape[:-1], 1), 0.25), sigma2[..., :-1]],
                                 axis=-1)  # fmt: skip
    log_term = math.log(2 / alpha)
    lam = np.minimum(np.sqrt(2 * log_term / (sigma2_prev * t * np.log1p(t))), LAMBDA_MAX)
    v = 4 * (x - mu_prev) ** 2
    psi = (-np.log1p(-lam) - lam) / 4
    sum_lam = np.cumsum(lam, axis=-1)
    centre = np.cumsum(lam * x, axis=-1) / sum_lam
    width = (log_term + np.cumsum(v * psi, axis=-1)) / sum_lam
    lower = np.maximum.accumulate(np.clip(centre - width, 0, 1), axis=-1)
    upper = np.minimum.accumulate(np.clip(centre + width, 0, 1), axis=-1)
    return centre, lower, upper


def _decided(lower: np.ndarray, upper: np.ndarray, null: float) -> int | None:
    out = np.flatnonzero((lower > null) | (upper < null))
    return int(out[0]) + 1 if out.size else None


def mean_cs(x: Sequence[float], *, alpha: float = 0.05, null: float = 0.5,
            scale: tuple[float, float] = (0.0, 1.0)) -> ConfidenceSequence:  # fmt: skip
    """The CS of the mean of ``x`` (values in [0, 1]) after its last observation, mapped
    to ``scale`` (``lo + (hi - lo) * m``) with ``null`` given on that scale.

    Raises:
        ValueError: as :func:`eb_bounds`.
    """
    lo_s, hi_s = scale
    span = hi_s - lo_s
    arr = np.asarray(x, dtype=float)
    if arr.size == 0:
        return ConfidenceSequence(0, None, lo_s, hi_s, alpha, "betting-eb", null, None,
                                  "not_yet")  # fmt: skip
    centre, lower, upper = eb_bounds(arr, alpha)
    null01 = (null - lo_s) / span
    decided = _decided(lower, upper, null01)
    est, lo, hi = (lo_s + span * float(v[-1]) for v in (centre, lower, upper))
    drifted = lo > hi
    verdict = _verdict(lo, hi, null, drifted)
    return ConfidenceSequence(len(arr), est, lo, hi, alpha, "betting-eb", null,
                              None if drifted else decided, verdict, drifted)  # fmt: skip


def _verdict(lo: float, hi: float, null: float, drifted: bool) -> SequenceVerdict:
    if drifted:
        return "not_yet"
    if lo > null:
        return "decided_higher"
    return "decided_lower" if hi < null else "not_yet"


def paired_difference_cs(a: Sequence[bool], b: Sequence[bool], *,
                         alpha: float = 0.05) -> ConfidenceSequence:  # fmt: skip
    """The CS of ``E[b - a]`` for paired binary outcomes (pass/fail per case, in the order
    the pairs were observed): in [-1, 1], null 0; ``decided_higher`` means B passes more.

    Raises:
        ValueError: ``a`` and ``b`` of different lengths.
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes: {len(a)} against {len(b)}")
    x = [(int(bool(y)) - int(bool(z)) + 1) / 2 for z, y in zip(a, b, strict=True)]
    return mean_cs(x, alpha=alpha, null=0.0, scale=(-1.0, 1.0))


def two_sample_difference_cs(a: Sequence[bool], b: Sequence[bool], *,
                             alpha: float = 0.05) -> ConfidenceSequence:  # fmt: skip
    """The CS of ``rate_B - rate_A`` for two unpaired binary samples (each side's CS at
    ``alpha / 2``, a union bound; the difference's ends from theirs): in [-1, 1], null 0;
    ``n`` is the smaller side's count, ``decided_at`` None (the sides grow apart)."""
    sa = mean_cs([float(bool(v)) for v in a], alpha=alpha / 2)
    sb = mean_cs([float(bool(v)) for v in b], alpha=alpha / 2)
    est = None if sa.estimate is None or sb.estimate is None else sb.estimate - sa.estimate
    lo, hi = sb.lower - sa.upper, sb.upper - sa.lower
    drifted = sa.drifted or sb.drifted
    return ConfidenceSequence(min(sa.n, sb.n), est, lo, hi, alpha, "betting-eb, union of two",
                              0.0, None, _verdict(lo, hi, 0.0, drifted), drifted)  # fmt: skip


def faster_share_cs(ttft_a: Sequence[float], ttft_b: Sequence[float], *,
                    alpha: float = 0.05) -> ConfidenceSequence:  # fmt: skip
    """The CS of the share of requests that B answers first (paired TTFTs in ms, in the
    order observed; a tie counts 1/2): null 1/2; ``decided_higher`` means B is faster
    at the median of the paired differences.

    Raises:
        ValueError: sequences of different lengths.
    """
    if len(ttft_a) != len(ttft_b):
        raise ValueError(f"paired TTFTs: {len(ttft_a)} against {len(ttft_b)}")
    x = [1.0 if tb < ta else 0.5 if tb == ta else 0.0
         for ta, tb in zip(ttft_a, ttft_b, strict=True)]  # fmt: skip
    return mean_cs(x, alpha=alpha, null=0.5)
