"""Eval cases, assertions and scoring (the runner that drives the chain lives elsewhere).

- :mod:`chainrun.evals.assertions`: assertion types (promptfoo names) and :class:`Verdict`.
- :mod:`chainrun.evals.cases`: :func:`load_cases` for ``evals/regression.jsonl``.
- :mod:`chainrun.evals.scoring`: :func:`score_turn`, :func:`score_run` (``eval_results``
  table, migration ``020_eval_results``), pass rates and flip rate.
"""

from chainrun.evals.assertions import (
    ASSERTION_TYPES,
    Assertion,
    Grade,
    GraderConfig,
    TurnView,
    Verdict,
    evaluate,
    parse_assertion,
)
from chainrun.evals.cases import CaseContext, EvalCase, load_cases, parse_case
from chainrun.evals.scoring import (
    case_outcomes,
    eval_request_id,
    flip_rate,
    load_results,
    parse_request_id,
    score_run,
    score_turn,
    summarize_results,
    turn_view,
)

__all__ = [
    "ASSERTION_TYPES",
    "Assertion",
    "CaseContext",
    "EvalCase",
    "Grade",
    "GraderConfig",
    "TurnView",
    "Verdict",
    "case_outcomes",
    "eval_request_id",
    "evaluate",
    "flip_rate",
    "load_cases",
    "load_results",
    "parse_assertion",
    "parse_case",
    "parse_request_id",
    "score_run",
    "score_turn",
    "summarize_results",
    "turn_view",
]
