"""Audit item 3: hedge delay vs p95.

See :mod:`chainrun.audit.items` for what every item returns."""

from __future__ import annotations

from typing import Any

from chainrun.audit.items.common import (
    REPLAY_CMD,
    SETTLED_OUTCOMES,
    median_or_none,
    ms_text,
    needed_n,
    round_or_none,
    step_config,
)
from chainrun.audit.plots import (
    CdfPlot,
    Plot,
)
from chainrun.audit.report import Item, Table, Verdict, worst
from chainrun.audit.rows import settle_ms
from chainrun.audit.scope import Scope
from chainrun.statistics.intervals import (
    percentile,
    quantile_ci,
)

TITLE_3 = "Hedging logged from day one, delay near the call's own p95"


def hedged_steps(scope: Scope) -> list[str]:
    names: dict[str, None] = {}
    for s in scope.steps:
        if s.hedge_delay_ms is not None or s.hedge_fired:
            names[s.step] = None
    for run in scope.runs:
        for name, sc in ((run.config or {}).get("steps") or {}).items():
            if sc.get("hedge"):
                names[name] = None
    return list(names)


def _configured_delay(scope: Scope, step: str) -> str | None:
    for run in reversed(scope.runs):
        hedge = step_config(run.config, step).get("hedge")
        if hedge:
            return hedge.get("delay") or (
                f"{hedge['delay_ms']:g} ms" if hedge.get("delay_ms") else None
            )
    return None


def check_hedge_delay(scope: Scope) -> Item:
    """Item 3: per hedged step, the delay in force next to the step's measured p95
    (with its order-statistic interval); attempts without an outcome fail."""
    steps = hedged_steps(scope)
    if not steps:
        return Item(
            3,
            TITLE_3,
            "not_enough_data",
            "No audited step is hedged, so there is no hedge delay to check.",
            {"hedged_steps": []},
            missing=[
                'a hedged run: add [steps.NAME.hedge] delay = "p95" and run '
                f"`{REPLAY_CMD} --config chainrun.toml` (or pass --run of a "
                "hedged run)"
            ],
        )
    rows: list[list[Any]] = []
    notes: list[str] = []
    verdicts: list[Verdict] = []
    figs: dict[str, Any] = {}
    cdf: dict[str, dict[str, list[float]]] = {}
    for name in steps:
        calls = [c for c in scope.calls if c.step == name]  # logging: every attempt
        no_outcome = sum(c.outcome is None for c in calls)
        settle = [
            ms
            for c in scope.done_calls
            if c.step == name and c.outcome in SETTLED_OUTCOMES and c.error_type is None
            and (ms := settle_ms(c)) is not None
        ]  # fmt: skip
        delays = [
            s.hedge_delay_ms
            for s in scope.done_steps
            if s.step == name and s.hedge_delay_ms is not None
        ]
        delay = median_or_none(delays)
        p95 = percentile(settle, 95) if settle else None
        ci = quantile_ci(settle, 95) if settle else None
        need = needed_n(95)
        v: Verdict
        if no_outcome:
            v = "fail"
            notes.append(
                f"{name}: {no_outcome} of {len(calls)} attempts have no outcome: the "
                "hedge is not logged, so fire and win rates cannot be trusted."
            )
        elif delay is None:
            v = "not_enough_data"
            notes.append(f"{name}: no execution had a hedge delay in force (still warming up).")
        elif ci is None:
            v = "not_enough_data"
            notes.append(
                f"{name}: p95 {ms_text(p95)} from n = {len(settle)} cannot be bounded; "
                f"an interval needs at least {need} settled calls."
            )
        elif not ci[0] <= delay <= ci[1]:
            v = "warn"
            notes.append(
                f"{name}: delay {delay:.0f} ms lies outside the p95's 95% interval "
                f"[{ci[0]:.0f}, {ci[1]:.0f}] ms (n = {len(settle)})."
            )
        else:
            v = "pass"
            notes.append(
                f"{name}: delay {delay:.0f} ms lies inside the p95's 95% interval "
                f"[{ci[0]:.0f}, {ci[1]:.0f}] ms (n = {len(settle)})."
            )
        verdicts.append(v)
        figs[name] = {
            "configured_delay": _configured_delay(scope, name),
            "delay_median_ms": round_or_none(delay),
            "n_armed": len(delays),
            "delay_min_ms": round_or_none(min(delays)) if delays else None,
            "delay_max_ms": round_or_none(max(delays)) if delays else None,
            "p95_ms": round_or_none(p95),
            "p95_ci": [round(x, 1) for x in ci] if ci else None,
            "n": len(settle),
            "n_needed_for_interval": need,
            "attempts_without_outcome": no_outcome,
            "verdict": v,
        }
        rows.append(
            [
                name,
                figs[name]["configured_delay"],
                round_or_none(delay),
                len(delays),
                round_or_none(p95),
                f"[{ci[0]:.0f}, {ci[1]:.0f}]" if ci else "not bounded",
                len(settle),
                no_outcome,
                v,
            ]
        )
        if settle:
            cdf[name] = {"settle latency": settle}
    verdict = worst(verdicts)
    evidence = " ".join(notes[:2]) + (
        f" ({len(notes) - 2} more in the notes.)" if len(notes) > 2 else ""
    )
    table = Table(
        "Hedge delay against the step's own p95 (time to settle: first token when "
        "streamed, whole answer otherwise)",
        [
            "step",
            "configured",
            "delay median ms",
            "n armed",
            "p95 ms",
            "p95 95% interval",
            "n",
            "attempts without outcome",
            "verdict",
        ],
        rows,
    )
    plots: list[Plot] = [CdfPlot("Time to settle per hedged step", cdf)] if cdf else []
    return Item(3, TITLE_3, verdict, evidence, {"steps": figs}, notes, [], [table], plots)
