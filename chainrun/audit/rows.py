"""The audit's one door into the run log: the rows it reads, as small typed records.

Every other audit module reads these records by attribute and never touches the
:class:`~chainrun.store.Store` or a dict row, so that a change of the log's row types
is a change of this file alone. JSON columns (config snapshots, chunk gaps, step
detail) are parsed here once. Times are in ms.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chainrun.evals.scoring import load_results
from chainrun.store import Store


def _json(raw: Any, default: Any) -> Any:
    if raw is None or raw == "":
        return default
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return default


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


@dataclass(frozen=True)
class Run:
    """A ``runs`` row; ``config`` is the parsed config snapshot (None when absent)."""

    id: int
    kind: str
    label: str | None
    source: str | None
    started_at: str | None
    status: str | None
    config: dict[str, Any] | None


@dataclass(frozen=True)
class Turn:
    """A ``turns`` row (``duration_ms`` None when unknown)."""

    id: int
    run_id: int
    input: str
    output: str | None
    status: str
    started_at: str | None
    duration_ms: float | None
    request_id: str | None


@dataclass(frozen=True)
class Step:
    """A ``steps`` row; ``detail`` is the parsed step detail (retrieval searches, ...)."""

    id: int
    run_id: int
    turn_id: int
    step: str
    kind: str
    status: str
    started_offset_ms: float | None
    duration_ms: float | None
    hedge_delay_ms: float | None
    hedge_fired: bool
    hedge_won: bool
    time_saved_ms: float | None
    detail: dict[str, Any] | None


@dataclass(frozen=True)
class Call:
    """A ``calls`` row: one model call attempt (unknown counts are None, never 0)."""

    id: int
    run_id: int
    turn_id: int
    step: str
    attempt: int
    target: str | None
    provider: str | None
    model: str | None
    reasoning_effort: str | None
    stream: bool
    output: str | None
    started_offset_ms: float | None
    ttft_ms: float | None
    duration_ms: float | None
    chunk_gaps_ms: tuple[float, ...]
    n_chunks: int | None
    input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    finish_reason: str | None
    error_type: str | None
    outcome: str | None

    @property
    def settle_ms(self) -> float | None:
        """Time to settle a race, from the attempt's own start: TTFT for a streamed step
        (it settles on the first token), the whole duration otherwise (what the hedging
        engine's latency window records)."""
        return self.ttft_ms if self.stream else self.duration_ms


@dataclass(frozen=True)
class EvalResult:
    """An ``eval_results`` row: one assertion's verdict on one turn."""

    run_id: int
    turn_id: int
    case_id: str
    repeat: int
    type: str
    step: str | None
    passed: bool


@dataclass
class RunRows:
    """One run's rows."""

    run: Run
    turns: list[Turn] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)


def _run(r: Mapping[str, Any]) -> Run:
    return Run(
        id=int(r["id"]),
        kind=str(r["kind"]),
        label=r.get("label"),
        source=r.get("source"),
        started_at=r.get("started_at"),
        status=r.get("status"),
        config=_json(r.get("config"), None),
    )


def _turn(r: Mapping[str, Any]) -> Turn:
    return Turn(
        id=int(r["id"]),
        run_id=int(r["run_id"]),
        input=r.get("input") or "",
        output=r.get("output"),
        status=r.get("status") or "ok",
        started_at=r.get("started_at"),
        duration_ms=_float(r.get("duration_ms")),
        request_id=r.get("request_id"),
    )


def _step(r: Mapping[str, Any]) -> Step:
    return Step(
        id=int(r["id"]),
        run_id=int(r["run_id"]),
        turn_id=int(r["turn_id"]),
        step=str(r["step"]),
        kind=r.get("kind") or "llm",
        status=r.get("status") or "ok",
        started_offset_ms=_float(r.get("started_offset_ms")),
        duration_ms=_float(r.get("duration_ms")),
        hedge_delay_ms=_float(r.get("hedge_delay_ms")),
        hedge_fired=bool(r.get("hedge_fired")),
        hedge_won=bool(r.get("hedge_won")),
        time_saved_ms=_float(r.get("time_saved_ms")),
        detail=_json(r.get("detail"), None),
    )


def _call(r: Mapping[str, Any]) -> Call:
    return Call(
        id=int(r["id"]),
        run_id=int(r["run_id"]),
        turn_id=int(r["turn_id"]),
        step=str(r["step"]),
        attempt=int(r.get("attempt") or 1),
        target=r.get("target"),
        provider=r.get("provider"),
        model=r.get("model"),
        reasoning_effort=r.get("reasoning_effort"),
        stream=bool(r.get("stream")),
        output=r.get("output"),
        started_offset_ms=_float(r.get("started_offset_ms")),
        ttft_ms=_float(r.get("ttft_ms")),
        duration_ms=_float(r.get("duration_ms")),
        chunk_gaps_ms=tuple(float(g) for g in _json(r.get("chunk_gaps_ms"), [])),
        n_chunks=_int(r.get("n_chunks")),
        input_tokens=_int(r.get("input_tokens")),
        output_tokens=_int(r.get("output_tokens")),
        reasoning_tokens=_int(r.get("reasoning_tokens")),
        finish_reason=r.get("finish_reason"),
        error_type=r.get("error_type"),
        outcome=r.get("outcome"),
    )


def all_runs(store: Store) -> list[Run]:
    """Every run of the log, oldest first."""
    n = store.db.execute("select count(*) from runs").fetchone()[0]
    return [_run(r) for r in reversed(store.list_runs(limit=max(1, int(n))))]


def get_run(store: Store, run_id: int) -> Run:
    """One run.

    Raises:
        UserInputError: no such run.
    """
    return _run(store.get_run(run_id))


def run_rows(store: Store, run: Run) -> RunRows:
    """A run with its turns, steps and calls (in log order)."""
    return RunRows(
        run=run,
        turns=[_turn(t) for t in store.turns(run.id)],
        steps=[_step(s) for s in store.steps(run.id)],
        calls=[_call(c) for c in store.calls(run.id)],
    )


def eval_results(store: Store, run_ids: Iterable[int]) -> list[EvalResult]:
    """The stored eval verdicts of some runs (empty when none were scored)."""
    return [
        EvalResult(
            run_id=int(r["run_id"]),
            turn_id=int(r["turn_id"]),
            case_id=str(r["case_id"]),
            repeat=int(r.get("repeat") or 0),
            type=str(r["type"]),
            step=r.get("step"),
            passed=bool(r["passed"]),
        )
        for r in load_results(store, list(run_ids))
    ]


def results_as_rows(results: Sequence[EvalResult]) -> list[dict[str, Any]]:
    """Verdicts in the row shape :mod:`chainrun.evals.scoring` aggregates."""
    return [
        {
            "case_id": r.case_id,
            "repeat": r.repeat,
            "type": r.type,
            "step": r.step,
            "passed": r.passed,
        }
        for r in results
    ]
