"""Eval cases: one JSON object a line (``evals/regression.jsonl``).

Each line::

    {"id": "sizing-01", "message": "Do your jeans run small?", "label": "sizing",
     "context": {"filters": {"category": "jeans"}, "order_state": null},
     "assert": [{"type": "equals", "step": "label", "value": "sizing"}, ...]}

``context`` is optional (``filters``: retrieval filters; ``order_state``: the order
facts the shop would have for this shopper). ``must_pass: true`` marks a case
``chainrun eval`` must not fail (it exits 1 when one does). ``label`` is the classify
label the case expects (what label accuracy is measured against: ``chainrun eval``'s
label accuracy and ``benchmarks/classify_accuracy.py``). ``tags`` and ``description`` are optional
too. Unknown keys are errors, so a typo never silently drops an assertion.

A case may be a turn of a conversation: ``conversation_id`` and ``turn`` (its 1-based
position there), optionally a fixed ``history`` (``[{"message", "answer"}]``, oldest
first); a conversation's cases run in turn order, each seeing the chain's own earlier
answers (see :mod:`chainrun.replay.run`), and each case's assertions apply to its own turn::

    {"id": "rain-2", "conversation_id": "rain", "turn": 2,
     "message": "Which of those is cheapest?",
     "assert": [{"type": "icontains", "step": "retrieve", "value": "JKT"}]}
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from pathlib import Path
from typing import Any, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from chainrun.conversations.turn_order import missing_earlier_turn
from chainrun.errors import InputFileError
from chainrun.evals.assertions import ASSERTION_TYPES, LABEL, PROSE, Assertion
from chainrun.input_files import read_jsonl, unknown_field

DEFAULT_CASES = "evals/regression.jsonl"


class CaseContext(BaseModel):
    """What the shop knows besides the message (passed to the chain by the eval runner)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    filters: dict[str, Any] = Field(default_factory=dict)
    order_state: dict[str, Any] | None = None


class HistoryTurnCase(BaseModel):
    """One earlier turn of a case's fixed ``history``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    message: str = Field(min_length=1)
    answer: str = ""


class EvalCase(BaseModel):
    """One eval case: a shopper message and the assertions its turn must satisfy."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    id: str = Field(min_length=1)
    message: str = Field(min_length=1)
    #: the classify label this message should get (None: not labelled)
    label: str | None = Field(default=None, min_length=1)
    context: CaseContext | None = None
    asserts: list[Assertion] = Field(alias="assert", min_length=1)
    tags: list[str] = Field(default_factory=list)
    description: str | None = None
    #: a case that must pass: ``chainrun eval`` exits 1 when it fails, whatever the
    #: pass rate (the cases a change must never break)
    must_pass: bool = False
    #: the conversation this case is a turn of (with ``turn``)
    conversation_id: str | None = Field(default=None, min_length=1, max_length=200)
    #: the case's 1-based position in its conversation
    turn: int | None = Field(default=None, ge=1)
    #: a fixed context instead of the run's own earlier turns
    history: list[HistoryTurnCase] | None = None

    @model_validator(mode="after")
    def _conversation(self) -> EvalCase:
        if (self.conversation_id is None) != (self.turn is None):
            raise ValueError("conversation_id and turn: give both (a turn of a conversation) "
                             "or neither")  # fmt: skip
        if self.history is not None and self.turn is None:
            raise ValueError("history: only for a turn of a conversation (conversation_id, turn)")
        return self

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if v != v.strip() or "#" in v:
            raise ValueError("a case id must have no surrounding spaces and no '#'")
        return v


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's annotation holds (``list[X]``, ``X | None``, a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


def _fields_at(loc: tuple[int | str, ...]) -> list[str] | None:
    """The keys the object at ``loc`` (a pydantic error's location, its last part the
    key at fault) may have, by their names in the file; None when not found."""
    models: list[type[BaseModel]] = [EvalCase]
    for part in loc[:-1]:
        if isinstance(part, int):  # a list's item
            continue
        if len(models) > 1:  # an assertion: pydantic names the member by its type
            models = [m for m in models if part in get_args(m.model_fields["type"].annotation)]
            continue
        found = [f for n, f in models[0].model_fields.items() if part in (n, f.alias)]
        if not found:
            return None
        models = _models_in(found[0].annotation)
    if len(models) != 1:
        return None
    return [f.alias or n for n, f in models[0].model_fields.items()]


