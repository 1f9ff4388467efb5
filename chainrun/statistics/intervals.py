"""Honest statistics for latency percentiles and pass rates: pure functions, no I/O.

Conventions used throughout:

- ``p`` is a percentile in **percent** (``95`` for the p95), as in ``HedgeConfig.delay``.
- A percentile is the **order statistic** ``x_(k)`` with ``k = ceil(n * p / 100)``
  (Hyndman & Fan definition 1, numpy's ``method="inverted_cdf"``), the rank computed in
  exact arithmetic (:func:`chainrun.statistics.ranks.nearest_rank`: on floats ``0.07 * 100`` is
  ``7.000000000000001``, and numpy's ``inverted_cdf`` too gives rank 8 for the p7 of 100
  values): always an observed value, so with 12 values the p90 is the 11th smallest,
  i.e. the second slowest.
  The same order statistics bound the confidence interval, so the estimate
  always lies inside its interval.
- A quantile's interval is distribution-free, from order statistics and the binomial
  distribution (Conover, *Practical Nonparametric Statistics*, 3rd ed., §3.2), exactly
  as ``scipy.stats.quantile_test(x, p=p/100).confidence_interval()`` computes it. It is
  ``None`` where the data cannot bound it (scipy gives nan there): for a 95% interval
  the p95 needs n ≥ 72 and the p99 n ≥ 368 before an upper bound exists.
- Every result reports ``n``. Times are in ms wherever a key says ``_ms``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Any, Literal

from chainrun.statistics.ranks import nearest_rank

#: The percentiles reported by :func:`summarize` and ``chainrun compare``.
SUMMARY_PERCENTILES: tuple[int, ...] = (50, 90, 99)

ComparisonVerdict = Literal["better", "worse", "inconclusive"]
#: a latency verdict with a practical tolerance: ``same`` = a difference within it
LatencyVerdict = Literal["better", "worse", "same", "inconclusive"]


def _check_p(p: float) -> None:
    if not 0 < p < 100:
        raise ValueError(f"percentile must be in (0, 100) percent, e.g. 95; got {p!r}")


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` (``p`` in percent, 0 < p < 100).

    Definition: the order statistic ``x_(ceil(n*p/100))``, the rank in exact arithmetic
    (:func:`chainrun.statistics.ranks.nearest_rank`), the one consistent with :func:`quantile_ci`.
    With 12 values the p90 is the second slowest; the p7 of 100 values is the 7th.

    Raises:
        ValueError: ``values`` is empty or ``p`` is out of range.
    """
    _check_p(p)
    if len(values) == 0:
        raise ValueError("percentile of no values")
    k = nearest_rank(len(values), p)
    as_floats = [float(v) for v in values]
    if any(v != v for v in as_floats):  # NaN: NumPy's order (NaN last), as before
        import numpy as np

        return float(np.partition(np.asarray(as_floats), k - 1)[k - 1])
    # no NumPy import for a summary that reads a percentile (``chainrun show``)
    return sorted(as_floats)[k - 1]


@functools.lru_cache(maxsize=4096)
def order_stat_indices(n: int, p: float, confidence: float = 0.95) -> tuple[int | None, int | None]:
    """0-based indices into the sorted sample of a two-sided quantile interval.

    ``(lo, hi)``: ``lo = F⁻¹(α/2) − 1`` and ``hi = S⁻¹(α/2)`` for ``Binomial(n, p/100)``
    with ``α = 1 − confidence`` (scipy's ``quantile_test`` construction). An index
    outside ``[0, n)`` is ``None``: that side cannot be bounded by ``n`` values. Up to
    :data:`EXACT_MAX_N` values the binomial is summed in exact rational arithmetic (the
    same indices as SciPy's, without its second-long import), beyond it SciPy's.
    """
    _check_p(p)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence!r}")
    if n <= 0:
        return None, None
    alpha_half = (1 - confidence) / 2
    if n <= EXACT_MAX_N:
        lo, hi = _binom_ppf_isf(n, Fraction(p).limit_denominator(10**6) / 100,
                                Fraction(alpha_half))  # fmt: skip
    else:
        from scipy.stats import binom  # lazy: scipy.stats takes a second or more to import

        dist = binom(n, p / 100)
        lo, hi = int(dist.ppf(alpha_half)), int(dist.isf(alpha_half))
    lo -= 1
    return (lo if lo >= 0 else None), (hi if hi < n else None)


