"""Resuming a replay run that did not finish: which of its requests run again, the
history their conversations continue from, and the run's own config (the command line
that says how to go on: :func:`chainrun.replay.hints.resume_command`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chainrun.config import ChainConfig, config_from_snapshot
from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.source import shown_products
from chainrun.errors import UserInputError
from chainrun.log.rows import StepRow, TurnRow
from chainrun.log.store import Store
from chainrun.replay.run import ReplayRequest

__all__ = [
    "RERUN_STATUSES",
    "SERVER_DOWN_ERRORS",
    "Resumed",
    "answered_history",
    "missing_requests",
    "resume",
    "to_rerun",
]


#: the turn statuses a resume runs again: the chain gave no answer of its own (Ctrl-C or
#: SIGTERM cancelled the turn; a provider could not be reached or failed it, e.g. during
#: an outage); ``ok``, ``refused`` and ``replaced`` are answers and stay
RERUN_STATUSES = frozenset({"cancelled", "error"})
#: the error types of a ``refused`` turn that a resume runs again too: the step failed
#: closed because its provider went away (could not be reached, or its connection broke
#: mid-answer: docs/reference/error-types.md), not by the chain's own rules
SERVER_DOWN_ERRORS = frozenset({"unavailable", "connection_lost"})


def to_rerun(turn: TurnRow) -> bool:
    """True when a resume runs ``turn``'s request again: :data:`RERUN_STATUSES`, or
    refused for a provider that was down (:data:`SERVER_DOWN_ERRORS`)."""
    return turn.status in RERUN_STATUSES or (
        turn.status == "refused" and turn.error_type in SERVER_DOWN_ERRORS
    )


def answered_history(store: Store, run_id: int) -> dict[str, list[HistoryTurn]]:
    """The turns run ``run_id`` has answered, as history by conversation id (by turn
    index), with the products each showed: what a resumed replay's later turns continue
    from. A conversation's history stops before its first turn a resume runs again
    (:data:`RERUN_STATUSES`, or a turn not logged), so that turn sees only the turns
    before it."""
    answered: dict[str, dict[int, HistoryTurn]] = {}
    steps_of: dict[int | None, list[StepRow]] = {}
    for s in store.steps(run_id):
        steps_of.setdefault(s.turn_id, []).append(s)
    for t in store.turns(run_id):
        if to_rerun(t) or t.conversation_id is None or t.turn_index is None:
            continue
        answered.setdefault(t.conversation_id, {})[t.turn_index] = HistoryTurn(
            t.input, t.output or "", shown_products(steps_of.get(t.id, []))
        )
    out: dict[str, list[HistoryTurn]] = {}
    for cid, turns in answered.items():
        index = min(turns)
        out[cid] = []
        while index in turns:  # up to the first gap: a turn to run again, or not yet run
            out[cid].append(turns[index])
            index += 1
    return out


def missing_requests(
    store: Store, run_id: int, requests: list[ReplayRequest], source: str | None = None
) -> list[ReplayRequest]:
    """The requests of a replay set that run ``run_id`` has not yet answered: those with
    no logged turn, or only turns that ended ``cancelled`` or ``error``, or ``refused``
    because the provider was down (:func:`to_rerun`; ``chainrun replay FILE --resume
    RUN``). The turns they had
    stay in the log, counted by their status.

    Raises:
        UserInputError: no such run, not a replay run, still being written, or made
            from another file than ``source``.
    """
    run = store.get_run(run_id)
    if run.kind != "replay":
        raise UserInputError(f"run {run_id}: a {run.kind} run, not a replay; cannot resume")
    if run.status == "running":
        raise UserInputError(
            f"run {run_id}: still running (another process is writing it); cannot resume"
        )
    if source is not None and run.source and Path(run.source).name != Path(source).name:
        raise UserInputError(
            f"run {run_id}: was made from {run.source}, not {source}; cannot resume"
        )
    done = {
        t.request_id
        for t in store.turns(run_id)
        if not to_rerun(t) and t.request_id is not None
    }
    return [r for r in requests if r.id not in done]


@dataclass(frozen=True)
class Resumed:
    """What a resumed replay runs: the requests not yet answered, the history their
    conversations continue from, and the run's own config (its snapshot)."""

    requests: list[ReplayRequest]
    earlier: dict[str, list[HistoryTurn]]
    config: ChainConfig


def resume(
    store: Store, run_id: int, requests: list[ReplayRequest], source: str | None = None
) -> Resumed:
    """Everything ``chainrun replay FILE --resume RUN`` needs from the log before it runs:
    :func:`missing_requests`, :func:`answered_history` and the config run ``run_id`` was
    made with.

    Raises:
        UserInputError: as :func:`missing_requests`; ConfigError: the run's stored config
            no longer loads.
    """
    missing = missing_requests(store, run_id, requests, source)
    earlier = answered_history(store, run_id)
    config = config_from_snapshot(store.get_run(run_id).config or "", f"run {run_id}")
    return Resumed(missing, earlier, config)