def _where(loc: tuple[int | str, ...]) -> str:
    """``assert[0]``: an object's place in a case (tag names pydantic adds left out)."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i and isinstance(loc[i - 1], int) and part in ASSERTION_TYPES:
            continue  # the assertion's type, which pydantic adds after its index
        else:
            out += f".{part}" if out else str(part)
    return out


def _problem(err: ValidationError) -> str:
    errors = err.errors()
    # a misspelt key explains a "missing field" better than the missing field does
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    known = _fields_at(first["loc"]) if first["type"] == "extra_forbidden" else None
    if known is not None:  # the wording of every input file (replay sets too)
        where = _where(first["loc"][:-1])
        problem = unknown_field(str(first["loc"][-1]), known)
        return _one_line(f"{where}: {problem}" if where else problem)
    if first["type"] == "union_tag_invalid":  # an assertion type that does not exist
        tag = str((first.get("ctx") or {}).get("tag", ""))
        close = difflib.get_close_matches(tag, ASSERTION_TYPES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return _one_line(f"{_where(first['loc'])}.type: unknown assertion type {tag!r}{hint}; "
                         f"expected {', '.join(ASSERTION_TYPES)}")  # fmt: skip
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    return _one_line(f"{loc}: {msg}")


def _one_line(text: str) -> str:
    """``text`` with control characters escaped: keys and values (a quoted assertion
    type, say) may hold any character, and the message stays one line."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def parse_case(data: Any, path: str = "<case>", line: int | None = None) -> EvalCase:
    """Validate one decoded case.

    Raises:
        InputFileError: naming ``path``, ``line`` and the field at fault.
    """
    if not isinstance(data, dict):
        raise InputFileError(path, line, f"expected a JSON object, got {type(data).__name__}")
    try:
        return EvalCase.model_validate(data)
    except ValidationError as e:
        raise InputFileError(path, line, _problem(e)) from None


def check_steps(case: EvalCase, steps: Collection[str], path: str, line: int | None) -> None:
    """Check that every assertion's ``step`` names a step of the chain (or ``label``, or
    ``prose``: the model's part of the answer).

    Raises:
        InputFileError: naming the file, line and assertion, with a did-you-mean.
    """
    known = [*steps, LABEL, PROSE]
    for i, a in enumerate(case.asserts):
        if a.step is None or a.step in known:
            continue
        close = difflib.get_close_matches(a.step, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputFileError(
            path, line,
            f"assert.{i}.step: unknown step {a.step!r}{hint}; expected {LABEL!r}, {PROSE!r} or "
            f"a step of the chain: {', '.join(steps)}",
        )  # fmt: skip


def load_cases(
    path: str | Path = DEFAULT_CASES, steps: Collection[str] | None = None
) -> list[EvalCase]:
    """Read every case of a JSONL file (blank lines are skipped).

    ``steps``: the chain's step names (``config.order``); when given, an assertion
    naming any other step (than ``label``) is an error here, not a failed verdict later.

    Raises:
        InputFileError: the file cannot be read, has no case, a line is not JSON or not a
            valid case (the message names the line), a case id repeats, an assertion
            names a step the chain does not have, or a conversation's turn has neither its
            earlier turn in the file nor a ``history``.
    """
    p = str(path)
    cases: list[EvalCase] = []
    first_line: dict[str, int] = {}
    turn_line: dict[tuple[str, int], int] = {}
    for lineno, data in read_jsonl(p, "eval set", objects=False):
        case = parse_case(data, p, lineno)
        if steps is not None:
            check_steps(case, steps, p, lineno)
        if case.id in first_line:
            raise InputFileError(
                p, lineno, f"duplicate case id {case.id!r} (first on line {first_line[case.id]})"
            )
        first_line[case.id] = lineno
        if case.conversation_id is not None and case.turn is not None:
            key = (case.conversation_id, case.turn)
            if key in turn_line:
                raise InputFileError(
                    p, lineno, f"conversation {case.conversation_id!r} has turn {case.turn} "
                    f"twice (first on line {turn_line[key]})",
                )  # fmt: skip
            turn_line[key] = lineno
        cases.append(case)
    if not cases:
        raise InputFileError(p, None, "no eval cases in file")
    gap = missing_earlier_turn(
        (c.conversation_id, c.turn, c.history is not None, turn_line[(c.conversation_id, c.turn)])
        for c in cases if c.conversation_id is not None and c.turn is not None
    )  # fmt: skip
    if gap is not None:
        raise InputFileError(p, *gap)
    return cases