#: samples up to this size get their order-statistic indices from the binomial
#: distribution in exact rational arithmetic (a few ms), larger ones from SciPy's
EXACT_MAX_N = 1000


def _binom_ppf_isf(n: int, p: Fraction, q: Fraction) -> tuple[int, int]:
    """``(ppf(q), isf(q))`` of Binomial(n, p), exactly: the least k with CDF(k) >= q,
    and the least k with P(X > k) <= q (the definitions SciPy's discrete ``ppf`` and
    ``isf`` use)."""
    num, den = p.numerator, p.denominator
    total = den**n
    cdf = 0
    ppf = isf = None
    # P(X = k) = C(n, k) num^k (den - num)^(n - k) / den^n, summed as integers
    for k in range(n + 1):
        cdf += math.comb(n, k) * num**k * (den - num) ** (n - k)
        if ppf is None and cdf * q.denominator >= q.numerator * total:
            ppf = k
        if isf is None and (total - cdf) * q.denominator <= q.numerator * total:
            isf = k
        if ppf is not None and isf is not None:
            break
    return (n if ppf is None else ppf), (n if isf is None else isf)


def quantile_ci(
    values: Sequence[float], p: float, confidence: float = 0.95
) -> tuple[float, float] | None:
    """Distribution-free two-sided interval for the ``p``-th percentile (``p`` in percent).

    Returns ``(lo, hi)`` (two order statistics of ``values``) or ``None`` when either
    bound does not exist for this ``n`` (e.g. n < 72 for a 95% interval of the p95,
    n < 368 for the p99, n < 36 for the p90). Agrees with
    ``scipy.stats.quantile_test(values, p=p/100).confidence_interval(confidence)``,
    which gives nan for the missing bound.
    """
    lo_i, hi_i = order_stat_indices(len(values), p, confidence)
    if lo_i is None or hi_i is None:
        return None
    xs = sorted(float(v) for v in values)
    return xs[lo_i], xs[hi_i]


def _round(x: float) -> float:
    return round(x, 3)


def summarize(
    values: Sequence[float], confidence: float = 0.95, unit: str = "ms"
) -> dict[str, Any]:
    """Percentiles with intervals and n, JSON-ready.

    Returns ``{"n", "p50_ms", "p90_ms", "p99_ms", "p50_ci", "p90_ci", "p99_ci"}``:
    estimates are floats (``None`` when n = 0), intervals ``[lo, hi]`` lists or ``None``
    where the data cannot bound them. ``unit`` renames the estimate keys (``"tokens"``
    gives ``p50_tokens``...).
    """
    out: dict[str, Any] = {"n": len(values)}
    for p in SUMMARY_PERCENTILES:
        out[f"p{p}_{unit}"] = _round(percentile(values, p)) if values else None
    for p in SUMMARY_PERCENTILES:
        ci = quantile_ci(values, p, confidence)
        out[f"p{p}_ci"] = [_round(ci[0]), _round(ci[1])] if ci else None
    return out


@dataclass(frozen=True)
class QuantileDiff:
    """B − A of one percentile (same unit as the data).

    ``estimate`` is ``None`` when either side is empty; ``ci`` is ``None`` when either
    side's interval cannot be bounded at the level used (see :func:`quantile_diff`).
    """

    p: float
    estimate: float | None
    ci: tuple[float, float] | None

    @property
    def verdict(self) -> ComparisonVerdict:
        """``worse`` (B larger) / ``better`` only when the interval excludes 0."""
        if self.ci is None:
            return "inconclusive"
        if self.ci[0] > 0:
            return "worse"
        if self.ci[1] < 0:
            return "better"
        return "inconclusive"


