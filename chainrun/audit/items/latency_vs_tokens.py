"""Audit item 5: latency vs tokens.

See :mod:`chainrun.audit.items` for what every item returns."""

from __future__ import annotations

import math
import statistics
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from chainrun.analysis.summary import cache_state, cached_text
from chainrun.audit.items.common import MIN_FIT, REPLAY_CMD, median_or_none, round_or_none
from chainrun.audit.plots import (
    FitPlot,
    FitSeries,
    HistPlot,
)
from chainrun.audit.report import Item, Table, Verdict, worst
from chainrun.audit.scope import Scope
from chainrun.log.rows import CallRow, winning_calls
from chainrun.statistics.intervals import (
    summarize,
)

TITLE_5 = "Before moving providers, pair latency with token counts"


def _theil_sen(xs: Sequence[float], ys: Sequence[float]) -> dict[str, Any] | None:
    """Theil–Sen fit of y (ms) on x (tokens) with the slope's 95% interval (scipy), or
    None when x takes fewer than two values."""
    if len(set(xs)) < 2:
        return None
    from scipy.stats import theilslopes

    with warnings.catch_warnings():
        # with many tied values scipy's variance term can go negative (sqrt of < 0):
        # the interval is then nan and reported as None below
        warnings.simplefilter("ignore", RuntimeWarning)
        res = theilslopes(ys, xs, alpha=0.95)
    lo, hi = float(res.low_slope), float(res.high_slope)
    return {
        "slope_ms_per_token": round(float(res.slope), 3),
        "slope_ci": [round(lo, 3), round(hi, 3)] if math.isfinite(lo + hi) else None,
        "intercept_ms": round(float(res.intercept), 1),
    }


#: a slope of time on output tokens says something only over calls whose token counts
#: differ: at least this many distinct counts ...
MIN_DISTINCT_TOKENS = 5
#: ... spread over at least this many tokens (2-3-token calls fit any slope)
MIN_TOKEN_SPAN = 10


def fit_problem(
    xs: Sequence[float], fit: Mapping[str, Any] | None, duration_p50_ms: float | None
) -> str | None:
    """Why a fit of duration (ms) on output tokens is no evidence (None: it is): too few
    distinct token counts, a span of too few tokens, an undefined slope interval, or a
    negative fixed cost larger than the median call (a line that describes no call)."""
    if fit is None:
        return "no fit"
    distinct = sorted(set(xs))
    lo, hi = (int(distinct[0]), int(distinct[-1])) if distinct else (0, 0)
    if len(distinct) < MIN_DISTINCT_TOKENS or hi - lo < MIN_TOKEN_SPAN:
        return (
            f"the calls' output tokens take {len(distinct)} distinct values over {lo}-{hi} "
            f"tokens: a slope needs {MIN_DISTINCT_TOKENS} values over {MIN_TOKEN_SPAN}+ tokens"
        )
    if fit["slope_ci"] is None:
        return "the slope's 95% interval is undefined (too many tied values)"
    b = fit["intercept_ms"]
    if duration_p50_ms is not None and b < 0 and -b > duration_p50_ms:
        return (
            f"the fit's fixed cost is {b:.0f} ms, below minus the median call "
            f"({duration_p50_ms:.0f} ms): a line that describes none of the calls"
        )
    return None


def _slope_text(fit: Mapping[str, Any] | None) -> str:
    if fit is None:
        return "no fit"
    ci = fit["slope_ci"]
    bounds = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else " [interval undefined]"
    return f"{fit['slope_ms_per_token']:.2f}{bounds}"


