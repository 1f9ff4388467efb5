"""The audit's one door into the run log: the rows it reads, as small typed records.

Turns, steps and calls are the log's own typed rows (:mod:`chainrun.log.rows`); a run
comes with its config snapshot parsed. Every other audit module reads these by
attribute and never touches the :class:`~chainrun.log.store.Store`. Times are in ms.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chainrun.evals.scoring import load_results
from chainrun.log.rows import CallRow, EvalResultRow, RunRow, StepRow, TurnRow
from chainrun.log.store import Store


def _json(raw: Any, default: Any) -> Any:
    if raw is None or raw == "":
        return default
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return default


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




def settle_ms(call: CallRow) -> float | None:
    """Time to settle a race, from the attempt's own start: the first event for a
    streamed step (it settles on the first token, or a round asking for tools on its
    first tool-call piece), the whole duration otherwise (what the hedging engine's
    latency window records)."""
    return call.first_event_ms if call.stream else call.duration_ms


@dataclass
class RunRows:
    """One run's rows."""

    run: Run
    turns: list[TurnRow] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    calls: list[CallRow] = field(default_factory=list)


def _run(r: RunRow) -> Run:
    assert r.id is not None
    return Run(id=r.id, kind=r.kind, label=r.label, source=r.source,
               started_at=r.started_at, status=r.status, config=_json(r.config, None))  # fmt: skip


def all_runs(store: Store) -> list[Run]:
    """Every run of the log, oldest first."""
    return [_run(r) for r in reversed(store.list_runs(limit=max(1, store.count_runs())))]


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
        turns=store.turns(run.id),
        steps=store.steps(run.id),
        calls=store.calls(run.id),
    )


def eval_results(store: Store, run_ids: Iterable[int]) -> list[EvalResultRow]:
    """The stored eval verdicts of some runs (empty when none were scored)."""
    return load_results(store, list(run_ids))