def quantile_diff(
    a: Sequence[float], b: Sequence[float], p: float, confidence: float = 0.95
) -> QuantileDiff:
    """Difference B − A of the ``p``-th percentile of two independent samples, with interval.

    The interval is the conservative one built from the two order-statistic intervals:
    ``[lo_B − hi_A, hi_B − lo_A]`` with each side's interval at level ``√confidence``.
    Both cover with probability ≥ √c · √c = c when the runs are independent, and then the
    difference lies in the interval, so its coverage is at least ``confidence`` with no
    assumption on the latency distribution. Chosen over a bootstrap because a bootstrap of
    a tail percentile from few values is degenerate (it resamples the same few largest
    values and reports a falsely narrow interval); this one says ``None`` instead. The
    price: each side needs a little more data than for its own 95% interval (the p90
    needs n ≥ 42 per side rather than 36, the p99 n ≥ 435 rather than 368), and the
    interval is wide (a "worse" verdict needs the two intervals not to overlap).

    An A/A comparison (identical samples) always gives an interval containing 0.
    """
    _check_p(p)
    if not a or not b:
        return QuantileDiff(p, None, None)
    estimate = percentile(b, p) - percentile(a, p)
    side = math.sqrt(confidence)
    ci_a = quantile_ci(a, p, side)
    ci_b = quantile_ci(b, p, side)
    if ci_a is None or ci_b is None:
        return QuantileDiff(p, estimate, None)
    return QuantileDiff(p, estimate, (ci_b[0] - ci_a[1], ci_b[1] - ci_a[0]))


def latency_verdict(diffs: Sequence[QuantileDiff]) -> ComparisonVerdict:
    """One verdict over several percentiles' differences (B − A; larger = slower).

    ``worse`` when any bounded difference lies entirely above 0, else ``better`` when
    any lies entirely below 0, else ``inconclusive`` (including when nothing is bounded).
    """
    verdicts = {d.verdict for d in diffs}
    if "worse" in verdicts:
        return "worse"
    if "better" in verdicts:
        return "better"
    return "inconclusive"


def practical_verdict(diff: QuantileDiff, tolerance: float) -> LatencyVerdict:
    """One percentile's verdict with a practical tolerance (same unit as the data, ≥ 0).

    ``worse`` when the interval lies above 0 (a real difference) *and* the estimate
    exceeds ``tolerance``; ``better`` mirrored; ``same`` when the whole interval lies
    within ``±tolerance`` (the difference, real or not, is shown to be smaller than the
    tolerance); otherwise ``inconclusive`` (also when the interval cannot be bounded, and
    when a real difference's estimate is within the tolerance but its interval reaches
    beyond it). With ``tolerance = 0``, ``worse`` and ``better`` are exactly
    :attr:`QuantileDiff.verdict`'s. ``same`` is an equivalence test with margin
    ``tolerance`` (the "smallest effect size of interest"; Lakens, "Equivalence Tests",
    Social Psychological and Personality Science 8(4), 2017): a real 1% change of a
    near-constant latency is not worth a verdict.

    Raises:
        ValueError: a negative ``tolerance``.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0; got {tolerance!r}")
    if diff.ci is None or diff.estimate is None:
        return "inconclusive"
    lo, hi = diff.ci
    if lo > 0 and diff.estimate > tolerance:
        return "worse"
    if hi < 0 and diff.estimate < -tolerance:
        return "better"
    if -tolerance <= lo and hi <= tolerance:
        return "same"
    return "inconclusive"


def practical_latency_verdict(
    diffs: Sequence[QuantileDiff], tolerances: Sequence[float]
) -> tuple[LatencyVerdict, int | None]:
    """One verdict over several percentiles' differences, each with its tolerance
    (:func:`practical_verdict`), and the index of the difference that decided it.

    ``worse`` when any percentile is worse, else ``better`` when any is better, else
    ``same`` when every *bounded* percentile is ``same`` (an unbounded p99 of a small run
    does not block it; a bounded but wide one does), else ``inconclusive`` (index None).
    """
    verdicts = [practical_verdict(d, t) for d, t in zip(diffs, tolerances, strict=True)]
    for v in ("worse", "better"):
        if v in verdicts:
            return v, verdicts.index(v)
    bounded = [v for d, v in zip(diffs, verdicts, strict=True) if d.ci is not None]
    if bounded and all(v == "same" for v in bounded):
        return "same", verdicts.index("same")
    return "inconclusive", None


def wilson_interval(passed: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval for a pass rate ``passed / n``; ``None`` when n = 0.

    Source: E. B. Wilson, "Probable inference...", JASA 22 (1927). Unlike the normal
    approximation it stays inside [0, 1] and is sensible at 0/n and n/n.
    """
    if n <= 0:
        return None
    if not 0 <= passed <= n:
        raise ValueError(f"passed must be in [0, n]; got {passed} of {n}")
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    phat = passed / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_rate(passed: int, n: int, confidence: float = 0.95) -> dict[str, Any]:
    """``{"n", "passed", "pass_rate", "pass_rate_ci"}``, JSON-ready (rate None when n = 0)."""
    ci = wilson_interval(passed, n, confidence)
    return {
        "n": n,
        "passed": passed,
        "pass_rate": round(passed / n, 4) if n else None,
        "pass_rate_ci": [round(ci[0], 4), round(ci[1], 4)] if ci else None,
    }