def _provider_diagnosis(
    step: str, a: str, b: str, ga: Mapping[str, Any], gb: Mapping[str, Any]
) -> str:
    """Why ``b`` (the slower by median duration) is slower than ``a``."""
    tok_a, tok_b = ga["output_tokens_p50"], gb["output_tokens_p50"]
    # a fit that is no evidence (fit_problem) cannot tell work from serving either
    fa = None if ga.get("fit_problem") else ga["fit"]
    fb = None if gb.get("fit_problem") else gb["fit"]
    head = (
        f"{step}: {b} is slower than {a} ({gb['duration_p50_ms']:.0f} vs "
        f"{ga['duration_p50_ms']:.0f} ms at the median, n = {gb['n']} and {ga['n']})"
    )
    if fa is None or fb is None or tok_a is None or tok_b is None:
        return (
            head + "; the token counts do not allow a fit for both, so work and serving "
            "cannot be told apart."
        )
    common = statistics.median([tok_a, tok_b])
    pred_a = fa["intercept_ms"] + fa["slope_ms_per_token"] * common
    pred_b = fb["intercept_ms"] + fb["slope_ms_per_token"] * common
    if tok_b > 1.2 * tok_a and pred_b <= 1.1 * pred_a:
        return head + (
            f": it generates more ({tok_b:.0f} vs {tok_a:.0f} output tokens at the "
            f"median) and at {common:.0f} tokens both fits predict about the same "
            "time, so the difference is work; moving provider would not remove it."
        )
    parts = []
    ttft_a, ttft_b = ga["ttft"]["p50_ms"], gb["ttft"]["p50_ms"]
    if ttft_a is not None and ttft_b is not None and ttft_b > 1.1 * ttft_a:
        parts.append(f"TTFT {ttft_b:.0f} vs {ttft_a:.0f} ms")
    if fb["slope_ms_per_token"] > 1.1 * fa["slope_ms_per_token"]:
        parts.append(
            f"{fb['slope_ms_per_token']:.1f} vs {fa['slope_ms_per_token']:.1f} ms per output token"
        )
    why = ", ".join(parts) if parts else "a higher fixed cost"
    return head + (
        f": at {common:.0f} tokens it takes {pred_b:.0f} vs {pred_a:.0f} ms "
        f"({why}), so it is served slower, not doing more work."
    )


