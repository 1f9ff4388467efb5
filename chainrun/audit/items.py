"""The seven checks of the slow-chain checklist, each judged from the run log.

Each ``check_*`` takes a :class:`~chainrun.audit.scope.Scope` and returns an
:class:`~chainrun.audit.report.Item` with a verdict (``pass | warn | fail |
not_enough_data``), evidence in plain words, the figures behind it (every statistic
with its n) and, where data is missing, what is missing and the command that would
produce it. Nothing passes by default. Percentiles and their intervals are the
order-statistic ones of :mod:`chainrun.stats`; times are in ms. Every latency figure
follows the one rule of every summary (:func:`chainrun.report.completed_turns`): it is
over the steps and calls of completed turns only (``Sample.done_*``), with the
cancelled, refused and errored turns counted beside it; the logging checks (item 1)
read every row.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from chainrun.audit.plots import (
    Bar,
    CdfPlot,
    FitPlot,
    FitSeries,
    HistPlot,
    Plot,
    RatePlot,
    RatePoint,
    WaterfallPlot,
)
from chainrun.audit.report import Item, Table, Verdict, worst
from chainrun.audit.rows import Call, EvalResult, Step, Turn, results_as_rows, settle_ms
from chainrun.audit.scope import Sample, Scope
from chainrun.config import MODEL_STEP_KINDS
from chainrun.evals.scoring import case_outcomes, skipped_summary
from chainrun.hedging.stats import UNSENT_REASONS, copies_sent_per_call, unsent_reason
from chainrun.hedging.stats import fire_rate as hedge_fire_rate
from chainrun.hedging.stats import win_rate as hedge_win_rate
from chainrun.report import SENT_OUTCOMES, WINNER_OUTCOMES, completed_turns, left_out
from chainrun.stats import (
    order_stat_indices,
    paired_compare,
    percentile,
    quantile_ci,
    quantile_diff,
    summarize,
)

#: attempts that ran to their end (their timings and tokens should all be known)
COMPLETED_OUTCOMES = ("not_fired", "primary", "duplicate", "shadow_finished", "rejected")
#: attempts whose latency the hedging engine's window records (chainrun.hedging.engine)
SETTLED_OUTCOMES = ("not_fired", "primary", "duplicate", "shadow_finished")
#: reasoning_effort values from least to most reasoning (FIELD.md)
EFFORT_ORDER = ("none", "minimal", "low", "medium", "high", "xhigh")
#: item 4: why a due copy was not sent, as the audit says it
REASON_WORDS = {"budget_exhausted": "budget refused", "circuit_open": "breaker open",
                "loop_lag": "loop lagging"}  # fmt: skip
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


def _r(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _share(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f} ms"


@cache
def needed_n(p: float, confidence: float = 0.95) -> int | None:
    """Fewest values whose order statistics bound the ``p``-th percentile on both sides
    (:func:`chainrun.stats.order_stat_indices`): 36 for the p90, 72 for the p95, 368 for
    the p99 at 95%. None beyond 100,000."""
    n = 1
    while n <= 100_000:
        lo, hi = order_stat_indices(n, p, confidence)
        if lo is not None and hi is not None:
            return n
        n += 1 if n < 1000 else 100
    return None


def _winners(calls: Iterable[Call]) -> dict[tuple[int | None, str], Call]:
    """The attempt each step used, by (turn id, step): a winning outcome, the last
    without an error (as chainrun.evals.scoring.winning_calls)."""
    best: dict[tuple[int | None, str], Call] = {}
    for c in calls:
        if c.outcome not in WINNER_OUTCOMES:
            continue
        key = (c.turn_id, c.step)
        prev = best.get(key)
        if prev is None or (c.error_type is None, c.attempt) >= (
            prev.error_type is None,
            prev.attempt,
        ):
            best[key] = c
    return best


def _step_config(config: Mapping[str, Any] | None, step: str) -> dict[str, Any]:
    if not config:
        return {}
    return dict((config.get("steps") or {}).get(step) or {})


# ---------------------------------------------------------------- 1. every step timed

TITLE_1 = "Every step timed and its generated tokens logged before anything was changed"


def _waterfall(samples: Sequence[Sample]) -> WaterfallPlot | None:
    turns = [(s, t) for s in samples for t in s.turns if t.duration_ms is not None]
    slowest = sorted(turns, key=lambda st: st[1].duration_ms or 0.0, reverse=True)
    slowest = slowest[:WATERFALL_TURNS]
    if not slowest:
        return None
    out: dict[str, list[Bar]] = {}
    for sample, turn in slowest:
        steps = [s for s in sample.steps if s.turn_id == turn.id and s.status != "skipped"]
        calls = [c for c in sample.calls if c.turn_id == turn.id]
        bars: list[Bar] = []
        for s in steps:
            start = s.started_offset_ms or 0.0
            bars.append(Bar(s.step, start, start + (s.duration_ms or 0.0)))
            attempts = [c for c in calls if c.step == s.step]
            hedged = len(attempts) > 1
            for c in sorted(attempts, key=lambda c: c.attempt):
                c_start = start + (c.started_offset_ms or 0.0)
                ttft = c_start + c.ttft_ms if c.ttft_ms is not None else None
                if not hedged:
                    bars[-1].ttft = ttft
                    continue
                role = (
                    "winner"
                    if c.outcome in WINNER_OUTCOMES
                    else "refused"
                    if c.outcome in ("budget_exhausted", "suppressed")
                    else "loser"
                )
                end = c_start + (c.duration_ms or 0.0)
                bars.append(Bar(f"  attempt {c.attempt} ({c.outcome})", c_start, end, ttft, role))
        out[f"turn {turn.id} ({turn.duration_ms:.0f} ms)"] = bars
    return WaterfallPlot(f"The {len(out)} slowest turns, step by step", out)


def check_timed(scope: Scope) -> Item:
    """Item 1: share of LLM calls with TTFT, duration and output tokens; steps and
    providers with missing or unknown counts; calls whose tokens came back without usage."""
    calls = [
        c
        for c in scope.calls + [c for e in scope.evals for c in e.calls]
        if c.outcome in SENT_OUTCOMES or c.outcome is None
    ]
    # a stream cut short (deadline, server) never delivers its usage: not a logging gap
    cut = [
        c for c in calls if c.outcome in COMPLETED_OUTCOMES and c.error_type is None and c.truncated
    ]
    done = [
        c
        for c in calls
        if c.outcome in COMPLETED_OUTCOMES and c.error_type is None and not c.truncated
    ]
    steps = scope.steps + [s for e in scope.evals for s in e.steps]
    untimed_steps = Counter(
        s.step for s in steps if s.duration_ms is None and s.status not in ("skipped", "cancelled")
    )
    if not done:
        return Item(
            1,
            TITLE_1,
            "not_enough_data",
            "The log holds no completed LLM call in scope, so nothing shows whether steps "
            "are timed and their tokens logged.",
            figures={"n_calls": 0},
            missing=[f"LLM calls: run `{REPLAY_CMD}` (or pass --run RUN of an existing run)"],
        )
    groups: dict[tuple[str, str], list[Call]] = defaultdict(list)
    for c in done:
        groups[(c.step, c.provider or c.target or "?")].append(c)
    rows, per_group = [], []
    for (step, provider), cs in sorted(groups.items()):
        g = {
            "step": step,
            "provider": provider,
            "n": len(cs),
            "missing_ttft": sum(c.ttft_ms is None for c in cs),
            "missing_duration": sum(c.duration_ms is None for c in cs),
            "unknown_output_tokens": sum(c.output_tokens is None for c in cs),
            "text_without_usage": sum(
                c.output_tokens is None and bool(c.output or c.n_chunks) for c in cs
            ),
            "zero_tokens_with_text": sum(c.output_tokens == 0 and bool(c.output) for c in cs),
        }
        per_group.append(g)
        rows.append(
            [
                step,
                provider,
                g["n"],
                g["missing_ttft"],
                g["missing_duration"],
                g["unknown_output_tokens"],
                g["text_without_usage"],
                g["zero_tokens_with_text"],
            ]
        )
    full = sum(
        c.ttft_ms is not None and c.duration_ms is not None and c.output_tokens is not None
        for c in done
    )
    share = full / len(done)
    gaps = [g for g in per_group if any(g[k] for k in g if k not in ("step", "provider", "n"))]
    never = [g for g in per_group if g["unknown_output_tokens"] == g["n"]]
    figures = {
        "n_calls": len(done),
        "n_fully_logged": full,
        "share_fully_logged": round(share, 4),
        "n_attempts_excluded": len(calls) - len(done),
        "n_streams_cut_short": len(cut),
        "by_step_provider": per_group,
        "untimed_steps": dict(untimed_steps),
    }
    notes = [
        f"{g['step']} on {g['provider']}: {g['unknown_output_tokens']} of {g['n']} calls "
        f"with unknown output tokens ({g['text_without_usage']} returned text but no usage), "
        f"{g['missing_ttft']} without TTFT, {g['missing_duration']} without duration"
        for g in gaps
    ]
    notes += [
        f"step {name}: {n} executions without a duration" for name, n in untimed_steps.items()
    ]
    notes += [
        f"{g['step']} on {g['provider']}: {g['zero_tokens_with_text']} calls returned "
        "text but logged 0 output tokens (unknown must be NULL, not 0)"
        for g in per_group
        if g["zero_tokens_with_text"]
    ]
    verdict: Verdict
    if share < MIN_TIMED_SHARE or never:
        verdict = "fail"
    elif gaps or untimed_steps:
        verdict = "warn"
    else:
        verdict = "pass"
    evidence = (
        f"{full} of {len(done)} completed LLM calls ({_pct(share)}) have TTFT, duration and "
        f"output tokens; {len(calls) - len(done)} attempts that were cancelled, failed or "
        f"cut short ({len(cut)} streams ended without a finish reason) are not counted."
    )
    if never:
        evidence += (
            " "
            + ", ".join(f"{g['step']} on {g['provider']}" for g in never)
            + (" never logged output tokens: latency there cannot be paired with work.")
        )
    elif gaps:
        evidence += f" {len(gaps)} step/provider pairs have missing or unknown counts."
    missing = []
    if any(g["text_without_usage"] for g in per_group):
        missing.append(
            "usage on streamed answers: the provider must send it (stream_options "
            "include_usage); calls that returned text without usage are listed in the notes"
        )
    wf = _waterfall(scope.samples)
    return Item(
        1,
        TITLE_1,
        verdict,
        evidence,
        figures,
        notes,
        missing,
        tables=[
            Table(
                "Completed LLM calls per step and provider",
                [
                    "step",
                    "provider",
                    "n",
                    "no TTFT",
                    "no duration",
                    "tokens unknown",
                    "text without usage",
                    "0 tokens with text",
                ],
                rows,
            ),
            _slowest_table(scope.samples),
        ],
        plots=[wf] if wf else [],
    )


def _clip(text: str | None, n: int = 140) -> str | None:
    if text is None:
        return None
    return text if len(text) <= n else text[: n - 1] + "…"


def _slowest_table(samples: Sequence[Sample]) -> Table:
    turns = sorted(
        ((s, t) for s in samples for t in s.turns if t.duration_ms is not None),
        key=lambda st: st[1].duration_ms or 0.0,
        reverse=True,
    )[:WATERFALL_TURNS]
    return Table(
        "The slowest turns (what the shopper asked and was answered)",
        ["sample", "turn", "ms", "status", "message", "answer"],
        [
            [s.name, t.id, _r(t.duration_ms), t.status, _clip(t.input), _clip(t.output)]
            for s, t in turns
        ],
    )


# ---------------------------------------------------------------- 2. reasoning effort

TITLE_2 = (
    "Reasoning effort is a per-step setting, turned down where the eval set says "
    "the step does not need it"
)


def _rank(effort: str | None) -> int | None:
    return EFFORT_ORDER.index(effort) if effort in EFFORT_ORDER else None


def _diff_paths(a: Any, b: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[tuple[str, ...]] = []
        for k in sorted(set(a) | set(b)):
            out += _diff_paths(a.get(k), b.get(k), (*path, str(k)))
        return out
    return [] if a == b else [path]


def effort_pairs(scope: Scope) -> dict[str, list[tuple[int, int]]]:
    """Eval runs of the same eval set (``runs.source``) whose config snapshots differ
    only in one step's ``reasoning_effort``: step → [(run id A, run id B)], B the run with
    less reasoning (or the newer, when the efforts cannot be ordered)."""
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    evals = [e.run for e in scope.evals if e.run.config]
    for i, a in enumerate(evals):
        for b in evals[i + 1 :]:
            if a.source != b.source:
                continue
            paths = _diff_paths(a.config, b.config)
            if len(paths) != 1 or len(paths[0]) != 3:
                continue
            top, step, key = paths[0]
            if top != "steps" or key != "reasoning_effort":
                continue
            ra = _rank(_step_config(a.config, step).get("reasoning_effort"))
            rb = _rank(_step_config(b.config, step).get("reasoning_effort"))
            pair = (b.id, a.id) if ra is not None and rb is not None and rb > ra else (a.id, b.id)
            out[step].append(pair)
    return out


def _eval_sample(scope: Scope, run_id: int) -> tuple[list[Step], list[Call], list[EvalResult]]:
    for e in scope.evals:
        if e.run.id == run_id:
            done = completed_turns(e.turns)  # latency of completed turns only
            results = [r for r in scope.results if r.run_id == run_id]
            return done.of(e.steps), done.of(e.calls), results
    return [], [], []


def _effort_comparison(scope: Scope, step: str, a_id: int, b_id: int) -> dict[str, Any]:
    sa, ca, ra = _eval_sample(scope, a_id)
    sb, cb, rb = _eval_sample(scope, b_id)
    rows_a, rows_b = results_as_rows(ra), results_as_rows(rb)
    paired = paired_compare(case_outcomes(rows_a), case_outcomes(rows_b))
    ms_a = [s.duration_ms for s in sa if s.step == step and s.duration_ms is not None]
    ms_b = [s.duration_ms for s in sb if s.step == step and s.duration_ms is not None]
    d = quantile_diff(ms_a, ms_b, 50)
    tok_a = [
        c.reasoning_tokens
        for c in _winners(ca).values()
        if c.step == step and c.reasoning_tokens is not None
    ]
    tok_b = [
        c.reasoning_tokens
        for c in _winners(cb).values()
        if c.step == step and c.reasoning_tokens is not None
    ]
    effort = {}
    for rid in (a_id, b_id):
        run = next(e.run for e in scope.evals if e.run.id == rid)
        effort[rid] = _step_config(run.config, step).get("reasoning_effort")
    return {
        "a": {"run_id": a_id, "reasoning_effort": effort[a_id]},
        "b": {"run_id": b_id, "reasoning_effort": effort[b_id]},
        "pass_rate": {
            **paired.as_dict(),
            "test": "exact McNemar (two-sided binomial on discordant cases)",
            # verdicts without a pass/fail (llm-rubric, no grader): in no pass rate
            "skipped": {"a": skipped_summary(rows_a), "b": skipped_summary(rows_b)},
        },
        "step_p50_ms": {
            "a": summarize(ms_a)["p50_ms"],
            "b": summarize(ms_b)["p50_ms"],
            "n_a": len(ms_a),
            "n_b": len(ms_b),
            "diff_b_minus_a": _r(d.estimate),
            "diff_ci": [round(x, 1) for x in d.ci] if d.ci else None,
        },
        "reasoning_tokens_mean": {
            "a": _r(statistics.fmean(tok_a)) if tok_a else None,
            "b": _r(statistics.fmean(tok_b)) if tok_b else None,
            "n_a": len(tok_a),
            "n_b": len(tok_b),
        },
    }


def _effort_in_use(scope: Scope, step: str) -> str | None:
    """The step's effort in the newest audited run that has the step (else the newest
    eval run that has it); None when unset (the model's default)."""
    for runs in (scope.runs, [e.run for e in scope.evals]):
        for run in sorted(runs, key=lambda r: r.id, reverse=True):
            sc = _step_config(run.config, step)
            if sc:
                return sc.get("reasoning_effort")
    return next((c.reasoning_effort for c in reversed(scope.calls) if c.step == step), None)


def check_reasoning(scope: Scope) -> Item:
    """Item 2: per step the effort in use; eval runs differing only in that step's
    effort, with the paired pass-rate test and the latency and reasoning-token change."""
    config = scope.current_config()
    llm_steps = [
        name
        for name, sc in ((config or {}).get("steps") or {}).items()
        if sc.get("kind", "llm") in MODEL_STEP_KINDS
    ]
    calls = scope.calls
    for c in calls:
        if c.step not in llm_steps:
            llm_steps.append(c.step)
    pairs = effort_pairs(scope)
    eval_sets = sorted({e.run.source or "?" for e in scope.evals})
    eval_set = eval_sets[-1] if eval_sets else "evals/regression.jsonl"
    rows: list[list[Any]] = []
    notes: list[str] = []
    missing: list[str] = []
    verdicts: list[Verdict] = []
    per_step: dict[str, Any] = {}
    for step in llm_steps:
        effort = _effort_in_use(scope, step)
        tokens = [
            c.reasoning_tokens for c in calls if c.step == step and c.reasoning_tokens is not None
        ]
        reasons: bool | None
        if (effort is not None and effort != "none") or any(t > 0 for t in tokens):
            reasons = True
        elif effort == "none" or (tokens and all(t == 0 for t in tokens)):
            reasons = False
        else:
            reasons = None
        entry: dict[str, Any] = {
            "reasoning_effort": effort,
            "reasons": reasons,
            "reasoning_tokens_known": len(tokens),
            "reasoning_tokens_mean": _r(statistics.fmean(tokens)) if tokens else None,
        }
        step_pairs = pairs.get(step, [])
        if step_pairs:
            a_id, b_id = step_pairs[-1]
            cmp = _effort_comparison(scope, step, a_id, b_id)
            entry["comparison"] = cmp
            pr = cmp["pass_rate"]
            lower = cmp["b"]["reasoning_effort"]
            worse = pr["verdict"] == "worse"
            saved = cmp["step_p50_ms"]["diff_b_minus_a"]
            text = (
                f"{step}: eval runs {a_id} (effort {cmp['a']['reasoning_effort']}) and {b_id} "
                f"(effort {lower}) differ only in this step's effort: cases passed "
                f"{pr['a']['passed']}/{pr['n_pairs']} vs {pr['b']['passed']}/{pr['n_pairs']} "
                f"(McNemar p = {pr['p_value']:.3g})"
            )
            if saved is not None:
                text += f", step p50 {saved:+.0f} ms"
            for side, rid in (("a", a_id), ("b", b_id)):
                for kind, sk in pr["skipped"][side].items():
                    text += f" ({sk['n']} {kind} verdicts of run {rid} skipped: {sk['reason']})"
            if worse:
                notes.append(
                    text + f": the step needs its effort; keep {cmp['a']['reasoning_effort']}."
                )
                verdicts.append("pass")
            elif effort == lower:
                notes.append(text + f": the step already runs at {lower}.")
                verdicts.append("pass")
            else:
                notes.append(text + f": no loss measured at {lower}; turn {step} down to {lower}.")
                verdicts.append("warn")
            rows.append(
                [
                    step,
                    effort,
                    len(tokens),
                    entry["reasoning_tokens_mean"],
                    f"run {a_id} vs {b_id}",
                    f"{pr['a']['passed']} → {pr['b']['passed']} of {pr['n_pairs']}",
                    _r(pr["p_value"], 4),
                    saved,
                ]
            )
        else:
            if reasons:
                notes.append(
                    f"{step} runs with reasoning (effort {effort}) and has never been "
                    "evaluated without it."
                )
                missing.append(
                    f"an eval run with only steps.{step}.reasoning_effort lowered: "
                    f"`chainrun eval {eval_set} --config LOWER.toml` (a copy of the current "
                    f'config with [steps.{step}] reasoning_effort = "none"), next to one '
                    "with the current config"
                )
                verdicts.append("warn")
            elif reasons is False:
                verdicts.append("pass")
            rows.append(
                [
                    step,
                    effort,
                    len(tokens),
                    entry["reasoning_tokens_mean"],
                    "no pair",
                    "–",
                    None,
                    None,
                ]
            )
        per_step[step] = entry
    figures = {
        "steps": per_step,
        "eval_runs": [e.run.id for e in scope.evals],
        "pairs": {k: [list(p) for p in v] for k, v in pairs.items()},
    }
    table = Table(
        "Reasoning effort per step",
        [
            "step",
            "effort in use",
            "n reasoning counts",
            "mean reasoning tokens",
            "eval pair",
            "cases passed (A → B)",
            "McNemar p",
            "step p50 B − A ms",
        ],
        rows,
    )
    if not llm_steps or (not verdicts and not pairs):
        if not scope.evals:
            missing.insert(
                0,
                f"eval runs: `chainrun eval {eval_set}` twice, the second "
                "with one step's reasoning_effort lowered",
            )
        missing.append(
            "reasoning token counts (usage.completion_tokens_details.reasoning_tokens) "
            "or an explicit reasoning_effort per step"
        )
        return Item(
            2,
            TITLE_2,
            "not_enough_data",
            "No step is known to reason or not (no effort set, no reasoning token "
            "counts) and no two eval runs differ only in one step's effort.",
            figures,
            notes,
            missing,
            [table],
        )
    verdict = worst(verdicts, empty="pass")
    n_pairs = sum(len(v) for v in pairs.values())
    if verdict == "warn":
        evidence = (
            "A step reasons more than the eval set shows it needs, or was never evaluated "
            "with less: "
            + "; ".join(n for n in notes if "never been evaluated" in n or "turn " in n)
        )
    else:
        evidence = (
            f"{len(llm_steps)} LLM steps checked; {n_pairs} pair(s) of eval runs differ "
            "only in one step's reasoning effort, and no step reasons where the eval set "
            "says it need not."
        )
    return Item(2, TITLE_2, verdict, evidence, figures, notes, missing, [table])


# ---------------------------------------------------------------- 3. hedge delay vs p95

TITLE_3 = "Hedging logged from day one, delay near the call's own p95"


def _hedged_steps(scope: Scope) -> list[str]:
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
        hedge = _step_config(run.config, step).get("hedge")
        if hedge:
            return hedge.get("delay") or (
                f"{hedge['delay_ms']:g} ms" if hedge.get("delay_ms") else None
            )
    return None


def check_hedge_delay(scope: Scope) -> Item:
    """Item 3: per hedged step, the delay in force next to the step's measured p95
    (with its order-statistic interval); attempts without an outcome fail."""
    steps = _hedged_steps(scope)
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
        delay = _median(delays)
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
                f"{name}: p95 {_ms(p95)} from n = {len(settle)} cannot be bounded; "
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
            "delay_median_ms": _r(delay),
            "n_armed": len(delays),
            "delay_min_ms": _r(min(delays)) if delays else None,
            "delay_max_ms": _r(max(delays)) if delays else None,
            "p95_ms": _r(p95),
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
                _r(delay),
                len(delays),
                _r(p95),
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


# ---------------------------------------------------------------- 4. win rate

TITLE_4 = "Win rate rechecked after every serving-path change"

WN_EXPLANATION = (
    "A call's time is W + N: W the work the request carries (mostly generated tokens, the "
    "same for both copies) and N serving noise, drawn per copy. The primary answers at "
    "W + N1 and a copy sent at d at d + W + N2, so the copy wins only when N1 − N2 > d "
    '(Dean and Barroso, "The Tail at Scale", 2013): W cancels out.'
)


def _period(sample: Sample, step: Step, turns: Mapping[int | None, Turn]) -> str:
    if not sample.is_live:
        return f"run {step.run_id}"
    t = turns.get(step.turn_id)
    return ((t.started_at if t else None) or "")[:10] or "unknown day"


def _serving_path(config: Mapping[str, Any] | None, step: str) -> str:
    sc = _step_config(config, step)
    providers = (config or {}).get("providers") or {}
    targets = [sc.get("provider"), *((sc.get("hedge") or {}).get("targets") or [])]
    urls = [str((providers.get(t) or {}).get("base_url") or t) for t in targets if t]
    return f"{sc.get('model')} @ {', '.join(dict.fromkeys(urls))}"


def check_win_rate(scope: Scope) -> Item:
    """Item 4: per hedged step fire rate, win rate, time saved per win (shadow losers),
    over time; the W + N diagnosis; fails a win rate under 5% over at least 30 fires."""
    names = _hedged_steps(scope)
    if not names:
        return Item(
            4,
            TITLE_4,
            "not_enough_data",
            "No audited step is hedged, so there is no win rate to check.",
            {"hedged_steps": []},
            missing=[
                "a hedged run (see item 3) with enough turns for 30 fires: "
                "about 600 turns at a p95 delay"
            ],
        )
    headlines: list[str] = []
    rows: list[list[Any]] = []
    notes: list[str] = []
    verdicts: list[Verdict] = []
    figs: dict[str, Any] = {}
    missing: list[str] = []
    series: dict[str, list[RatePoint]] = {}
    for name in names:
        armed: list[tuple[Sample, Step]] = [
            (sm, s)
            for sm in scope.samples
            for s in sm.done_steps
            if s.step == name and s.hedge_delay_ms is not None and s.status != "skipped"
        ]
        fired = [(sm, s) for sm, s in armed if s.hedge_fired]
        won = [(sm, s) for sm, s in fired if s.hedge_won]
        saved = [s.time_saved_ms for _, s in won if s.time_saved_ms is not None]
        copy_rows = [c for c in scope.done_calls if c.step == name and c.attempt > 1]
        sent_turns = Counter(c.turn_id for c in copy_rows if c.outcome in SENT_OUTCOMES)
        copies = sum(sent_turns.values())
        # a due copy refused or held back never ran: its fire cannot win (not a W + N loss)
        unsent = dict.fromkeys(UNSENT_REASONS, 0)
        for c in copy_rows:
            if (reason := unsent_reason(c.outcome, c.error_type)) is not None:
                unsent[reason] += 1
        fired_unsent = sum(1 for _, s in fired if not sent_turns[s.turn_id])
        n_turns = len({s.turn_id for s in scope.done_steps if s.step == name})
        # the definitions of chainrun.hedging.stats (fires per armed call, wins per fire)
        fire_rate = _rounded(hedge_fire_rate(len(fired), len(armed)))
        win_rate = _rounded(hedge_win_rate(len(won), len(fired)))
        # W + N: do fires land on long answers (work) or on slow servers (noise)?
        winners = _winners(scope.done_calls)
        tokens_all = [
            winners[(s.turn_id, name)].output_tokens
            for _, s in armed
            if (s.turn_id, name) in winners
        ]
        tok_all = [float(t) for t in tokens_all if t is not None]
        tok_fired = [
            float(t)
            for t in (
                winners[(s.turn_id, name)].output_tokens
                for _, s in fired
                if (s.turn_id, name) in winners
            )
            if t is not None
        ]
        med_all = _median(tok_all)
        above = sum(t > med_all for t in tok_fired) if med_all is not None else 0
        share_long = _share(above, len(tok_fired))
        diagnosis = None
        if share_long is not None and len(tok_fired) >= 5:
            diagnosis = "work" if share_long >= 0.75 else "noise" if share_long <= 0.6 else "mixed"
        # over time: per run (replays) or per day (live)
        turns_by_id = {t.id: t for sm in scope.samples for t in sm.turns}
        periods: dict[str, list[Step]] = defaultdict(list)
        for sm, s in armed:
            periods[_period(sm, s, turns_by_id)].append(s)
        points = []
        for label, ss in periods.items():
            f = [s for s in ss if s.hedge_fired]
            w = [s for s in f if s.hedge_won]
            points.append(
                RatePoint(
                    label,
                    len(ss),
                    _rounded(hedge_fire_rate(len(f), len(ss))),
                    len(f),
                    _rounded(hedge_win_rate(len(w), len(f))),
                )
            )
        series[name] = points
        # serving path changes between audited runs
        paths: dict[str, list[int]] = defaultdict(list)
        for run in sorted(scope.runs, key=lambda r: r.id):
            if _step_config(run.config, name):
                paths[_serving_path(run.config, name)].append(run.id)
        latest_path_runs = set(list(paths.values())[-1]) if paths else set()
        fires_since = sum(1 for _, s in fired if s.run_id in latest_path_runs)
        extra_per_1000 = _r(copies / n_turns * 1000, 0) if n_turns else None
        v: Verdict
        unsent_text = ", ".join(f"{REASON_WORDS[k]} {n}" for k, n in unsent.items() if n)
        if (
            len(fired) >= MIN_FIRES
            and win_rate is not None
            and win_rate < MIN_WIN_RATE
            and fired_unsent * 2 >= len(fired)
        ):
            v = "fail"
            head = (
                f"{name}: copies won {len(won)} of {len(fired)} fires ({_pct(win_rate)}, under "
                f"{MIN_WIN_RATE:.0%}), but {fired_unsent} of those fires sent no copy "
                f"({unsent_text}): the copies never ran, so the win rate says nothing of "
                "hedging itself."
            )
            headlines.append(head)
            notes.append(
                f"{head} Make the copy target reachable (an open breaker means its calls "
                "failed) or the load budget larger, then re-measure; the fire rate counts "
                "the hedge timer going off, copies sent per call what went out."
            )
        elif len(fired) >= MIN_FIRES and win_rate is not None and win_rate < MIN_WIN_RATE:
            v = "fail"
            cause = (
                f" The fired calls generated {statistics.median(tok_fired):.0f} tokens at the "
                f"median against {med_all:.0f} for the step ({_pct(share_long)} of fires "
                "above the step's median): the delay catches long answers (work, which "
                "both copies carry), not slow servers (noise)."
                if diagnosis == "work" and med_all is not None
                else ""
            )
            head = (
                f"{name}: copies won {len(won)} of {len(fired)} fires ({_pct(win_rate)}, under "
                f"{MIN_WIN_RATE:.0%}) and cost {extra_per_1000:.0f} extra calls per 1,000 turns."
            )
            headlines.append(
                head + (cause.split(":")[0].replace(" The fired", " Fired") + "." if cause else "")
            )
            notes.append(
                f"{head} {WN_EXPLANATION}{cause} Raise the delay, hedge fewer steps, or switch "
                "hedging off for this step and re-measure."
            )
        elif len(fired) < MIN_FIRES:
            v = "not_enough_data"
            more = math.ceil((MIN_FIRES - len(fired)) / fire_rate) if fire_rate else None
            notes.append(
                f"{name}: {len(fired)} fires over {len(armed)} armed calls; a win rate "
                f"needs at least {MIN_FIRES} fires"
                + (f" (about {more} more armed calls at this fire rate)." if more else ".")
            )
            missing.append(f"{name}: {MIN_FIRES - len(fired)} more hedge fires")
        elif len(paths) > 1 and fires_since < MIN_FIRES:
            v = "warn"
            notes.append(
                f"{name}: the serving path changed (now {list(paths)[-1]}) and only "
                f"{fires_since} fires were logged since: the win rate "
                f"({_pct(win_rate)}) is not rechecked."
            )
        else:
            v = "pass"
            notes.append(
                f"{name}: copies won {len(won)} of {len(fired)} fires "
                f"({_pct(win_rate)}), saving {_ms(_median(saved))} per measured win "
                f"(median, n = {len(saved)})."
            )
        if len(headlines) < len(notes):
            headlines.append(notes[-1])
        verdicts.append(v)
        figs[name] = {
            "n_armed": len(armed),
            "n_fired": len(fired),
            "n_won": len(won),
            "fire_rate": fire_rate,
            "win_rate": win_rate,
            "time_saved_per_win_ms": {
                "median": _r(_median(saved)),
                "mean": _r(statistics.fmean(saved)) if saved else None,
                "n": len(saved),
            },
            "copies_sent": copies,
            "copies_sent_per_call": _rounded(copies_sent_per_call(copies, len(armed))),
            "n_fired_no_copy_sent": fired_unsent,
            "unsent": unsent,
            "n_turns": n_turns,
            "extra_calls_per_1000_turns": extra_per_1000,
            "output_tokens": {
                "median_all": _r(med_all),
                "n_all": len(tok_all),
                "median_fired": _r(_median(tok_fired)),
                "n_fired": len(tok_fired),
                "share_fired_above_median": share_long,
            },
            "diagnosis": diagnosis,
            "over_time": [vars(p) for p in points],
            "serving_paths": {k: v for k, v in paths.items()},
            "verdict": v,
        }
        rows.append(
            [
                name,
                len(armed),
                _pct(fire_rate),
                f"{len(fired)} ({fired_unsent} sent no copy)" if fired_unsent else len(fired),
                _pct(win_rate),
                f"{_ms(_median(saved))} (n={len(saved)})",
                extra_per_1000,
                f"{_median(tok_fired) or 0:.0f} vs {med_all or 0:.0f}",
                diagnosis or "–",
                v,
            ]
        )
    verdict = worst(verdicts)
    evidence = " ".join(headlines[:3]) + (
        f" ({len(headlines) - 3} more steps in the notes.)" if len(headlines) > 3 else ""
    )
    table = Table(
        "Hedging per step (fire rate per armed call, win rate per fire)",
        [
            "step",
            "n armed",
            "fire rate",
            "n fired",
            "win rate",
            "saved per win",
            "extra calls / 1,000 turns",
            "tokens fired vs median",
            "W + N diagnosis",
            "verdict",
        ],
        rows,
    )
    return Item(
        4,
        TITLE_4,
        verdict,
        evidence,
        {"steps": figs, "explanation": WN_EXPLANATION},
        notes,
        missing,
        [table],
        [RatePlot("Hedge fire and win rate over time", series)],
    )


# ---------------------------------------------------------------- 5. latency vs tokens

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
    fa, fb = ga["fit"], gb["fit"]
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
        c for c in _winners(scope.done_calls).values() if c.error_type is None and not c.truncated
    ]
    groups: dict[str, dict[str, list[Call]]] = defaultdict(lambda: defaultdict(list))
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
            tbt = [statistics.fmean(c.chunk_gaps_ms) for c in cs if c.chunk_gaps_ms]
            g: dict[str, Any] = {
                "n": len(cs),
                "n_paired": len(pairs),
                "output_tokens_unknown": unknown,
                "duration_p50_ms": _r(_median(ys)),
                "output_tokens_p50": _r(_median(xs)),
                "ttft": summarize(ttft),
                "time_between_tokens_p50_ms": _r(_median(tbt)),
                "n_time_between_tokens": len(tbt),
                "fit": fit,
            }
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
            f"({len(rows)} fits, each on at least {MIN_FIT} calls)."
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


