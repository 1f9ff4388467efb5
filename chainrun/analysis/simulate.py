"""Monte Carlo latency budgets of a check policy (``chainrun simulate``), vectorised in NumPy.

Two models, both with closed forms to check against where they exist:

* **k checks with log-normal latency** X (median m, shape sigma: X = m·exp(sigma·Z)), run
  ``sequential`` (sum of k), ``parallel`` (max of k), or ``hedged``: in parallel, each
  check hedged at t = the q-quantile of one check's latency, so each becomes
  min(X, t + X') with X' an independent copy (Dean and Barroso, "The Tail at Scale", CACM
  2013). Extra load of the hedge: P(X > t) = 1 − q per check (5% at the p95). Closed forms:
  the p-quantile of the max of k i.i.d. checks is F⁻¹(p^(1/k)); a single check's is
  m·exp(sigma·Φ⁻¹(p)).
* **a bimodal classifier** (a shared inference endpoint: a warm path of 0.1-0.3 s with
  probability p, else a cold path of 3-19 s, each uniform) under a deadline, with a copy
  every d up to k attempts; a copy starts only while no attempt has answered and before
  the deadline.
  When d is at least the fast path's end and every slow answer misses the deadline, the
  share in time is 1 − (1 − p)^k' (k' attempts that start in time and can finish) and the
  calls per check 1 + (1 − p) + … + (1 − p)^(k−1).

Every percentile comes with its n and a 95% interval from order statistics (normal
approximation of the binomial rank, fine at these n).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from chainrun.errors import UserInputError
from chainrun.statistics.ranks import nearest_rank

PERCENTILES = (50, 90, 99)
MODES = ("sequential", "parallel", "hedged")
#: requests simulated per block (bounds memory: block x k_max float64 arrays)
_BLOCK = 250_000


def _quantile_ci(sorted_values: np.ndarray, p: float) -> tuple[float, float, float]:
    """The p-quantile (0 < p < 1) of sorted values and its 95% order-statistic interval."""
    n = len(sorted_values)
    rank = p * n
    half = 1.96 * math.sqrt(n * p * (1 - p))
    lo = max(0, math.floor(rank - half) - 1)
    hi = min(n - 1, math.ceil(rank + half))
    point = nearest_rank(n, Fraction(str(p)) * 100) - 1  # exact: p * n on floats is not
    return float(sorted_values[point]), float(sorted_values[lo]), float(sorted_values[hi])


def _summary(values: np.ndarray) -> dict[str, Any]:
    values = np.sort(values)
    out: dict[str, Any] = {"n": len(values)}
    for p in PERCENTILES:
        point, lo, hi = _quantile_ci(values, p / 100)
        out[f"p{p}_ms"] = round(point, 3)
        out[f"p{p}_ci95_ms"] = [round(lo, 3), round(hi, 3)]
    return out


def lognormal_quantile_ms(median_ms: float, sigma: float, q: float) -> float:
    """The q-quantile of a log-normal latency, in ms: median · exp(sigma · Φ⁻¹(q))."""
    from scipy.stats import norm  # lazy: scipy.stats takes seconds to import

    return float(median_ms * math.exp(sigma * norm.ppf(q)))


def simulate_lognormal(
    *,
    median_ms: float,
    sigma: float,
    checks: Sequence[int],
    hedge_quantile: float = 0.95,
    requests: int = 1_000_000,
    seed: int | None = None,
) -> dict[str, Any]:
    """k log-normal checks, sequential / parallel / hedged, over ``requests`` simulated requests.

    The hedge delay t is the exact ``hedge_quantile`` of one check's latency (closed form).

    Returns ``{dist, median_ms, sigma, hedge_quantile, hedge_delay_ms, requests, seed,
    by_k: {"k": {sequential: {n, p50_ms, p50_ci95_ms, p90_ms, ..., p99_ms, ...},
    parallel: {...}, hedged: {..., extra_load}}}, closed_form: {"k": {parallel:
    {p50_ms, p90_ms, p99_ms}}, hedged_extra_load}}``. ``extra_load`` is copies per check
    (the extra check traffic as a fraction of checks).

    Raises:
        UserInputError: a non-positive median, sigma, request count or k, or a quantile
            outside (0, 1).
    """
    if median_ms <= 0 or sigma <= 0 or requests < 1 or not checks or min(checks) < 1:
        raise UserInputError(
            "simulate: need --median-ms > 0, --sigma > 0, --requests >= 1 and every k in "
            f"--checks >= 1; got median {median_ms}, sigma {sigma}, requests {requests}, "
            f"checks {list(checks)}"
        )
    if not 0 < hedge_quantile < 1:
        raise UserInputError(f"simulate: --hedge-quantile must be in (0, 1), got {hedge_quantile}")
    ks = sorted(set(checks))
    kmax = ks[-1]
    t = lognormal_quantile_ms(median_ms, sigma, hedge_quantile)
    rng = np.random.default_rng(seed)
    mu = math.log(median_ms)
    cols: dict[str, dict[int, list[np.ndarray]]] = {m: {k: [] for k in ks} for m in MODES}
    copies: dict[int, int] = {k: 0 for k in ks}
    done = 0
    while done < requests:
        b = min(_BLOCK, requests - done)
        x = rng.lognormal(mu, sigma, size=(b, kmax))
        x2 = rng.lognormal(mu, sigma, size=(b, kmax))
        hedged = np.minimum(x, t + x2)
        fired = x > t
        seq = np.cumsum(x, axis=1)
        par = np.maximum.accumulate(x, axis=1)
        hed = np.maximum.accumulate(hedged, axis=1)
        fired_cum = np.cumsum(fired, axis=1)
        for k in ks:
            cols["sequential"][k].append(seq[:, k - 1])
            cols["parallel"][k].append(par[:, k - 1])
            cols["hedged"][k].append(hed[:, k - 1])
            copies[k] += int(fired_cum[:, k - 1].sum())
        done += b
    by_k: dict[str, dict[str, Any]] = {}
    closed: dict[str, Any] = {}
    for k in ks:
        entry = {m: _summary(np.concatenate(cols[m][k])) for m in MODES}
        entry["hedged"]["extra_load"] = round(copies[k] / (requests * k), 5)
        by_k[str(k)] = entry
        closed[str(k)] = {
            "parallel": {
                f"p{p}_ms": round(lognormal_quantile_ms(median_ms, sigma, (p / 100) ** (1 / k)), 3)
                for p in PERCENTILES
            }
        }
    return {
        "dist": "lognormal",
        "median_ms": median_ms,
        "sigma": sigma,
        "hedge_quantile": hedge_quantile,
        "hedge_delay_ms": round(t, 3),
        "requests": requests,
        "seed": seed,
        "by_k": by_k,
        "closed_form": {"by_k": closed, "hedged_extra_load": round(1 - hedge_quantile, 5)},
    }


@dataclass(frozen=True)
class Bimodal:
    """A bimodal latency: with probability ``fast_share`` uniform on ``fast_ms``, else on
    ``slow_ms`` (a shared endpoint's classifier: 0.5, 100-300 ms, 3000-19000 ms)."""

    fast_share: float = 0.5
    fast_ms: tuple[float, float] = (100.0, 300.0)
    slow_ms: tuple[float, float] = (3000.0, 19000.0)

    def __post_init__(self) -> None:
        lo_f, hi_f = self.fast_ms
        lo_s, hi_s = self.slow_ms
        if not 0 <= self.fast_share <= 1 or not 0 <= lo_f <= hi_f or not 0 <= lo_s <= hi_s:
            raise UserInputError(
                "simulate: need 0 <= --fast-share <= 1 and ranges LO-HI with 0 <= LO <= HI; "
                f"got {self.fast_share}, {self.fast_ms}, {self.slow_ms}"
            )

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Latencies in ms, of ``shape``."""
        fast = rng.random(shape) < self.fast_share
        f = rng.uniform(self.fast_ms[0], self.fast_ms[1], shape)
        s = rng.uniform(self.slow_ms[0], self.slow_ms[1], shape)
        return np.where(fast, f, s)


def hedged_race(
    latencies_ms: np.ndarray, every_ms: float, attempts: int, deadline_ms: float
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised race of a check hedged with a copy every ``every_ms`` up to ``attempts``.

    ``latencies_ms`` has shape (n, >= attempts): each row the latencies its attempts would
    draw. Attempt j (0-based) starts at j·d if no earlier attempt has answered by then and
    j·d < deadline. Returns (answer time in ms, inf when none answered; attempts started).
    """
    n = latencies_ms.shape[0]
    answer = np.full(n, np.inf)
    started = np.zeros(n, dtype=np.int64)
    for j in range(attempts):
        start = j * every_ms
        if start >= deadline_ms:
            break
        go = answer > start
        started += go
        answer = np.where(go, np.minimum(answer, start + latencies_ms[:, j]), answer)
    return answer, started


def simulate_bimodal(
    dist: Bimodal,
    *,
    deadline_s: float,
    every_ms: Sequence[float],
    attempts: Sequence[int],
    requests: int = 1_000_000,
    seed: int | None = None,
) -> dict[str, Any]:
    """Share of checks answered within ``deadline_s`` and calls per check, per (d, k).

    Returns ``{dist, fast_share, fast_ms, slow_ms, deadline_s, requests, seed, grid: [{every_ms,
    attempts, in_time, in_time_ci95, calls_per_check, extra_calls_per_check, p50_ms, p99_ms,
    closed_form: {in_time, calls_per_check} or null}]}``; the closed form is given where
    its assumptions hold (d >= the fast path's end, slow path past the deadline).

    Raises:
        UserInputError: a non-positive deadline, delay, attempt count or request count.
    """
    if deadline_s <= 0 or requests < 1 or not every_ms or not attempts:
        raise UserInputError(
            "simulate: need --deadline-s > 0, --requests >= 1, --every-ms, --attempts"
        )
    if min(every_ms) <= 0 or min(attempts) < 1:
        raise UserInputError(
            f"simulate: --every-ms must be > 0 and --attempts >= 1; got {list(every_ms)}, "
            f"{list(attempts)}"
        )
    deadline_ms = deadline_s * 1000
    rng = np.random.default_rng(seed)
    kmax = max(attempts)
    grid = []
    lat = dist.draw(rng, (requests, kmax))
    for d in every_ms:
        for k in attempts:
            answer, started = hedged_race(lat, d, k, deadline_ms)
            ok = answer <= deadline_ms
            share = float(ok.mean())
            half = 1.96 * math.sqrt(max(share * (1 - share), 1e-12) / requests)
            capped = np.sort(np.minimum(answer, 1e12))
            calls = float(started.mean())
            grid.append(
                {
                    "every_ms": d,
                    "attempts": k,
                    "n": requests,
                    "in_time": round(share, 5),
                    "in_time_ci95": [
                        round(max(0, share - half), 5),
                        round(min(1, share + half), 5),
                    ],
                    "calls_per_check": round(calls, 4),
                    "extra_calls_per_check": round(calls - 1, 4),
                    "p50_ms": _finite(_quantile_ci(capped, 0.5)[0]),
                    "p99_ms": _finite(_quantile_ci(capped, 0.99)[0]),
                    "closed_form": _bimodal_closed_form(dist, d, k, deadline_ms),
                }
            )
    return {
        "dist": "bimodal",
        "fast_share": dist.fast_share,
        "fast_ms": list(dist.fast_ms),
        "slow_ms": list(dist.slow_ms),
        "deadline_s": deadline_s,
        "requests": requests,
        "seed": seed,
        "grid": grid,
    }


def _finite(v: float) -> float | None:
    return None if v >= 1e12 else round(v, 1)


def _bimodal_closed_form(
    dist: Bimodal, every_ms: float, attempts: int, deadline_ms: float
) -> dict[str, float] | None:
    if every_ms < dist.fast_ms[1] or dist.slow_ms[0] < deadline_ms:
        return None
    q = 1 - dist.fast_share
    # attempts that start before the deadline, and those that can also finish by it
    start_in_time = min(attempts, math.ceil(deadline_ms / every_ms))
    for j in range(start_in_time):
        if j * every_ms + dist.fast_ms[0] <= deadline_ms < j * every_ms + dist.fast_ms[1]:
            return None  # a fast answer of this attempt may or may not make it: no clean form
    finish_in_time = min(attempts, math.floor((deadline_ms - dist.fast_ms[1]) / every_ms) + 1)
    if finish_in_time < 1:
        return None
    return {
        "in_time": round(1 - q**finish_in_time, 5),
        "calls_per_check": round(sum(q**j for j in range(start_in_time)), 4),
    }


def plot_p99(result: dict[str, Any], path: str | Path) -> Path:
    """Plot p99 against k for the three modes of a :func:`simulate_lognormal` result (PNG).

    Needs matplotlib (``pip install 'chainrun[plot]'``).

    Raises:
        UserInputError: matplotlib is missing, or the file cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserInputError(
            "simulate --plot needs matplotlib: pip install 'chainrun[plot]'"
        ) from None
    ks = sorted(int(k) for k in result["by_k"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in MODES:
        ys = [result["by_k"][str(k)][mode]["p99_ms"] for k in ks]
        ax.plot(ks, ys, marker="o", label=mode)
    ax.set_xlabel("checks per request (k)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title(
        f"log-normal checks, median {result['median_ms']:g} ms, sigma {result['sigma']:g}; "
        f"hedged at q={result['hedge_quantile']:g}",
        fontsize=9,
    )
    ax.legend()
    ax.grid(alpha=0.3)
    out = Path(path)
    try:
        fig.savefig(out, dpi=120, bbox_inches="tight")
    except OSError as e:
        raise UserInputError(f"{out}: cannot write the plot ({e.strerror})") from None
    finally:
        plt.close(fig)
    return out