def check_latency_tokens(scope: Scope) -> Item:
    """Item 5: per provider and step, duration fitted against output tokens (Theil–Sen),
    TTFT and time per output token apart; two providers of one step compared."""
    winners = [
        c
        for c in winning_calls(scope.done_calls).values()
        if c.error_type is None and not c.truncated
    ]
    groups: dict[str, dict[str, list[CallRow]]] = defaultdict(lambda: defaultdict(list))
    for c in winners:
        groups[c.step][c.provider or c.target or "?"].append(c)
    if not groups:
        return Item(
            5,
            TITLE_5,
            "not_enough_data",
            "The log holds no answered LLM call in scope to pair latency with tokens.",
            {},
            missing=[f"LLM calls: `{REPLAY_CMD}`"],
        )
    rows: list[list[Any]] = []
    notes: list[str] = []
    verdicts: list[Verdict] = []
    figs: dict[str, Any] = {}
    fit_panels: dict[str, dict[str, FitSeries]] = {}
    gap_hist: dict[str, list[float]] = {}
    for step, providers in groups.items():
        figs[step] = {}
        for prov, cs in providers.items():
            pairs = [
                (float(c.output_tokens), c.duration_ms)
                for c in cs
                if c.output_tokens is not None and c.duration_ms is not None
            ]
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            unknown = sum(c.output_tokens is None for c in cs)
            fit = _theil_sen(xs, ys) if len(pairs) >= MIN_FIT else None
            ttft = [c.ttft_ms for c in cs if c.ttft_ms is not None]
            tbt = [c.time_between_tokens_ms for c in cs if c.time_between_tokens_ms is not None]
            g: dict[str, Any] = {
                "n": len(cs),
                "n_paired": len(pairs),
                "output_tokens_unknown": unknown,
                "duration_p50_ms": round_or_none(median_or_none(ys)),
                "output_tokens_p50": round_or_none(median_or_none(xs)),
                "ttft": summarize(ttft),
                # the server's prompt cache decides TTFT: its share beside it
                "ttft_cached_share": cache_state(cs)["share"],
                "time_between_tokens_p50_ms": round_or_none(median_or_none(tbt)),
                "n_time_between_tokens": len(tbt),
                "fit": fit,
            }
            problem = fit_problem(xs, fit, g["duration_p50_ms"]) if fit is not None else None
            g["fit_problem"] = problem
            figs[step][prov] = g
            if len(cs) >= MIN_FIT and unknown * 2 > len(cs):
                verdicts.append("fail")
                notes.append(
                    f"{step} on {prov}: output tokens unknown for {unknown} of "
                    f"{len(cs)} calls: its latency cannot be paired with work."
                )
            elif len(pairs) < MIN_FIT:
                verdicts.append("not_enough_data")
                notes.append(
                    f"{step} on {prov}: {len(pairs)} calls with duration and tokens; "
                    f"a fit needs {MIN_FIT}."
                )
            elif problem is not None:
                verdicts.append("not_enough_data")
                notes.append(f"{step} on {prov}: no evidence from the fit: {problem}.")
            else:
                verdicts.append("pass")
            fit_panels.setdefault(step, {})[prov] = FitSeries(
                xs,
                ys,
                fit["slope_ms_per_token"] if fit else None,
                fit["intercept_ms"] if fit else None,
            )
            gaps = [x for c in cs for x in c.chunk_gaps_ms]
            if gaps:
                gap_hist[f"{step} · {prov}"] = gaps
            rows.append(
                [
                    step,
                    prov,
                    len(cs),
                    len(pairs),
                    unknown,
                    g["output_tokens_p50"],
                    g["duration_p50_ms"],
                    g["ttft"]["p50_ms"],
                    cached_text(cache_state(cs)),
                    g["time_between_tokens_p50_ms"],
                    _slope_text(fit),
                    fit["intercept_ms"] if fit else None,
                ]
            )
        fitted = {p: g for p, g in figs[step].items() if g["duration_p50_ms"] is not None}
        if len(fitted) >= 2:
            ordered = sorted(fitted, key=lambda p: fitted[p]["duration_p50_ms"])
            fast, slow = ordered[0], ordered[-1]
            text = _provider_diagnosis(step, fast, slow, fitted[fast], fitted[slow])
            figs[step]["_comparison"] = {"faster": fast, "slower": slow, "diagnosis": text}
            notes.append(text)
    verdict = worst(verdicts)
    compared = [n for n in notes if " is slower than " in n]
    if verdict == "pass":
        evidence = (
            f"Duration is fitted against output tokens for every step and provider "
            f"({len(rows)} fits, each on at least {MIN_FIT} calls with at least "
            f"{MIN_DISTINCT_TOKENS} distinct token counts over {MIN_TOKEN_SPAN}+ tokens)."
        )
    else:
        evidence = " ".join(n for n in notes if " is slower than " not in n)[:600]
    if compared:
        evidence += " " + compared[0]
    elif verdict != "not_enough_data":
        evidence += " Only one provider serves each step, so no two providers are compared."
    missing = (
        []
        if compared
        else [
            "a second provider for a step (a run with [steps.NAME] provider = OTHER) to compare "
            "providers on the same step"
        ]
    )
    table = Table(
        "Duration against output tokens (winning calls; Theil–Sen slope with its 95% interval)",
        [
            "step",
            "provider",
            "n",
            "n paired",
            "tokens unknown",
            "tokens p50",
            "duration p50 ms",
            "TTFT p50 ms",
            "prompt cached",
            "between tokens p50 ms",
            "ms per token [95%]",
            "intercept ms",
        ],
        rows,
    )
    plots: list[Any] = [FitPlot("Duration against output tokens, per provider", fit_panels)]
    if gap_hist:
        plots.append(
            HistPlot("Time between chunks per step", gap_hist, "ms between chunks", log_x=True)
        )
    return Item(5, TITLE_5, verdict, evidence, {"steps": figs}, notes, missing, [table], plots)
