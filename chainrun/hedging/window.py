"""A time-windowed latency window: the source of a percentile hedge delay.

Modelled on Finagle's ``BackupRequestFilter``: latencies go into a histogram over a
sliding window made of a few time buckets (3 buckets of 10 s there), the percentile
is recomputed at most every few seconds (3 s there), it never goes below a floor
(1 ms there), and there is no percentile at all until the window holds enough data
(no backups during warm-up). Dean and Barroso ("The Tail at Scale", CACM 56(2), 2013)
suggest the p95 as the hedge delay, which limits the extra load to about 5%.

Unlike Finagle's histogram, the window sees every attempt sent, not only the answers
that won: an attempt cancelled after running t ms (a loser, or one cut by the deadline)
is a *censored* observation, "longer than t". A window of winners alone holds the
faster of two copies, so its "p95" is that of the minimum, not of one call, and a
delay read from it drifts down with every copy that wins. Percentiles are therefore
read from the Kaplan-Meier product-limit estimate of the survival function (E. L.
Kaplan and P. Meier, "Nonparametric estimation from incomplete observations", JASA
53(282), 1958): S(t) = prod over answer times t_i <= t of (1 - d_i / r_i), with r_i the
attempts still running just before t_i (censored ones count while they ran). The p-th
percentile is the first answer time at which 1 - S(t) >= p / 100, decided in exact
arithmetic; with no censored observation that is exactly the nearest rank
``ceil(n * p / 100)`` (:func:`chainrun.statistics.ranks.nearest_rank`, the one rank rule
of chainrun).

Mass past the longest observation: when the slowest attempts in the window were all cut
short, S(t) stays above 0 after the last answer, and a high enough percentile is
reached at no answer time. The convention (B. Efron, "The two sample problem with
censored data", Proc. 5th Berkeley Symposium 4, 1967, which treats the largest
observation as an answer) puts that mass at the longest time observed: the percentile is
then that time, a lower bound (those attempts took longer than they ran, by how much is
unknown). :class:`QuantileEstimate` says how much mass was put there (``tail_share``).
``chainrun advise`` uses the same estimate and convention offline.

Interval: Brookmeyer and Crowley ("A confidence interval for the median survival time",
Biometrics 38(1), 1982): the answer times t whose S(t) is within z standard errors
(Greenwood's formula, M. Greenwood, 1926) of 1 - p / 100; a side is None where the
window cannot bound it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

import numpy as np

from chainrun.statistics.ranks import nearest_rank, percent_fraction
from chainrun.statistics.survival import Survival, kaplan_meier, ordered, product_limit

#: a float survival within this relative distance of the target is checked exactly
_EXACT_BAND = 1e-9


@dataclass(frozen=True)
class QuantileEstimate:
    """A percentile of one call's latency, from the window's Kaplan-Meier estimate.

    Attributes:
        value_ms: the percentile in ms (at least the window's floor).
        ci95: (lo, hi) in ms, Brookmeyer-Crowley 95% interval; a side is None where the
            window cannot bound it.
        n: observations in the window (answers plus censored attempts).
        n_censored: attempts cut short (known only to take longer than they ran).
        tail_share: survival mass past the longest observation, 0-1, put at that time
            (Efron's convention): 0 when the slowest observation is an answer.
        at_tail: the percentile lies in that mass (the value is a lower bound).
    """

    value_ms: float
    ci95: tuple[float | None, float | None]
    n: int
    n_censored: int
    tail_share: float
    at_tail: bool


def km_quantile(
    samples: Sequence[tuple[float, bool]], p: float, confidence: float = 0.95,
    *, interval: bool = True,
) -> QuantileEstimate | None:  # fmt: skip
    """The ``p``-th percentile (0 < p <= 100) of (ms, answered) samples; None if empty.

    The first answer time at which 1 - S(t) >= p / 100, decided in exact arithmetic (S is
    a product of ratios of integers: consecutive answers telescope, so it is kept as one
    ratio per run of answers; floats only locate the candidate); past the last answer,
    Efron's convention (module text). Without censored samples this is the nearest rank
    (:func:`chainrun.statistics.ranks.nearest_rank`). Interval (``interval``; else ``(None,
    None)``): Brookmeyer-Crowley with Greenwood's variance (module text); floor not
    applied (see :meth:`LatencyWindow.estimate`).
    """
    if not samples:
        return None
    frac = percent_fraction(p)  # raises ValueError outside (0, 100]
    n = len(samples)
    n_cens = sum(1 for _, answered in samples if not answered)
    if n_cens == 0 and not interval:
        values = np.fromiter((ms for ms, _ in samples), float, n)
        k = nearest_rank(n, p) - 1
        value = float(np.partition(values, k)[k])
        return QuantileEstimate(value, (None, None), n, 0, 0.0, False)
    t, a = ordered(samples)
    surv = product_limit(a)
    target = 1 - frac  # the quantile is where S first falls to this or below
    if n_cens == 0:
        found: float | None = float(t[nearest_rank(n, p) - 1])
        tail_share = 0.0
    else:
        found = _km_exact(t, a, surv, target)
        tail_share = float(surv[-1])
    ci = _brookmeyer_crowley(t, a, surv, float(target), confidence) if interval else (None, None)
    value = float(t[-1]) if found is None else found
    return QuantileEstimate(value, ci, n, n_cens, tail_share, found is None)


def _km_exact(
    t: np.ndarray, a: np.ndarray, surv: np.ndarray, target: Fraction
) -> float | None:
    """The first answer time with S <= target, or None (past the last answer). Floats
    locate, integers decide: S = prod of num/den over runs of consecutive answers (a run
    from at-risk a down to b contributes b / a)."""
    n = len(t)
    # S is judged after the last answer at a time (ties): candidates are answers whose
    # next observation is not an answer at the same time
    group_end = a & np.r_[(t[1:] != t[:-1]) | ~a[1:], True]
    near = group_end & (surv <= float(target) * (1 + _EXACT_BAND) + 1e-300)
    for i in np.flatnonzero(near):
        # runs of consecutive answers up to i: starts and ends (indices into t)
        seg = a[: i + 1]
        starts = np.flatnonzero(seg & np.r_[True, ~seg[:-1]])
        ends = np.flatnonzero(seg & np.r_[~seg[1:], True])
        num = den = 1
        for s0, e0 in zip(starts.tolist(), ends.tolist(), strict=True):
            num *= n - e0 - 1  # at risk after the run's last answer
            den *= n - s0  # at risk at the run's first answer
        if num * target.denominator <= target.numerator * den:
            return float(t[i])
    return None


def _brookmeyer_crowley(
    t: np.ndarray, a: np.ndarray, surv: np.ndarray, target: float, confidence: float
) -> tuple[float | None, float | None]:
    """(lo, hi) in ms: the first answer time whose S is not significantly above
    ``target``, and the first after it whose S is significantly below (None where the
    window has none: an S that reaches 0 at the slowest answer bounds nothing)."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    n = len(t)
    r = np.arange(n, 0, -1, dtype=float)
    with np.errstate(divide="ignore"):
        terms = np.where(a & (r > 1), 1.0 / (r * (r - 1)), 0.0)
    se = surv * np.sqrt(np.cumsum(terms))
    group_end = a & np.r_[(t[1:] != t[:-1]) | ~a[1:], True] & (r > 1) & (surv > 0)
    idx = np.flatnonzero(group_end)
    if not len(idx):
        return None, None
    s, e = surv[idx], se[idx]
    inside = np.flatnonzero(s - target <= z * e)
    if not len(inside):
        return None, None
    first = inside[0]
    below = np.flatnonzero(target - s[first:] > z * e[first:])
    hi = float(t[idx[first + below[0]]]) if len(below) else None
    return float(t[idx[first]]), hi


class LatencyWindow:
    """Latency observations (ms) of the last ``window_s`` seconds, in ``buckets`` time buckets.

    An observation lives in the bucket of the time it was recorded; a bucket is dropped
    as a whole once it is ``buckets`` bucket-lengths old, so the window covers between
    ``window_s * (buckets - 1) / buckets`` and ``window_s`` seconds of history (Finagle's
    scheme: cheap expiry, no per-sample timestamps). An observation is an answer
    (:meth:`record`) or an attempt cut short (:meth:`record_censored`).

    Args:
        window_s: length of the window in seconds (Finagle: 30 s).
        buckets: number of buckets the window is split into (Finagle: 3).
        min_samples: fewer observations than this in the window means warm-up:
            :meth:`percentile` returns None.
        refresh_s: a percentile is recomputed at most this often, in seconds (Finagle: 3 s);
            in between the cached value is returned.
        floor_ms: lower bound of any percentile returned, in ms (Finagle: 1 ms).
        clock: monotonic time in seconds; injectable for tests.

    Raises:
        ValueError: a non-positive window, bucket count or refresh interval, or a negative
            ``min_samples`` or ``floor_ms``.
    """

    def __init__(
        self,
        window_s: float = 30.0,
        *,
        buckets: int = 3,
        min_samples: int = 20,
        refresh_s: float = 3.0,
        floor_ms: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0 or buckets < 1 or refresh_s < 0 or min_samples < 0 or floor_ms < 0:
            raise ValueError(
                "LatencyWindow needs window_s > 0, buckets >= 1, refresh_s >= 0, "
                f"min_samples >= 0, floor_ms >= 0; got {window_s=}, {buckets=}, "
                f"{refresh_s=}, {min_samples=}, {floor_ms=}"
            )
        self.window_s = window_s
        self.buckets = buckets
        self.min_samples = min_samples
        self.refresh_s = refresh_s
        self.floor_ms = floor_ms
        self._clock = clock
        self._bucket_s = window_s / buckets
        # (bucket index, [(ms, answered)]), oldest first
        self._buckets: deque[tuple[int, list[tuple[float, bool]]]] = deque()
        # (percentile, with interval) -> (computed at, in clock seconds; estimate)
        self._cache: dict[tuple[float, bool], tuple[float, QuantileEstimate]] = {}

    def record(self, latency_ms: float) -> None:
        """Add one answered attempt's latency, in ms (negative values are clamped to 0)."""
        self._add(latency_ms, True)

    def record_censored(self, ran_ms: float) -> None:
        """Add one attempt cut short after running ``ran_ms`` ms: its latency is longer."""
        self._add(ran_ms, False)

    def _add(self, ms: float, answered: bool) -> None:
        index = self._expire()
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append((index, []))
        self._buckets[-1][1].append((max(0.0, ms), answered))

    def __len__(self) -> int:
        """Number of observations (answers and censored) currently in the window."""
        self._expire()
        return sum(len(samples) for _, samples in self._buckets)

    def samples(self) -> list[tuple[float, bool]]:
        """The window's observations: (ms, answered) pairs, oldest bucket first."""
        self._expire()
        return [s for _, bucket in self._buckets for s in bucket]

    def survival(self, running_ms: Sequence[float] = ()) -> Survival | None:
        """The Kaplan-Meier survival function of the window, or None during warm-up.

        ``running_ms``: how long each attempt still in flight has run, in ms; each is a
        censored observation too. Without them a window read while slow attempts are
        still out (right after a start, when only the fast ones have answered) would
        hold only fast calls.
        """
        samples = self.samples()
        if not samples or len(samples) < self.min_samples:
            return None
        return kaplan_meier(samples + [(max(0.0, ms), False) for ms in running_ms])

    def percentile(self, p: float) -> float | None:
        """The ``p``-th percentile (0 < p <= 100) of one call's latency in ms, or None
        during warm-up: :attr:`QuantileEstimate.value_ms` of :meth:`estimate`.

        Raises:
            ValueError: ``p`` outside (0, 100].
        """
        est = self._estimate(p, interval=False)  # the delay needs no interval: less work
        return None if est is None else est.value_ms

    def estimate(self, p: float) -> QuantileEstimate | None:
        """The ``p``-th percentile (0 < p <= 100) with n and interval, or None during warm-up.

        Kaplan-Meier over answers and censored attempts (module text); with no censored
        observation the ``ceil(p / 100 * n)``-th smallest, so with 20 answers the p95 is
        the second-slowest. The value and interval are at least ``floor_ms``, cached for
        ``refresh_s`` seconds, and None whenever the window holds fewer than
        ``min_samples`` observations (checked on every call, not cached).

        Raises:
            ValueError: ``p`` outside (0, 100].
        """
        return self._estimate(p, interval=True)

    def _estimate(self, p: float, *, interval: bool) -> QuantileEstimate | None:
        if not 0 < p <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {p}")
        count = len(self)
        if count == 0 or count < self.min_samples:
            return None
        now = self._clock()
        cached = self._cache.get((p, interval))
        if cached is not None and now - cached[0] < self.refresh_s:
            return cached[1]
        est = km_quantile(self.samples(), p, interval=interval)
        assert est is not None
        floor = self.floor_ms
        lo, hi = est.ci95
        est = QuantileEstimate(
            max(floor, est.value_ms),
            (None if lo is None else max(floor, lo), None if hi is None else max(floor, hi)),
            est.n, est.n_censored, est.tail_share, est.at_tail,
        )  # fmt: skip
        self._cache[(p, interval)] = (now, est)
        return est

    def _expire(self) -> int:
        """Drop buckets that left the window; return the current bucket index."""
        index = math.floor(self._clock() / self._bucket_s)
        while self._buckets and self._buckets[0][0] <= index - self.buckets:
            self._buckets.popleft()
        return index
