"""What an audit looks at: runs (default: the latest replay run), live turns (default:
all of them) and eval runs (default: all of them), read once through :mod:`.rows`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from chainrun.analysis.compare import parse_live_window
from chainrun.analysis.summary import CompletedTurns, completed_turns
from chainrun.audit.rows import Run, RunRows, all_runs, eval_results, get_run, run_rows
from chainrun.errors import UserInputError
from chainrun.log.rows import CallRow, EvalResultRow, StepRow, TurnRow
from chainrun.log.store import Store


@dataclass
class Sample:
    """Turns audited together: one run (``name`` "replay run 3") or all live turns.

    Latency figures read ``done_turns`` / ``done_steps`` / ``done_calls``: the rows of
    completed turns only, the one rule of every summary
    (:func:`chainrun.analysis.summary.completed_turns`); ``completed`` counts the others.
    """

    name: str
    kind: str
    runs: list[Run]
    turns: list[TurnRow] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    calls: list[CallRow] = field(default_factory=list)

    @property
    def is_live(self) -> bool:
        return self.kind == "live"

    @property
    def completed(self) -> CompletedTurns:
        """Which turns latency may use, and the cancelled/refused/errored counts."""
        return completed_turns(self.turns)

    @property
    def done_turns(self) -> list[TurnRow]:
        return self.completed.of(self.turns)

    @property
    def done_steps(self) -> list[StepRow]:
        return self.completed.of(self.steps)

    @property
    def done_calls(self) -> list[CallRow]:
        return self.completed.of(self.calls)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "run_ids": [r.id for r in self.runs],
            "labels": [r.label for r in self.runs],
            "n_turns": len(self.turns),
            "turns": self.completed.counts(),
        }


@dataclass
class Scope:
    """Everything an audit reads.

    ``samples``: the selected runs (one sample each) and then the live turns (one
    sample, when there are any). ``evals``: eval runs with ``results`` (their stored
    verdicts). ``queries``: labelled retrieval queries (message → expected product ids).
    """

    samples: list[Sample]
    evals: list[RunRows]
    results: list[EvalResultRow]
    queries: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    live_window: tuple[str | None, str | None] = (None, None)

    @property
    def calls(self) -> list[CallRow]:
        return [c for s in self.samples for c in s.calls]

    @property
    def steps(self) -> list[StepRow]:
        return [st for s in self.samples for st in s.steps]

    @property
    def turns(self) -> list[TurnRow]:
        return [t for s in self.samples for t in s.turns]

    @property
    def runs(self) -> list[Run]:
        return [r for s in self.samples for r in s.runs]

    @property
    def done_calls(self) -> list[CallRow]:
        """Calls of completed turns (:attr:`Sample.done_calls`): what latency uses."""
        return [c for s in self.samples for c in s.done_calls]

    @property
    def done_steps(self) -> list[StepRow]:
        """Steps of completed turns (:attr:`Sample.done_steps`): what latency uses."""
        return [st for s in self.samples for st in s.done_steps]

    def current_config(self) -> dict[str, Any] | None:
        """The config snapshot in use: the newest audited run's, else the newest eval run's."""
        runs = sorted(self.runs, key=lambda r: r.id) or sorted(
            (e.run for e in self.evals), key=lambda r: r.id
        )
        for run in reversed(runs):
            if run.config:
                return run.config
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "samples": [s.describe() for s in self.samples],
            "live_window": {"from": self.live_window[0], "to": self.live_window[1]},
            "eval_runs": [
                {
                    "id": e.run.id,
                    "label": e.run.label,
                    "source": e.run.source,
                    "n_turns": len(e.turns),
                }
                for e in self.evals
            ],
            "labelled_queries": len(self.queries),
        }


def _parse_ts(text: str) -> datetime | None:
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _live_sample(store: Store, runs: Sequence[Run], live: str | None) -> tuple[Sample | None, Any]:
    selector = "live" if live is None else (live if live.startswith("live") else f"live:{live}")
    start, end = parse_live_window(selector)
    window = (start.isoformat() if start else None, end.isoformat() if end else None)
    live_runs = [r for r in runs if r.kind == "live"]
    sample = Sample("live", "live", [])
    for run in live_runs:
        rows = run_rows(store, run)
        kept: set[int | None] = set()
        for t in rows.turns:
            stamp = _parse_ts(t.started_at or run.started_at or "")
            if start is not None or end is not None:
                if stamp is None or (start and stamp < start) or (end and stamp >= end):
                    continue
            kept.add(t.id)
            sample.turns.append(t)
        if kept:
            sample.runs.append(run)
            sample.steps += [s for s in rows.steps if s.turn_id in kept]
            sample.calls += [c for c in rows.calls if c.turn_id in kept]
    return (sample if sample.turns else None), window


def select_scope(
    store: Store,
    runs: Sequence[int] = (),
    live: str | None = None,
    eval_runs: Sequence[int] = (),
    queries: Mapping[str, tuple[str, ...]] | None = None,
) -> Scope:
    """Read the audited part of the log.

    Args:
        runs: run ids to audit (default: the latest run of kind ``replay``, if any).
        live: a window ``FROM..TO`` (ISO-8601, either side optional; ``live:`` prefix
            allowed) of live turns; default all live turns.
        eval_runs: eval run ids for the reasoning-effort and retrieval-coverage items
            (default: every eval run of the log).
        queries: labelled retrieval queries, message → expected product ids.

    Raises:
        UserInputError: an unknown run id, an eval run id of a run that is not of kind
            ``eval``, or a malformed live window.
    """
    everything = all_runs(store)
    picked = [get_run(store, rid) for rid in runs]
    if not runs:
        replays = [r for r in everything if r.kind == "replay"]
        picked = replays[-1:]
    samples = []
    for run in picked:
        rows = run_rows(store, run)
        samples.append(
            Sample(f"{run.kind} run {run.id}", run.kind, [run], rows.turns, rows.steps, rows.calls)
        )
    live_sample, window = _live_sample(store, everything, live)
    if live_sample is not None and not any(r.kind == "live" for r in picked):
        samples.append(live_sample)
    evals = []
    for rid in eval_runs:
        run = get_run(store, rid)
        if run.kind != "eval":
            raise UserInputError(f"--eval-run {rid}: run {rid} is of kind {run.kind}, not eval")
        evals.append(run_rows(store, run))
    if not eval_runs:
        evals = [run_rows(store, r) for r in everything if r.kind == "eval"]
    results = eval_results(store, [e.run.id for e in evals])
    return Scope(samples, evals, results, dict(queries or {}), window)
