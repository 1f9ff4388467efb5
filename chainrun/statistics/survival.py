"""The Kaplan-Meier product-limit estimate of a survival function, for latencies some of
which are censored (an attempt cut short after t ms is known only to take longer than t):
E. L. Kaplan and P. Meier, "Nonparametric estimation from incomplete observations", JASA
53(282), 1958. S(t) = prod over answer times t_i <= t of (1 - d_i / r_i), with r_i the
observations still at risk just before t_i; at equal times answers come first (a
censored attempt was still running at that time). One estimator for the hedge window
(:mod:`chainrun.hedging.window`) and ``chainrun advise`` (:mod:`chainrun.analysis.advise`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Survival", "kaplan_meier", "ordered", "product_limit"]


@dataclass(frozen=True)
class Survival:
    """The Kaplan-Meier survival function of one call's latency (a window's snapshot).

    ``times`` are the distinct answer times in ms, ascending; ``surv[i]`` = S just after
    ``times[i]`` (the share of calls slower than it). ``tail_ms`` is the longest time
    observed (answer or censored): the mass left after the last answer sits just above
    it, and past it S is 0 (Efron's convention; a call cut at the deadline still misses
    it).
    """

    times: Sequence[float]
    surv: Sequence[float]
    tail_ms: float
    n: int
    n_censored: int

    def __call__(self, t_ms: float) -> float:
        """S(t): the estimated share of calls still unanswered after ``t_ms`` ms (the
        tail's mass sits just above ``tail_ms``: S is 0 only past it)."""
        if t_ms > self.tail_ms:
            return 0.0
        i = bisect.bisect_right(self.times, t_ms)
        return 1.0 if i == 0 else self.surv[i - 1]

    def never_past_tail(self, t_ms: float) -> float:
        """S(t) with the other convention for the mass past the last answer: those calls
        never answer (S keeps its last value; R. D. Gill, "Censoring and stochastic
        integrals", Mathematical Centre Tracts 124, 1980). The pessimistic reading, for
        predictions: a call seen only as "longer than t" is not assumed to answer soon."""
        i = bisect.bisect_right(self.times, t_ms)
        return 1.0 if i == 0 else self.surv[i - 1]

    @property
    def tail_share(self) -> float:
        """Mass past the last answer time, put at ``tail_ms`` (0 if none)."""
        return self.surv[-1] if self.surv else 1.0


def ordered(samples: Sequence[tuple[float, bool]]) -> tuple[np.ndarray, np.ndarray]:
    """(times ascending, answered) as arrays; at equal times answers come first (a
    censored attempt was still running at that time)."""
    times = np.fromiter((t for t, _ in samples), float, len(samples))
    answered = np.fromiter((a for _, a in samples), bool, len(samples))
    order = np.lexsort((~answered, times))
    return times[order], answered[order]


def product_limit(answered: np.ndarray) -> np.ndarray:
    """S just after each observation (float): prod of (1 - 1/r) over the answers so far,
    r the observations at risk (``answered`` in time order)."""
    at_risk = np.arange(len(answered), 0, -1, dtype=float)
    return np.cumprod(np.where(answered, 1.0 - 1.0 / at_risk, 1.0))


def kaplan_meier(samples: Sequence[tuple[float, bool]]) -> Survival:
    """The product-limit estimate of ``samples``: (ms, answered) pairs, ``answered`` False
    for an attempt cut short after that many ms."""
    if not samples:
        return Survival([], [], 0.0, 0, 0)
    t, a = ordered(samples)
    surv = product_limit(a)
    at, sv = t[a], surv[a]
    # one point per distinct answer time: S after the last answer at that time
    last = np.r_[at[1:] != at[:-1], True] if len(at) else np.zeros(0, bool)
    return Survival(
        at[last].tolist(), sv[last].tolist(), float(t[-1]), len(t), int((~a).sum())
    )
