"""Audit item 2: reasoning effort.

See :mod:`chainrun.audit.items` for what every item returns."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from chainrun.analysis.summary import completed_turns
from chainrun.audit.items.common import EFFORT_ORDER, round_or_none, step_config
from chainrun.audit.report import Item, Table, Verdict, worst
from chainrun.audit.scope import Scope
from chainrun.config import steps_calling_models
from chainrun.evals.scoring import case_outcomes, skipped_summary
from chainrun.log.rows import CallRow, EvalResultRow, StepRow, winning_calls
from chainrun.statistics.intervals import (
    paired_compare,
    quantile_diff,
    summarize,
    wilson_interval,
)

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
            ra = _rank(step_config(a.config, step).get("reasoning_effort"))
            rb = _rank(step_config(b.config, step).get("reasoning_effort"))
            pair = (b.id, a.id) if ra is not None and rb is not None and rb > ra else (a.id, b.id)
            out[step].append(pair)
    return out


def _eval_sample(
    scope: Scope, run_id: int
) -> tuple[list[StepRow], list[CallRow], list[EvalResultRow]]:
    for e in scope.evals:
        if e.run.id == run_id:
            done = completed_turns(e.turns)  # latency of completed turns only
            results = [r for r in scope.results if r.run_id == run_id]
            return done.of(e.steps), done.of(e.calls), results
    return [], [], []


def _effort_comparison(scope: Scope, step: str, a_id: int, b_id: int) -> dict[str, Any]:
    sa, ca, ra = _eval_sample(scope, a_id)
    sb, cb, rb = _eval_sample(scope, b_id)
    paired = paired_compare(case_outcomes(ra), case_outcomes(rb))
    ms_a = [s.duration_ms for s in sa if s.step == step and s.duration_ms is not None]
    ms_b = [s.duration_ms for s in sb if s.step == step and s.duration_ms is not None]
    d = quantile_diff(ms_a, ms_b, 50)
    tok_a = [
        c.reasoning_tokens
        for c in winning_calls(ca).values()
        if c.step == step and c.reasoning_tokens is not None
    ]
    tok_b = [
        c.reasoning_tokens
        for c in winning_calls(cb).values()
        if c.step == step and c.reasoning_tokens is not None
    ]
    effort = {}
    for rid in (a_id, b_id):
        run = next(e.run for e in scope.evals if e.run.id == rid)
        effort[rid] = step_config(run.config, step).get("reasoning_effort")
    return {
        "a": {"run_id": a_id, "reasoning_effort": effort[a_id]},
        "b": {"run_id": b_id, "reasoning_effort": effort[b_id]},
        "pass_rate": {
            **paired.as_dict(),
            "test": "exact McNemar (two-sided binomial on discordant cases)",
            # verdicts without a pass/fail (llm-rubric, no grader): in no pass rate
            "skipped": {"a": skipped_summary(ra), "b": skipped_summary(rb)},
        },
        "step_p50_ms": {
            "a": summarize(ms_a)["p50_ms"],
            "b": summarize(ms_b)["p50_ms"],
            "n_a": len(ms_a),
            "n_b": len(ms_b),
            "diff_b_minus_a": round_or_none(d.estimate),
            "diff_ci": [round(x, 1) for x in d.ci] if d.ci else None,
        },
        "reasoning_tokens_mean": {
            "a": round_or_none(statistics.fmean(tok_a)) if tok_a else None,
            "b": round_or_none(statistics.fmean(tok_b)) if tok_b else None,
            "n_a": len(tok_a),
            "n_b": len(tok_b),
        },
    }


def _effort_in_use(scope: Scope, step: str) -> str | None:
    """The step's effort in the newest audited run that has the step (else the newest
    eval run that has it); None when unset (the model's default)."""
    for runs in (scope.runs, [e.run for e in scope.evals]):
        for run in sorted(runs, key=lambda r: r.id, reverse=True):
            sc = step_config(run.config, step)
            if sc:
                return sc.get("reasoning_effort")
    return next((c.reasoning_effort for c in reversed(scope.calls) if c.step == step), None)


def label_accuracy(results: list[EvalResultRow]) -> dict[int, dict[str, Any]]:
    """Per eval run, the share of its turns whose classify label was the expected one:
    its ``equals`` assertions on ``label`` (skipped verdicts left out), with n and a 95%
    Wilson interval (:func:`chainrun.statistics.intervals.wilson_interval`)."""
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        if r.type == "equals" and r.step == "label" and r.passed is not None:
            counts[r.run_id or 0][0] += int(r.passed)
            counts[r.run_id or 0][1] += 1
    out = {}
    for run_id, (k, n) in sorted(counts.items()):
        ci = wilson_interval(k, n)
        out[run_id] = {"correct": k, "n": n, "accuracy": round(k / n, 4),
                       "ci95": [round(ci[0], 4), round(ci[1], 4)] if ci else None}  # fmt: skip
    return out


def check_reasoning(scope: Scope) -> Item:
    """Item 2: per step the effort in use; eval runs differing only in that step's
    effort, with the paired pass-rate test and the latency and reasoning-token change."""
    config = scope.current_config()
    stored = (config or {}).get("steps") or {}
    model_steps = steps_calling_models(stored)
    llm_steps = [name for name in stored if name in model_steps]
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
            "reasoning_tokens_mean": round_or_none(statistics.fmean(tokens)) if tokens else None,
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
                    round_or_none(pr["p_value"], 4),
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
    accuracy = label_accuracy(scope.results)
    for run_id, acc in accuracy.items():
        ci = acc["ci95"]
        shown = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        notes.append(
            f"label accuracy of eval run {run_id} (its cases' expected labels): "
            f"{acc['correct']}/{acc['n']} = {acc['accuracy']:.3f}{shown} (95% Wilson)"
        )
    figures = {
        "steps": per_step,
        "eval_runs": [e.run.id for e in scope.evals],
        "pairs": {k: [list(p) for p in v] for k, v in pairs.items()},
        "label_accuracy": {str(k): v for k, v in accuracy.items()},
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
    if verdict == "pass" and n_pairs == 0:
        # no step reasons, but nothing compared an effort against another either: a pass
        # on zero pairs would be no evidence at all
        missing.append(
            f"two eval runs differing only in one step's reasoning_effort: `chainrun eval "
            f"{eval_set}` with the current config and with a copy that changes one step's "
            "reasoning_effort"
        )
        return Item(
            2,
            TITLE_2,
            "not_enough_data",
            f"{len(llm_steps)} LLM steps checked and none is seen to reason, but 0 pairs of "
            "eval runs differ only in one step's reasoning effort: nothing measured what "
            "effort does to quality.",
            figures,
            notes,
            missing,
            [table],
        )
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
