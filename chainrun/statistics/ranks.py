"""Nearest-rank percentile indices in exact arithmetic: pure functions, stdlib only.

The ``p``-th percentile (``p`` in percent) of ``n`` sorted values is the order statistic
of rank ``k = ceil(n * p / 100)`` (the nearest-rank definition; Hyndman and Fan,
"Sample Quantiles in Statistical Packages", The American Statistician 50(4), 1996,
definition 1, numpy's ``method="inverted_cdf"``). Computed in floating point the rank
can be one too high: ``0.07 * 100 == 7.000000000000001``, so ``ceil`` gives 8 for the
p7 of 100 values, and numpy's ``inverted_cdf`` does the same. Here ``p`` is read as the
decimal it was written as (``7``, ``99.9``, ``Decimal("99.9")``, ``Fraction(999, 10)``)
and the rank is an integer ceiling division, exact for every ``n`` and ``p``.

Used by every percentile chainrun takes (run summaries, comparisons, the hedge delay's
latency window), so that they all agree on which value is "the p95".
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

__all__ = ["Percent", "nearest_rank", "percent_fraction"]


Percent = int | float | str | Decimal | Fraction


def percent_fraction(p: Percent) -> Fraction:
    """``p`` (a percentage) as an exact fraction of the whole, e.g. ``95`` → ``19/20``.

    A float is read as its shortest decimal representation (``repr``): ``99.9`` is
    999/1000 of the whole, not the binary double nearest to it. A string is read as a
    decimal or a fraction (``"99.9"``, ``"999/10"``).

    Raises:
        ValueError: ``p`` is not finite or not in (0, 100].
        TypeError: ``p`` is not a number (a bool counts as none).
    """
    if isinstance(p, bool) or not isinstance(p, int | float | str | Decimal | Fraction):
        raise TypeError(f"percentile must be a number in percent, e.g. 95; got {p!r}")
    if isinstance(p, str):
        try:
            exact = Fraction(p.strip())
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"percentile must be a number in percent; got {p!r}") from None
    elif isinstance(p, float):
        if p != p or p in (float("inf"), float("-inf")):
            raise ValueError(f"percentile must be in (0, 100] percent; got {p!r}")
        exact = Fraction(repr(p))
    elif isinstance(p, Decimal):
        if not p.is_finite():
            raise ValueError(f"percentile must be in (0, 100] percent; got {p!r}")
        exact = Fraction(p)
    else:
        exact = Fraction(p)
    if not 0 < exact <= 100:
        raise ValueError(f"percentile must be in (0, 100] percent, e.g. 95; got {p!r}")
    return exact / 100


def nearest_rank(n: int, p: Percent) -> int:
    """The 1-based rank ``ceil(n * p / 100)`` of the ``p``-th percentile of ``n`` values
    (``p`` in percent), at least 1; exact integer arithmetic.

    ``sorted(values)[nearest_rank(len(values), p) - 1]`` is the percentile. With 12
    values the p90 has rank 11 (the second slowest); the p7 of 100 values has rank 7.

    Raises:
        ValueError: ``n < 1``, or ``p`` not in (0, 100] (:func:`percent_fraction`).
        TypeError: ``n`` is not an int or ``p`` not a number.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int; got {n!r}")
    if n < 1:
        raise ValueError(f"a percentile needs at least one value; got n = {n}")
    q = percent_fraction(p)
    # ceil(n * num / den) with integers only
    return max(1, -(-n * q.numerator // q.denominator))
