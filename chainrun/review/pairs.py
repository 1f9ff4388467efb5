"""The requests two runs share, with what each answer said and was given.

A review compares run A (the baseline) with run B (the candidate) on the requests both
answered (``turns.request_id``: a replay of the same file, or an eval set, twice). For
each, the reviewer is shown the request, the conversation's earlier turns (from run A),
and for each answer what it was given: what the steps handed on (the products shown,
the policy text: :attr:`~chainrun.log.rows.StepRow.updates`), the turn's tool calls and
results, and its verdicts (the grounding check's among them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chainrun.log.rows import ToolCallRow, TurnRow
from chainrun.log.store import Store

__all__ = ["ReviewAnswer", "ReviewPair", "shared_pairs"]

#: turn-state fields that are no material of the answer (the answer itself, the route)
_NOT_MATERIAL = frozenset({"answer", "label", "history"})


@dataclass(frozen=True)
class ReviewAnswer:
    """One run's answer to a request and what it was given.

    Attributes:
        run_id, turn_id: where it is logged.
        output: the answer text (None: none).
        status: the turn's status (ok, refused, cut, ...).
        given: the turn-state fields its steps handed on, by name (products as rows,
            policy text, tool results...), the answer and label left out.
        tool_calls: ``{"tool", "arguments", "status", "result"}`` per tool call.
        verdicts: the turn's verdicts by step (the grounding check's among them).
    """

    run_id: int
    turn_id: int
    output: str | None
    status: str
    given: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    verdicts: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"output": self.output, "status": self.status, "given": self.given,
                "tool_calls": self.tool_calls, "verdicts": self.verdicts}  # fmt: skip


@dataclass(frozen=True)
class ReviewPair:
    """A request both runs answered: the message, the earlier turns (oldest first, as
    ``(message, answer)``), and each run's answer."""

    request_id: str
    message: str
    history: list[tuple[str, str | None]]
    a: ReviewAnswer
    b: ReviewAnswer


def _answer(store: Store, turn: TurnRow, tools: list[ToolCallRow]) -> ReviewAnswer:
    assert turn.id is not None and turn.run_id is not None
    logged = store.turn(turn.id)
    given: dict[str, Any] = {}
    for step in logged.steps if logged is not None else []:
        for name, value in (step.updates or {}).items():
            if name not in _NOT_MATERIAL and value not in (None, "", [], {}):
                given[name] = value
    calls = [{"tool": t.tool, "arguments": t.arguments, "status": t.status, "result": t.result}
             for t in tools if t.turn_id == turn.id]  # fmt: skip
    return ReviewAnswer(turn.run_id, turn.id, turn.output, turn.status, given, calls,
                        dict(turn.verdicts or {}))  # fmt: skip


def shared_pairs(store: Store, run_a: int, run_b: int) -> list[ReviewPair]:
    """The requests runs ``run_a`` and ``run_b`` both answered, in run A's order (the
    latest turn of a request id where a run has several, e.g. after a resume).

    Raises:
        UserInputError: either run does not exist (from :meth:`Store.get_run`).
    """
    store.get_run(run_a)
    store.get_run(run_b)
    turns_a, turns_b = store.turns(run_a), store.turns(run_b)
    latest_b = {t.request_id: t for t in turns_b if t.request_id is not None}
    latest_a = {t.request_id: t for t in turns_a if t.request_id is not None}
    tools_a, tools_b = store.tool_calls(run_a), store.tool_calls(run_b)
    pairs: list[ReviewPair] = []
    for rid, ta in latest_a.items():
        tb = latest_b.get(rid)
        if rid is None or tb is None:
            continue
        earlier = [(t.input, t.output) for t in turns_a
                   if ta.conversation_id and t.conversation_id == ta.conversation_id
                   and (t.turn_index or 0) < (ta.turn_index or 0)]  # fmt: skip
        pairs.append(ReviewPair(rid, ta.input, earlier, _answer(store, ta, tools_a),
                                _answer(store, tb, tools_b)))  # fmt: skip
    return pairs
