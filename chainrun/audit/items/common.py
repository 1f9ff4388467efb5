"""What the audit's items share: outcome vocabularies, thresholds, rounding and text helpers."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from chainrun.statistics.intervals import (
    order_stat_indices,
)

#: attempts that ran to their end (their timings and tokens should all be known)
COMPLETED_OUTCOMES = ("not_fired", "primary", "duplicate", "shadow_finished", "rejected")
#: attempts whose latency the hedging engine's window records (chainrun.hedging.engine)
SETTLED_OUTCOMES = ("not_fired", "primary", "duplicate", "shadow_finished")
#: reasoning_effort values from least to most reasoning (OpenAI API reference, ``reasoning_effort``)
EFFORT_ORDER = ("none", "minimal", "low", "medium", "high", "xhigh")
#: item 4: why a due copy was not sent, as the audit says it
REASON_WORDS = {"budget_exhausted": "budget refused", "circuit_open": "breaker open",
                "loop_lag": "loop lagging", "rate_limited": "rate limited"}  # fmt: skip
#: item 4: a hedge whose copies win less often than this over MIN_FIRES fires fails
MIN_WIN_RATE = 0.05
MIN_FIRES = 30
#: item 5: fewest calls with both duration and output tokens to fit a line
MIN_FIT = 10
#: item 6: a recall@k loss from stopping early at or above this fails
MAX_RECALL_COST = 0.10
#: item 1: share of completed calls fully timed and counted under which the item fails
MIN_TIMED_SHARE = 0.9
#: turns shown in the waterfall
WATERFALL_TURNS = 4

REPLAY_CMD = "chainrun replay replays/commerce-12.jsonl"


def round_or_none(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def share_of(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def pct_text(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


def ms_text(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f} ms"


@cache
def needed_n(p: float, confidence: float = 0.95) -> int | None:
    """Fewest values whose order statistics bound the ``p``-th percentile on both sides
    (:func:`chainrun.statistics.intervals.order_stat_indices`): 36 for the p90, 72 for the
    p95, 368 for the p99 at 95%. None beyond 100,000."""
    n = 1
    while n <= 100_000:
        lo, hi = order_stat_indices(n, p, confidence)
        if lo is not None and hi is not None:
            return n
        n += 1 if n < 1000 else 100
    return None


def step_config(config: Mapping[str, Any] | None, step: str) -> dict[str, Any]:
    if not config:
        return {}
    return dict((config.get("steps") or {}).get(step) or {})
