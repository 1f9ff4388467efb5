"""Audit item 7: live vs replay.

See :mod:`chainrun.audit.items` for what every item returns."""

from __future__ import annotations

from typing import Any

from chainrun.analysis.summary import left_out
from chainrun.audit.items.common import (
    REPLAY_CMD,
    needed_n,
)
from chainrun.audit.plots import (
    CdfPlot,
)
from chainrun.audit.report import Item, Table, Verdict
from chainrun.audit.scope import Sample, Scope
from chainrun.statistics.intervals import (
    quantile_diff,
    summarize,
)

TITLE_7 = "Live percentiles next to replay numbers, with the size of each sample"


def _metric_values(sample: Sample) -> dict[str, list[float]]:
    """Latency per metric over the sample's completed turns (the one rule)."""
    out: dict[str, list[float]] = {
        "turn": [t.duration_ms for t in sample.done_turns if t.duration_ms is not None]
    }
    for s in sample.done_steps:
        if s.duration_ms is not None and s.status not in ("skipped", "cancelled"):
            out.setdefault(s.step, []).append(s.duration_ms)
    return out


def _not_completed(sample: Sample) -> str:
    """``"2 cancelled, 1 refused"`` (the turns left out of the percentiles), or ``""``."""
    return left_out(sample.completed.counts())


def check_live_vs_replay(scope: Scope) -> Item:
    """Item 7: per turn and step, each replay run's and the live turns' p50/p90/p99 with
    n and intervals side by side; every unbounded figure flagged with the n it needs;
    live slower than a replay beyond the intervals fails."""
    replays = [s for s in scope.samples if not s.is_live and s.turns]
    live = next((s for s in scope.samples if s.is_live and s.turns), None)
    if not replays and live is None:
        return Item(
            7,
            TITLE_7,
            "not_enough_data",
            "The log holds no replay run and no live turn.",
            {},
            missing=[
                f"a replay run: `{REPLAY_CMD}`",
                "live turns: run turns through "
                "the library API (Chain.stream_turn) or `chainrun run MESSAGE`",
            ],
        )
    sides = [*replays, *([live] if live else [])]
    values = {s.name: _metric_values(s) for s in sides}
    metrics = list(dict.fromkeys(m for v in values.values() for m in v))
    rows: list[list[Any]] = []
    notes: list[str] = []
    figs: dict[str, Any] = {}
    flags: list[dict[str, Any]] = []
    cdf: dict[str, dict[str, list[float]]] = {}
    for m in metrics:
        figs[m] = {}
        for side in sides:
            vs = values[side.name].get(m, [])
            if not vs:
                continue
            summ = summarize(vs)
            figs[m][side.name] = summ
            cells = []
            for p in (50, 90, 99):
                est, ci = summ[f"p{p}_ms"], summ[f"p{p}_ci"]
                if est is None:
                    cells.append("–")
                    continue
                if ci is None:
                    need = needed_n(p)
                    flags.append(
                        {"metric": m, "sample": side.name, "p": p, "n": len(vs), "n_needed": need}
                    )
                    cells.append(f"{est:.0f} (not bounded; needs n ≥ {need})")
                else:
                    cells.append(f"{est:.0f} [{ci[0]:.0f}, {ci[1]:.0f}]")
            left_out = _not_completed(side) if m == "turn" else ""
            rows.append([m, side.name, len(vs), *cells, left_out or "–"])
            if vs:
                cdf.setdefault(m, {})[side.name] = vs
    slower: list[dict[str, Any]] = []
    if live is not None:
        for rep in replays:
            for m in metrics:
                a, b = values[rep.name].get(m, []), values[live.name].get(m, [])
                for p in (50, 90):
                    d = quantile_diff(a, b, p)
                    if d.verdict == "worse" and d.ci is not None and d.estimate is not None:
                        slower.append(
                            {
                                "metric": m,
                                "replay": rep.name,
                                "p": p,
                                "diff_ms": round(d.estimate, 1),
                                "diff_ci": [round(x, 1) for x in d.ci],
                            }
                        )
    missing = []
    if live is None:
        missing.append(
            "live turns: run a few turns through the library API "
            "(Chain.from_config(...).stream_turn) or `chainrun run MESSAGE`"
        )
    if not replays:
        missing.append(f"a replay run to set against the live turns: `{REPLAY_CMD}`")
    for f in flags[:8]:
        notes.append(
            f"p{f['p']} of {f['metric']} in {f['sample']} comes from {f['n']} values: "
            f"it cannot be bounded; {f['n_needed']} would be needed."
        )
    if len(flags) > 8:
        notes.append(f"… and {len(flags) - 8} more unbounded figures (see the table).")
    for s in slower:
        notes.append(
            f"live {s['metric']} p{s['p']} is {s['diff_ms']:+.0f} ms slower than "
            f"{s['replay']} (interval [{s['diff_ci'][0]:.0f}, {s['diff_ci'][1]:.0f}])."
        )
    if slower:
        verdict: Verdict = "fail"
        evidence = (
            f"Live turns are slower than the replay beyond the intervals "
            f"({len(slower)} percentiles): the replay numbers understate what shoppers "
            "see."
        )
    elif flags or missing:
        verdict = "warn"
        n_turn = {s.name: len(values[s.name].get("turn", [])) for s in sides}
        left = {s.name: _not_completed(s) for s in sides}
        evidence = (
            "Samples: "
            + ", ".join(
                f"{k} n = {v} completed turns" + (f" ({left[k]} left out)" if left[k] else "")
                for k, v in n_turn.items()
            )
            + f". {len(flags)} quoted percentiles cannot be bounded by their sample"
            + (
                f" (the turn p90 needs n ≥ {needed_n(90)}, the p99 n ≥ {needed_n(99)})."
                if flags
                else "."
            )
            + (" " + missing[0].split(":")[0].capitalize() + " missing." if missing else "")
        )
    else:
        verdict = "pass"
        evidence = (
            "Every percentile of every sample is bounded by its interval and live "
            "turns are not slower than the replay beyond them."
        )
    if verdict != "warn" and any(_not_completed(s) for s in sides):
        evidence += (
            " Left out of the percentiles: "
            + "; ".join(f"{s.name}: {_not_completed(s)}" for s in sides if _not_completed(s))
            + " turns."
        )
    table = Table(
        "p50 / p90 / p99 in ms with 95% order-statistic intervals, over completed turns",
        ["metric", "sample", "n", "p50 [95%]", "p90 [95%]", "p99 [95%]", "turns left out"],
        rows,
    )
    turns = {s.name: s.completed.counts() for s in sides}
    return Item(
        7,
        TITLE_7,
        verdict,
        evidence,
        {"metrics": figs, "turns": turns, "unbounded": flags, "live_slower": slower},
        notes,
        missing,
        [table],
        [CdfPlot("Latency CDF per step, replay and live", cdf)] if cdf else [],
    )
