"""Looking after every turn: the false-alarm rate of chainrun's confidence sequences
against a fixed-n 95% interval checked the same way, and the turns a real difference
takes to decide.

Simulated, no lab: ``--sequences`` A/A sequences of ``--turns`` paired turns each, looked
at after every turn, for three metrics compare watches:

- ``pass_rate``: paired pass/fail, both sides passing with probability ``--pass-p``;
- ``faster_share``: paired TTFTs from the same log-normal (the share B answers first);
- ``ungrounded_rate``: two unpaired sides, ungrounded with probability ``--ungrounded-p``.

For each, the share of sequences in which the confidence sequence
(:mod:`chainrun.statistics.sequential`, alpha 0.05) ever excludes "no difference" (at most
5% by its theory), with its 95% Wilson interval; and the same share for the fixed-n
interval (a normal 95% interval of the mean difference, or Wilson per side, checked at
every turn from the 10th). Then A/B sequences with a true difference (``--pass-p`` against
``--pass-p-b``; TTFT medians ``--ttft-ratio`` apart): the share decided within ``--turns``
and the median number of turns until decided.

Run: ``python benchmarks/sequential_aa.py [--sequences 1000] [--turns 500] [--json]``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import _common as c
import numpy as np

from chainrun.statistics.sequential import eb_bounds

Z95 = 1.959964


def _cs_crossed(x: np.ndarray, null: float) -> np.ndarray:
    _, lo, hi = eb_bounds(x)
    return (lo > null) | (hi < null)  # (k, n): excluded the null at that look


def _fixed_n_crossed(d: np.ndarray, min_n: int = 10) -> np.ndarray:
    """A normal 95% interval of the mean of ``d`` recomputed after every observation."""
    t = np.arange(1, d.shape[1] + 1)
    s, s2 = np.cumsum(d, axis=1), np.cumsum(d * d, axis=1)
    mean = s / t
    var = np.maximum(s2 - t * mean**2, 0) / np.maximum(t - 1, 1)
    se = np.sqrt(var / t)
    return (np.abs(mean) > Z95 * se) & (se > 0) & (t >= min_n)


def _wilson_diff_crossed(a: np.ndarray, b: np.ndarray, min_n: int = 10) -> np.ndarray:
    """Two Wilson 95% intervals (one per side) recomputed after every turn: crossed when
    they do not overlap (a common way a dashboard reads them)."""
    t = np.arange(1, a.shape[1] + 1)

    def bounds(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = np.cumsum(x, axis=1) / t
        den = 1 + Z95**2 / t
        centre = (p + Z95**2 / (2 * t)) / den
        half = Z95 * np.sqrt(p * (1 - p) / t + Z95**2 / (4 * t * t)) / den
        return centre - half, centre + half

    la, ha = bounds(a)
    lb, hb = bounds(b)
    return ((lb > ha) | (hb < la)) & (t >= min_n)


def _rate(crossed: np.ndarray) -> dict[str, Any]:
    ever = crossed.any(axis=1)
    k = int(ever.sum())
    return {"false_alarms": k, "sequences": len(ever), "rate": round(k / len(ever), 4),
            "ci95": c.wilson(k, len(ever))}  # fmt: skip


def _decided(crossed: np.ndarray) -> dict[str, Any]:
    ever = crossed.any(axis=1)
    first = np.where(ever, crossed.argmax(axis=1) + 1, -1)
    done = first[first > 0]
    return {"decided": int(ever.sum()), "sequences": len(ever),
            "share": round(float(ever.mean()), 4),
            "median_turns_until_decided": float(np.median(done)) if done.size else None,
            "p90_turns_until_decided": float(np.quantile(done, 0.9)) if done.size else None}


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    k, n = args.sequences, args.turns
    out: dict[str, Any] = {"aa": {}, "ab": {}}
    # paired pass rate
    a = (rng.random((k, n)) < args.pass_p).astype(float)
    b = (rng.random((k, n)) < args.pass_p).astype(float)
    out["aa"]["pass_rate"] = {"sequence": _rate(_cs_crossed((b - a + 1) / 2, 0.5)),
                              "fixed_n_peeking": _rate(_fixed_n_crossed(b - a))}  # fmt: skip
    # paired TTFT, the share B answers first
    ta = rng.lognormal(np.log(800), 0.5, (k, n))
    tb = rng.lognormal(np.log(800), 0.5, (k, n))
    faster = (tb < ta).astype(float)
    out["aa"]["faster_share"] = {"sequence": _rate(_cs_crossed(faster, 0.5)),
                                 "fixed_n_peeking": _rate(_fixed_n_crossed(faster - 0.5))}
    # unpaired ungrounded rate: each side's CS at alpha/2, a union bound
    ua = (rng.random((k, n)) < args.ungrounded_p).astype(float)
    ub = (rng.random((k, n)) < args.ungrounded_p).astype(float)
    _, la, ha = eb_bounds(ua, 0.025)
    _, lb, hb = eb_bounds(ub, 0.025)
    cs_u = (lb - ha > 0) | (hb - la < 0)
    out["aa"]["ungrounded_rate"] = {"sequence": _rate(cs_u),
                                    "fixed_n_peeking": _rate(_wilson_diff_crossed(ua, ub))}
    # A/B: a true difference
    bb = (rng.random((k, n)) < args.pass_p_b).astype(float)
    out["ab"]["pass_rate"] = {"p_a": args.pass_p, "p_b": args.pass_p_b,
                              **_decided(_cs_crossed((bb - a + 1) / 2, 0.5))}  # fmt: skip
    tb2 = rng.lognormal(np.log(800 * args.ttft_ratio), 0.5, (k, n))
    out["ab"]["faster_share"] = {"ttft_median_ratio_b_over_a": args.ttft_ratio,
                                 **_decided(_cs_crossed((tb2 < ta).astype(float), 0.5))}
    return out


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = ["A/A, looked at after every turn (false-alarm rate, 95% interval):"]
    for metric, v in res["aa"].items():
        s, f = v["sequence"], v["fixed_n_peeking"]
        lines.append(f"  {metric:16s} confidence sequence {s['rate']:.3f} {s['ci95']}   "
                     f"fixed-n interval {f['rate']:.3f} {f['ci95']}")  # fmt: skip
    lines.append("A/B, a true difference:")
    for metric, v in res["ab"].items():
        lines.append(f"  {metric:16s} decided in {v['share']:.3f} of sequences, median "
                     f"{v['median_turns_until_decided']} turns")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sequences", type=int, default=1000)
    p.add_argument("--turns", type=int, default=500)
    p.add_argument("--pass-p", type=float, default=0.8)
    p.add_argument("--pass-p-b", type=float, default=0.9)
    p.add_argument("--ungrounded-p", type=float, default=0.1)
    p.add_argument("--ttft-ratio", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=20261202)
    c.add_common_options(p)
    args = p.parse_args(argv)
    doc = c.new_document("sequential_aa", argv, {k: v for k, v in vars(args).items()
                                                 if k not in ("json", "out")})  # fmt: skip
    doc["results"] = simulate(args)
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
