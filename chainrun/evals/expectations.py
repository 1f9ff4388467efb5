"""A replay set's expectations: what a usable answer to each of its turns holds.

A replay line may carry ``expect``, a list of eval assertions (the types of
:mod:`chainrun.evals.assertions`: ``names-product``, ``no-repeat``, ``whole-sentences``,
``regex`` on the model's ``prose``...). After the run, :func:`score_expectations` checks
each turn that has them and stores the verdicts in ``eval_results`` as ``chainrun eval``
does (so ``chainrun compare`` gives the difference of the rate of answers that met them,
paired by request id, with its interval); :func:`quality_line` is the line
``chainrun replay`` prints under its headline: how many answers met their expectations,
beside how many turns ended ok.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chainrun.evals.cases import EvalCase, HistoryTurnCase
from chainrun.evals.scoring import failed_cases, load_results, score_run
from chainrun.log.store import Store
from chainrun.replay.run import ReplayRequest

__all__ = ["expectation_cases", "quality_line", "score_expectations"]


def expectation_cases(requests: Sequence[ReplayRequest]) -> list[EvalCase]:
    """The requests that have expectations, as eval cases (same id, message and
    conversation; their ``expect`` as the case's assertions)."""
    return [
        EvalCase.model_validate({
            "id": r.id, "message": r.message, "assert": list(r.expect),
            "conversation_id": r.conversation_id if r.turn is not None else None,
            "turn": r.turn,
            "history": None if r.history is None else [
                HistoryTurnCase(message=h.message, answer=h.answer) for h in r.history],
        })
        for r in requests if r.expect
    ]  # fmt: skip


async def score_expectations(
    store: Store, run_id: int, requests: Sequence[ReplayRequest]
) -> dict[str, Any] | None:
    """Check the run's answers against their requests' expectations and store the
    verdicts (``eval_results`` of ``run_id``, replacing earlier ones).

    Returns:
        None when no request has expectations; else ``{"n": turns with expectations,
        "met": those whose every assertion passed, "rate", "rate_ci" (Wilson 95%),
        "not_met": [{"id", "failed": [{"type", "step", "detail"}]}]}`` (the ``cases``
        figure of :func:`chainrun.evals.scoring.summarize_results`).

    Raises:
        UserInputError: no turn of the run matches a request with expectations.
    """
    cases = expectation_cases(requests)
    if not cases:
        return None
    summary = await score_run(store, run_id, cases)
    figures = summary["cases"]
    failed = failed_cases(load_results(store, [run_id]))
    return {
        "n": figures["n"], "met": figures["passed"], "rate": figures["pass_rate"],
        "rate_ci": figures["pass_rate_ci"],
        "not_met": [{"id": f["case_id"], "failed": f["failed"]} for f in failed],
    }  # fmt: skip


def quality_line(quality: dict[str, Any], *, shown: int = 3) -> str:
    """``answers meeting their expectations: 10 of 12 (83%, 95% CI 55-95%); not met:
    sizing-1 (no-repeat: says '...' twice), ...`` (at most ``shown`` named)."""
    n, met, ci = quality["n"], quality["met"], quality["rate_ci"]
    line = f"answers meeting their expectations: {met} of {n}"
    if n:
        line += f" ({100 * met / n:.0f}%, 95% CI {100 * ci[0]:.0f}-{100 * ci[1]:.0f}%)"
    misses = quality["not_met"]
    if misses and shown > 0:
        named = []
        for miss in misses[:shown]:
            first = miss["failed"][0] if miss["failed"] else None
            why = f" ({first['type']}: {first['detail']})" if first else ""
            named.append(f"{miss['id']}{why}")
        more = f", and {len(misses) - shown} more" if len(misses) > shown else ""
        line += "; not met: " + "; ".join(named) + more
    return line
