"""Scoring logged turns against eval cases, and the ``eval_results`` table.

The eval runner (kind ``eval``) logs one turn per case and repeat with
``request_id = eval_request_id(case.id, repeat)`` (``"<case id>#<repeat>"``);
:func:`score_run` then checks every turn against its case's assertions, stores one row
per verdict in ``eval_results`` and returns pass rates per assertion type and per
step, each with n and a Wilson interval. Turns without a request id are matched to
the case with the same message (repeats numbered in log order).

A case *passes* in a repeat when all its assertions pass, and in a run when it passes
in a strict majority of its repeats (one repeat: that repeat). The flip rate is the
fraction of repeated cases (and, alongside, of repeated assertions) whose pass/fail
differs across repeats.

A *skipped* verdict (``llm-rubric`` without a usable grader) is stored too, with
``passed`` NULL and the reason in ``detail``: it counts in no pass rate and no flip,
and is reported per type with its reason (``skipped``).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from chainrun.errors import UserInputError
from chainrun.evals.assertions import Grade, GraderConfig, TurnView, Verdict, evaluate
from chainrun.evals.cases import EvalCase
from chainrun.log.migrations import utc_now
from chainrun.log.rows import (
    CallRow,
    EvalResultRow,
    StepRow,
    ToolCallRow,
    TurnRow,
    winning_calls,
)
from chainrun.log.store import Store
from chainrun.retrieval.products import logged_products
from chainrun.statistics.intervals import pass_rate

#: by_step key for assertions without a step (the final answer / the whole turn).
TURN_KEY = "turn"


def eval_request_id(case_id: str, repeat: int) -> str:
    """The ``turns.request_id`` the eval runner gives repeat ``repeat`` of a case."""
    return f"{case_id}#{repeat}"


def parse_request_id(request_id: str) -> tuple[str, int]:
    """``(case_id, repeat)`` from a request id of :func:`eval_request_id` (no ``#``: repeat 0)."""
    case_id, sep, rep = request_id.rpartition("#")
    if sep and rep.isdigit():
        return case_id, int(rep)
    return request_id, 0


def turn_view(
    turn_row: TurnRow,
    step_rows: Iterable[StepRow],
    call_rows: Iterable[CallRow],
    catalog_ids: Collection[str] | None = None,
    tool_rows: Iterable[ToolCallRow] = (),
) -> TurnView:
    """What assertions see of one logged turn (rows of ``turns``, ``steps``, ``calls``
    and ``tool_calls``; rows with no turn id yet count as this turn's)."""
    turn_id = turn_row.id
    steps = [s for s in step_rows if turn_id is None or s.turn_id in (None, turn_id)]
    calls = [c for c in call_rows if turn_id is None or c.turn_id in (None, turn_id)]
    outputs: dict[str, str | None] = {}
    step_ms: dict[str, float | None] = {}
    grounding = None
    facts: str | None = None
    lead: str | None = None
    shown: tuple[dict[str, Any], ...] | None = None
    for s in steps:
        outputs[s.step] = s.output
        if isinstance((s.detail or {}).get("grounding"), dict):
            grounding = (s.detail or {})["grounding"]
        rendered = (s.detail or {}).get("facts")
        if isinstance(rendered, dict) and isinstance(rendered.get("text"), str):
            facts = rendered["text"]
        if isinstance(rendered, dict) and isinstance(rendered.get("lead"), str):
            lead = rendered["lead"] or None
        products = logged_products(s.updates)
        if products is not None:
            shown = tuple(p.as_json() for p in products)
        skipped = s.status in ("skipped", "cancelled")
        step_ms[s.step] = None if skipped else s.duration_ms
    tokens = {step: c.output_tokens for (_, step), c in winning_calls(calls).items()}
    return TurnView(
        message=turn_row.input or "",
        answer=turn_row.output,
        label=turn_row.label,
        outputs=outputs,
        step_ms=step_ms,
        turn_ms=turn_row.duration_ms,
        output_tokens=tokens,
        catalog_ids=frozenset(catalog_ids) if catalog_ids is not None else None,
        grounding=grounding,
        tool_calls=tuple(t for t in tool_rows if turn_id is None or t.turn_id in (None, turn_id)),
        prose=prose_of(turn_row.output, facts),
        lead=lead,
        shown_products=shown,
    )


def prose_of(answer: str | None, facts: str | None) -> str | None:
    """The model's part of ``answer``: the answer without the ``facts`` chainrun rendered
    after the model's text (None: ``answer`` is None; the whole answer when no facts were
    rendered or the answer no longer ends with them)."""
    if answer is None or not facts:
        return answer
    at = answer.rfind(facts)
    return answer[:at].rstrip() if at >= 0 else answer


async def score_turn(
    turn_row: TurnRow,
    step_rows: Iterable[StepRow],
    call_rows: Iterable[CallRow],
    case: EvalCase,
    grade: Grade | None = None,
    *,
    grader: GraderConfig | None = None,
    catalog_ids: Collection[str] | None = None,
    tool_rows: Iterable[ToolCallRow] = (),
) -> list[Verdict]:
    """Check one logged turn against ``case``'s assertions, in the case's order.

    One verdict per assertion. ``llm-rubric`` verdicts are skipped (``passed`` None,
    the reason in ``detail``) when ``grade`` is None or its reply is not understood; the
    verdicts they give carry ``grader`` (default :class:`GraderConfig`), which must be
    the configuration ``grade`` was built from. Raises whatever ``grade`` raises.
    """
    view = turn_view(turn_row, step_rows, call_rows, catalog_ids, tool_rows)
    return [
        await evaluate(assertion, view, grade, grader or GraderConfig())
        for assertion in case.asserts
    ]


def _match_turns(
    turns: Sequence[TurnRow], cases: Sequence[EvalCase]
) -> tuple[list[tuple[TurnRow, EvalCase, int]], int]:
    by_id = {c.id: c for c in cases}
    by_message: dict[str, list[EvalCase]] = defaultdict(list)
    for c in cases:
        by_message[c.message].append(c)
    seen: Counter[str] = Counter()
    matched = []
    unmatched = 0
    for t in turns:
        rid = t.request_id
        case: EvalCase | None = None
        if rid:
            case_id, repeat = parse_request_id(str(rid))
            case = by_id.get(case_id)
        else:
            candidates = by_message.get(t.input or "", [])
            if len(candidates) == 1:
                case = candidates[0]
                repeat = seen[case.id]
        if case is None:
            unmatched += 1
            continue
        seen[case.id] += 1
        matched.append((t, case, repeat))
    return matched, unmatched


def match_run(
    store: Store, run_id: int, cases: Sequence[EvalCase]
) -> tuple[list[TurnRow], list[tuple[TurnRow, EvalCase, int]], int]:
    """The run's turns, the (turn, case, repeat) matches and how many turns matched none.

    Raises:
        UserInputError: no such run, or no turn of the run matches any case.
    """
    store.get_run(run_id)
    turns = store.turns(run_id)
    matched, unmatched = _match_turns(turns, cases)
    if not matched:
        raise UserInputError(
            f"run {run_id}: none of its {len(turns)} turns matches a case (a turn matches by "
            "request id '<case id>#<repeat>' or by the case's message); is it the right "
            "run for this eval file?"
        )
    return turns, matched, unmatched


async def score_run(
    store: Store,
    run_id: int,
    cases: Sequence[EvalCase],
    grade: Grade | None = None,
    *,
    grader: GraderConfig | None = None,
    catalog_ids: Collection[str] | None = None,
) -> dict[str, Any]:
    """Score every turn of a run, replace the run's rows in ``eval_results``, summarise.

    Returns :func:`summarize_results` of the stored rows (``skipped`` among them) plus
    ``run_id``, ``n_turns`` and ``unmatched_turns`` (turns no case matched).

    Raises:
        UserInputError: no such run, or no turn of the run matches any case (nothing
            is written then: the run's earlier verdicts stay).
    """
    turns, matched, unmatched = match_run(store, run_id, cases)
    steps_by_turn: dict[int | None, list[StepRow]] = defaultdict(list)
    for s in store.steps(run_id):
        steps_by_turn[s.turn_id].append(s)
    calls_by_turn: dict[int | None, list[CallRow]] = defaultdict(list)
    for c in store.calls(run_id):
        calls_by_turn[c.turn_id].append(c)
    tools_by_turn: dict[int | None, list[ToolCallRow]] = defaultdict(list)
    for t in store.tool_calls(run_id):
        tools_by_turn[t.turn_id].append(t)
    config = grader or GraderConfig()
    rows: list[EvalResultRow] = []
    now = utc_now()
    for turn, case, repeat in matched:
        verdicts = await score_turn(
            turn, steps_by_turn[turn.id], calls_by_turn[turn.id], case, grade,
            grader=config, catalog_ids=catalog_ids, tool_rows=tools_by_turn[turn.id],
        )  # fmt: skip
        for v in verdicts:
            rows.append(
                EvalResultRow(
                    run_id=run_id, turn_id=turn.id, case_id=case.id, repeat=repeat,
                    type=v.type, step=v.step, passed=v.passed, detail=v.detail,
                    grader=json.dumps(v.grader, sort_keys=True) if v.grader else None,
                    scored_at=now,
                )
            )
    store.replace_eval_results(run_id, rows)
    summary = summarize_results(rows)
    return {
        "run_id": run_id,
        "n_turns": len(turns),
        "unmatched_turns": unmatched,
        **summary,
    }


def load_results(store: Store, run_ids: Iterable[int]) -> list[EvalResultRow]:
    """The ``eval_results`` rows of some runs, in log order (empty when none were scored)."""
    return store.eval_results(list(run_ids))


def _graded(rows: Iterable[EvalResultRow]) -> list[EvalResultRow]:
    """Rows with a verdict (skipped rows, ``passed`` NULL, left out)."""
    return [r for r in rows if r.passed is not None]


def _repeat_outcomes(rows: Iterable[EvalResultRow]) -> dict[str, dict[int, bool]]:
    out: dict[str, dict[int, bool]] = defaultdict(dict)
    for r in _graded(rows):
        out[r.case_id][r.repeat] = out[r.case_id].get(r.repeat, True) and bool(r.passed)
    return out


def assertion_key(row: EvalResultRow, ordinal: int = 0) -> str:
    """A readable name of one assertion of a case, the same in every repeat:
    ``"<case id>: <type> on <step or answer>"`` (``#2``... for the 2nd of that kind)."""
    where = row.step or TURN_KEY
    nth = f" #{ordinal + 1}" if ordinal else ""
    return f"{row.case_id}: {row.type} on {where}{nth}"


def _assertion_outcomes(rows: Iterable[EvalResultRow]) -> dict[str, dict[int, bool]]:
    """assertion key → repeat → passed. Rows of one turn are in the case's assertion
    order, so the k-th row of a kind (type, step) in a turn is the same assertion in
    every repeat."""
    seen: Counter[tuple[Any, ...]] = Counter()
    out: dict[str, dict[int, bool]] = defaultdict(dict)
    for r in rows:
        kind = (r.turn_id, r.case_id, r.repeat, r.type, r.step)
        ordinal = seen[kind]
        seen[kind] += 1
        if r.passed is not None:
            out[assertion_key(r, ordinal)][r.repeat] = r.passed
    return out


def case_outcomes(rows: Iterable[EvalResultRow]) -> dict[str, bool]:
    """case id → passed: all assertions passed in a strict majority of the case's repeats."""
    return {
        case: sum(reps.values()) * 2 > len(reps) for case, reps in _repeat_outcomes(rows).items()
    }


def failed_cases(rows: Iterable[EvalResultRow],
                 must_pass: Collection[str] = ()) -> list[dict[str, Any]]:  # fmt: skip
    """The cases that failed (:func:`case_outcomes`), in the order first scored, each
    ``{"case_id", "must_pass", "failed": [{"repeat", "type", "step", "detail"}]}``
    (its failing assertions; ``must_pass``: the case is in ``must_pass``)."""
    rows = list(rows)
    outcome = case_outcomes(rows)
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if outcome.get(r.case_id, True):
            continue
        case = out.setdefault(r.case_id, {"case_id": r.case_id,
                                          "must_pass": r.case_id in must_pass, "failed": []})
        if r.passed is False:
            case["failed"].append({"repeat": r.repeat, "type": r.type, "step": r.step,
                                   "detail": r.detail})  # fmt: skip
    return list(out.values())


def gate(pass_rate: float | None, failed: Sequence[dict[str, Any]],
         fail_under: float | None) -> list[str]:  # fmt: skip
    """Why an eval run fails the gate (empty: it passes): a must-pass case failed, or
    the case pass rate is under ``fail_under`` (None: no floor)."""
    why = [f"must-pass case {c['case_id']} failed" for c in failed if c["must_pass"]]
    if fail_under is not None and (pass_rate is None or pass_rate < fail_under):
        shown = "none" if pass_rate is None else f"{pass_rate:.3f}"
        why.append(f"case pass rate {shown} is under --fail-under {fail_under:g}")
    return why


def flip_rate(rows: Iterable[EvalResultRow]) -> dict[str, Any]:
    """How often a repeated case's verdict (and each repeated assertion's) differs across
    its repeats. Skipped verdicts are left out.

    Returns ``{"n_cases": cases with ≥ 2 repeats, "flipped": how many of them had both a
    passing and a failing repeat, "flip_rate": flipped / n_cases (None when 0),
    "cases": the flipped case ids, "assertions": {"n", "flipped", "flip_rate",
    "flipped_assertions": [assertion_key ...]}}`` (the same over assertions repeated
    ≥ 2 times with a verdict).
    """
    rows = list(rows)

    def flips(outcomes: Mapping[str, Mapping[int, bool]]) -> tuple[int, list[str]]:
        repeated = {k: reps for k, reps in outcomes.items() if len(reps) >= 2}
        return len(repeated), sorted(k for k, r in repeated.items() if len(set(r.values())) > 1)

    n, flipped = flips(_repeat_outcomes(rows))
    n_a, flipped_a = flips(_assertion_outcomes(rows))
    return {
        "n_cases": n,
        "flipped": len(flipped),
        "flip_rate": round(len(flipped) / n, 4) if n else None,
        "cases": flipped,
        "assertions": {
            "n": n_a,
            "flipped": len(flipped_a),
            "flip_rate": round(len(flipped_a) / n_a, 4) if n_a else None,
            "flipped_assertions": flipped_a,
        },
    }


def skipped_summary(rows: Iterable[EvalResultRow]) -> dict[str, dict[str, Any]]:
    """Skipped verdicts by assertion type: ``{type: {"n": how many, "reason": the most
    common reason (the row's detail)}}``; empty when every assertion got a verdict."""
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for r in rows:
        if r.passed is None:
            reasons[r.type][str(r.detail)] += 1
    return {
        t: {"n": sum(c.values()), "reason": c.most_common(1)[0][0]}
        for t, c in sorted(reasons.items())
    }


def summarize_results(rows: Sequence[EvalResultRow]) -> dict[str, Any]:
    """Pass rates from ``eval_results`` rows, each ``{n, passed, pass_rate, pass_rate_ci}``.

    Returns ``{"n_verdicts", "cases": per case (majority over repeats), "by_type": {type:
    ...} over verdicts, "by_step": {step or "turn": ...} over verdicts, "flip": flip_rate,
    "skipped": skipped_summary}``. Skipped rows count in none of the rates
    (``n_verdicts`` counts only verdicts given). Intervals are Wilson 95% (they treat
    verdicts as independent, which repeats of one case are not: read them as a guide).
    """
    by_type: dict[str, list[bool]] = defaultdict(list)
    by_step: dict[str, list[bool]] = defaultdict(list)
    graded = _graded(rows)
    for r in graded:
        by_type[r.type].append(bool(r.passed))
        by_step[r.step if r.step is not None else TURN_KEY].append(bool(r.passed))
    cases = case_outcomes(rows)
    return {
        "n_verdicts": len(graded),
        "cases": pass_rate(sum(cases.values()), len(cases)),
        "by_type": {k: pass_rate(sum(v), len(v)) for k, v in sorted(by_type.items())},
        "by_step": {k: pass_rate(sum(v), len(v)) for k, v in sorted(by_step.items())},
        "flip": flip_rate(rows),
        "skipped": skipped_summary(rows),
    }