# ---------------------------------------------------------------- 6. retrieval

TITLE_6 = (
    "Retrieval stops when it has enough, with the search order and the threshold covered by tests"
)


def _retrieval_settings(config: Mapping[str, Any] | None, step: str) -> dict[str, Any]:
    from chainrun.retrieval.settings import RetrievalSettings

    given = _step_config(config, step).get("retrieval") or {}
    try:
        return RetrievalSettings.model_validate(given).model_dump()
    except ValueError:
        return RetrievalSettings().model_dump()


def _simulated_early(detail: Mapping[str, Any], min_results: int, k: int) -> list[str]:
    """The ids the stage would have returned had it stopped at ``min_results`` (from the
    logged per-search ids of a turn where every search ran)."""
    found: list[str] = []
    for search in detail.get("searches") or []:
        for i in search.get("ids") or []:
            if i not in found:
                found.append(i)
        if len(found) >= min_results:
            break
    return found[:k]


def _recall(retrieved: Sequence[str], expected: Sequence[str], k: int) -> float:
    # the R-capped recall@k of chainrun.retrieval.evaluate.recall_at_k
    from chainrun.retrieval.evaluate import recall_at_k

    return recall_at_k(list(retrieved), list(expected), k)


def check_retrieval(scope: Scope) -> Item:
    """Item 6: early-exit rate, which search answered, per-search latency; eval cases
    that would notice a change of order or ``min_results``; recall cost of stopping early
    on labelled queries when the log holds turns where every search ran."""
    retr = [
        s
        for s in scope.done_steps
        if s.kind == "retrieve" and s.status != "skipped" and s.detail is not None
    ]
    if not retr:
        return Item(
            6,
            TITLE_6,
            "not_enough_data",
            "No retrieve step with logged searches in scope.",
            {},
            missing=[f"a run whose chain has a retrieve step: `{REPLAY_CMD}`"],
        )
    name = retr[0].step
    settings = _retrieval_settings(scope.current_config(), name)
    stopped = Counter(
        str(s.detail.get("stopped_after") or "every search ran")
        for s in retr
        if s.detail is not None
    )
    early = sum(n for k, n in stopped.items() if k != "every search ran")
    per_search: dict[str, list[float]] = defaultdict(list)
    for s in retr:
        for search in (s.detail or {}).get("searches") or []:
            if search.get("ms") is not None:
                per_search[str(search.get("name"))].append(float(search["ms"]))
    # coverage by the eval set: catalog-ids verdicts on turns whose retrieval stopped early
    eval_steps = {
        (s.turn_id): s
        for e in scope.evals
        for s in e.steps
        if s.kind == "retrieve" and s.detail is not None
    }
    covered: dict[str, str] = {}
    for r in scope.results:
        st = eval_steps.get(r.turn_id)
        if r.type == "catalog-ids" and st is not None and st.detail:
            stop = st.detail.get("stopped_after")
            if stop:
                covered[r.case_id] = str(stop)
    threshold_covered = bool(covered)
    order_covered = len(set(covered.values())) >= 2
    # recall cost of stopping early, from turns where every search ran
    k, min_results = int(settings["k"]), int(settings["min_results"])
    turns = {t.id: t for t in scope.turns + [t for e in scope.evals for t in e.turns]}
    costs: list[float] = []
    for s in retr + list(eval_steps.values()):
        d = s.detail or {}
        t = turns.get(s.turn_id)
        if t is None or d.get("stopped_after") or len(d.get("searches") or []) < 2:
            continue
        expected = scope.queries.get(t.input.strip().lower())
        if not expected:
            continue
        full = [str(x.get("id")) for x in d.get("results") or []][:k]
        costs.append(
            _recall(full, expected, k) - _recall(_simulated_early(d, min_results, k), expected, k)
        )
    cost = statistics.fmean(costs) if costs else None
    figures = {
        "step": name,
        "n": len(retr),
        "early_exit_rate": _share(early, len(retr)),
        "n_stopped_early": early,
        "stopped_after": dict(stopped),
        "settings": {
            "searches": settings["searches"],
            "min_results": min_results,
            "k": k,
            "early_exit": settings["early_exit"],
        },
        "search_ms": {n: summarize(v) for n, v in per_search.items()},
        "eval_cases_covering_early_exit": covered,
        "threshold_covered": threshold_covered,
        "order_covered": order_covered,
        "recall_cost": {"mean": _r(cost, 4), "n": len(costs), "k": k},
    }
    notes: list[str] = []
    missing: list[str] = []
    verdicts: list[Verdict] = []
    if cost is not None and cost >= MAX_RECALL_COST:
        verdicts.append("fail")
        notes.append(
            f"Stopping at {min_results} results loses {cost:.2f} recall@{k} on "
            f"{len(costs)} labelled queries: raise min_results or reorder."
        )
    if not early:
        verdicts.append("warn")
        notes.append(
            f"The stage never stopped early in {len(retr)} executions "
            f"(early_exit = {settings['early_exit']}): every search ran every time."
        )
    if not threshold_covered:
        verdicts.append("warn")
        missing.append(
            "an eval case with a catalog-ids assertion whose retrieval stops early "
            "(`chainrun eval evals/regression.jsonl`): without it a change of "
            "min_results passes the tests unnoticed"
        )
    elif not order_covered:
        verdicts.append("warn")
        missing.append(
            "eval cases with catalog-ids assertions that stop at different searches: "
            f"all covered cases stop after {next(iter(covered.values()))}, so a "
            "change of the search order goes unnoticed"
        )
    if cost is None:
        missing.append(
            "recall cost of stopping early: a run with [steps.retrieve.retrieval] "
            "early_exit = false over the labelled queries "
            "(evals/retrieval_queries.jsonl), or benchmarks/retrieval_early_exit.py"
        )
    verdict = worst(verdicts, empty="pass")
    evidence = (
        f"The {name} step stopped early in {early} of {len(retr)} executions "
        f"({_pct(_share(early, len(retr)))}), after: "
        + ", ".join(f"{k2} {n}" for k2, n in stopped.most_common())
        + ". "
        + (
            f"{len(covered)} eval case(s) with catalog-ids assertions stop early"
            + (" at different searches." if order_covered else ".")
            if covered
            else "No eval case checks the products of a turn that stops early."
        )
    )
    if cost is not None:
        evidence += f" Recall@{k} cost of stopping early: {cost:.3f} (n = {len(costs)})."
    rows = [
        [
            n,
            *(summarize(v)[key] for key in ("n", "p50_ms", "p90_ms")),
            sum(
                1
                for s in retr
                for x in (s.detail or {}).get("searches") or []
                if x.get("name") == n and x.get("error")
            ),
        ]
        for n, v in per_search.items()
    ]
    tables = [
        Table(
            "Searches of the retrieve stage (ms)",
            ["search", "n", "p50 ms", "p90 ms", "errors"],
            rows,
        ),
        Table(
            "Where the stage stopped",
            ["stopped after", "n"],
            [[k2, n] for k2, n in stopped.most_common()],
        ),
    ]
    return Item(6, TITLE_6, verdict, evidence, figures, notes, missing, tables)


# ---------------------------------------------------------------- 7. live vs replay

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


CHECKS: tuple[Callable[[Scope], Item], ...] = (
    check_timed,
    check_reasoning,
    check_hedge_delay,
    check_win_rate,
    check_latency_tokens,
    check_retrieval,
    check_live_vs_replay,
)