def sign_test_p(k: int, n: int) -> float:
    """Exact two-sided binomial p-value of ``k`` successes in ``n`` at probability 1/2.

    The exact McNemar test when ``k`` and ``n − k`` are the two discordant counts.
    ``n = 0`` gives 1.0.
    """
    if n == 0:
        return 1.0
    tail = min(k, n - k)
    s = sum(math.comb(n, i) for i in range(tail + 1))
    return min(1.0, 2 * s / 2**n)


@dataclass(frozen=True)
class PairedResult:
    """Paired pass/fail comparison of A and B on the same cases.

    ``a_only``: cases A passed and B failed; ``b_only``: B passed and A failed (the
    discordant pairs; concordant ones carry no information about the difference).
    """

    n_pairs: int
    a_passed: int
    b_passed: int
    a_only: int
    b_only: int
    p_value: float
    verdict: ComparisonVerdict
    unpaired_a: int = 0
    unpaired_b: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_pairs": self.n_pairs,
            "a": pass_rate(self.a_passed, self.n_pairs),
            "b": pass_rate(self.b_passed, self.n_pairs),
            "a_only_passed": self.a_only,
            "b_only_passed": self.b_only,
            "p_value": round(self.p_value, 6),
            "verdict": self.verdict,
            "unpaired_a": self.unpaired_a,
            "unpaired_b": self.unpaired_b,
        }


def paired_compare(
    a: Mapping[str, bool], b: Mapping[str, bool], alpha: float = 0.05
) -> PairedResult:
    """Exact McNemar test (binomial sign test on discordant pairs) of B against A.

    ``a`` and ``b`` map case id → passed; only ids present in both are paired (the
    others are counted in ``unpaired_a`` / ``unpaired_b``). ComparisonVerdict: ``better`` when B
    passes significantly more of the discordant pairs (two-sided p < ``alpha``),
    ``worse`` when significantly fewer, else ``inconclusive``. A run against itself has
    no discordant pair, so p = 1 and the verdict is always ``inconclusive``.
    """
    keys = a.keys() & b.keys()
    a_only = sum(1 for k in keys if a[k] and not b[k])
    b_only = sum(1 for k in keys if b[k] and not a[k])
    p_value = sign_test_p(b_only, a_only + b_only)
    verdict: ComparisonVerdict = "inconclusive"
    if p_value < alpha:
        verdict = "better" if b_only > a_only else "worse"
    return PairedResult(
        n_pairs=len(keys),
        a_passed=sum(1 for k in keys if a[k]),
        b_passed=sum(1 for k in keys if b[k]),
        a_only=a_only,
        b_only=b_only,
        p_value=p_value,
        verdict=verdict,
        unpaired_a=len(a.keys() - keys),
        unpaired_b=len(b.keys() - keys),
    )
