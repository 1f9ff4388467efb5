"""Generic hedged requests: race an attempt against delayed copies, keep the first answer.

Knows nothing about LLMs or HTTP: an attempt is any ``async (AttemptInfo) -> T``.
Sources: Dean and Barroso, "The Tail at Scale" (CACM 56(2), 2013); Finagle's
``BackupRequestFilter``; gRPC's hedging policy (gRFC A6).

Modules: ``policy`` (what to do), ``engine`` (the race), ``window`` (latency percentiles
over answers and cut-short attempts), ``advisor`` (the delay re-derived at run time, and
the back-off when copies stop winning), ``budget`` (extra-load token bucket),
``breaker`` (circuit breakers per target), ``looplag`` (event-loop lag), ``outcome``
(what happened), ``stats`` (fire and win rates), ``errors`` (the engine's exceptions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainrun.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from chainrun.hedging.advisor import HedgeController
    from chainrun.hedging.breaker import BreakerRegistry, BreakerState, CircuitBreaker
    from chainrun.hedging.budget import CopyThrottler, HedgeBudget
    from chainrun.hedging.engine import Hedger, default_classify_error
    from chainrun.hedging.errors import (
        CircuitOpen,
        DeadlineExceeded,
        HedgingError,
        NoAcceptableAnswer,
    )
    from chainrun.hedging.looplag import LoopLagMonitor, get_loop_lag_monitor
    from chainrun.hedging.outcome import (
        AttemptInfo,
        AttemptOutcome,
        AttemptRecord,
        ErrorInfo,
        HedgeChange,
        HedgeOutcome,
        HedgeSetting,
    )
    from chainrun.hedging.policy import HedgePolicy
    from chainrun.hedging.stats import HedgeStats
    from chainrun.hedging.window import LatencyWindow, QuantileEstimate

#: public name -> its module, imported on first use (PEP 562): the run log's rows need
#: ``outcome``, not the engine, the window or the advisor
_EXPORTS = {
    "HedgeController": "chainrun.hedging.advisor",
    "BreakerRegistry": "chainrun.hedging.breaker",
    "BreakerState": "chainrun.hedging.breaker",
    "CircuitBreaker": "chainrun.hedging.breaker",
    "CopyThrottler": "chainrun.hedging.budget",
    "HedgeBudget": "chainrun.hedging.budget",
    "Hedger": "chainrun.hedging.engine",
    "default_classify_error": "chainrun.hedging.engine",
    "CircuitOpen": "chainrun.hedging.errors",
    "DeadlineExceeded": "chainrun.hedging.errors",
    "HedgingError": "chainrun.hedging.errors",
    "NoAcceptableAnswer": "chainrun.hedging.errors",
    "LoopLagMonitor": "chainrun.hedging.looplag",
    "get_loop_lag_monitor": "chainrun.hedging.looplag",
    "AttemptInfo": "chainrun.hedging.outcome",
    "AttemptOutcome": "chainrun.hedging.outcome",
    "AttemptRecord": "chainrun.hedging.outcome",
    "ErrorInfo": "chainrun.hedging.outcome",
    "HedgeChange": "chainrun.hedging.outcome",
    "HedgeOutcome": "chainrun.hedging.outcome",
    "HedgeSetting": "chainrun.hedging.outcome",
    "HedgePolicy": "chainrun.hedging.policy",
    "HedgeStats": "chainrun.hedging.stats",
    "LatencyWindow": "chainrun.hedging.window",
    "QuantileEstimate": "chainrun.hedging.window",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "AttemptInfo",
    "AttemptOutcome",
    "AttemptRecord",
    "BreakerRegistry",
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpen",
    "CopyThrottler",
    "DeadlineExceeded",
    "ErrorInfo",
    "HedgeBudget",
    "HedgeChange",
    "HedgeController",
    "HedgeOutcome",
    "HedgePolicy",
    "HedgeSetting",
    "HedgeStats",
    "Hedger",
    "HedgingError",
    "LatencyWindow",
    "LoopLagMonitor",
    "NoAcceptableAnswer",
    "QuantileEstimate",
    "default_classify_error",
    "get_loop_lag_monitor",
]
