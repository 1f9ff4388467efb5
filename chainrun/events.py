"""Typed events a turn yields to a chat backend (see :meth:`chainrun.chain.Chain.stream_turn`).

Order within a turn: for each step ``StepStarted`` → (``TokenDelta`` and, for a step
with tools, ``ToolCallEvent`` …) → ``StepFinished``; steps that run concurrently
interleave; at most one ``AnswerDone`` once the shopper has the whole answer (checks of
the answer may still be running); then one ``TurnFinished``.
All durations and offsets are in ms.

Every event is plain JSON through ``event.as_json()``: its fields by name (``type`` first),
tuples as lists, the usage as the log stores it (:meth:`TurnUsage.as_json`: a count no call
reported is ``null``, never 0), e.g. ``json.dumps(event.as_json())``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from chainrun.log.rows import TurnUsage


def _json_value(value: Any) -> Any:
    if isinstance(value, TurnUsage) or callable(getattr(value, "as_json", None)):
        return value.as_json()  # the usage, a pending action
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


class _AsJson:
    """``as_json()`` for the event dataclasses (see the module text)."""

    def as_json(self) -> dict[str, Any]:
        """The event as a JSON-ready dict: ``{"type": ..., field: value, ...}``."""
        values = {f.name: _json_value(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]
        return {"type": values.pop("type"), **values}


@dataclass(frozen=True)
class StepStarted(_AsJson):
    """A step started; ``started_offset_ms`` from the turn's start (concurrent steps
    start at about the same offset)."""

    step: str
    kind: str
    started_offset_ms: float = 0.0
    type: Literal["step_started"] = "step_started"


@dataclass(frozen=True)
class TokenDelta(_AsJson):
    """A piece of a streamed step's answer, as it arrived from the winning attempt."""

    step: str
    text: str
    type: Literal["token_delta"] = "token_delta"


@dataclass(frozen=True)
class ToolCallEvent(_AsJson):
    """A tool call of a step started (``phase = "started"``: the tool really began) or
    finished (``"finished"``: with its ``status``, see :mod:`chainrun.tools.runner`; a
    call that never ran, e.g. with invalid arguments, has only this event).

    ``started_offset_ms`` is from the turn's start (None: the tool never started);
    ``duration_ms`` how long it ran (finished only).
    """

    step: str
    phase: Literal["started", "finished"]
    tool: str
    call_id: str
    round: int = 1
    side_effects: bool = False
    status: str | None = None
    started_offset_ms: float | None = None
    duration_ms: float | None = None
    error_type: str | None = None
    idempotency_key: str | None = None
    #: the pending action a ``confirm`` tool's call became (status
    #: ``awaiting_confirmation``): ``{id, tool, arguments, question, step,
    #: conversation_id, expires_at, expires_after_turn}``
    action: dict[str, Any] | None = None
    type: Literal["tool"] = "tool"


@dataclass(frozen=True)
class ProductsShown(_AsJson):
    """The products an answer is about, as data (the answer step's ``facts``), sent before
    the text that lists them: each ``{id, title, category, price, currency, colours,
    sizes, stock, source}`` (``price`` in ``currency`` units; ``sizes``: units in stock by
    size label), in the order the answer lists them. A chat page shows them as cards."""

    step: str
    products: tuple[dict[str, Any], ...]
    type: Literal["products"] = "products"


@dataclass(frozen=True)
class StepFinished(_AsJson):
    """A step ended; ``status`` is ok | failed_open | failed_closed | skipped | cancelled."""

    step: str
    status: str
    duration_ms: float
    output: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None
    ttft_ms: float | None = None
    output_tokens: int | None = None
    n_attempts: int = 0
    hedge_fired: bool = False
    hedge_won: bool = False
    error_type: str | None = None
    detail: dict[str, Any] | None = None
    #: when the step started, ms from the turn's start
    started_offset_ms: float = 0.0
    #: the step only follows the answer: its time is not part of the shopper's wait
    post_answer: bool = False
    type: Literal["step_finished"] = "step_finished"


@dataclass(frozen=True)
class AnswerDone(_AsJson):
    """The shopper has the whole answer and nothing can take it back: the answer step
    ended, every check that holds the answer passed, and no step that may still end the
    turn (refuse it, or fail closed) is pending. Steps after the answer (validate,
    critique) may still be running; a chat client can take the next question now.

    Yielded at most once per turn, never for a refused, cut, failed or cancelled turn.

    Attributes:
        step: the answer step.
        text: the answer as the shopper saw it.
        answer_ttft_ms / answer_done_ms: the shopper's wait for the first answer token /
            the whole answer, from the turn's start.
        pending: steps not finished yet (they finish after this event).
        usage: tokens of the model calls of the steps finished so far (the answer's and
            those before it); ``unknown_calls`` counts calls whose tokens are unknown.
        conversation_id / turn_index: the turn's conversation and its 1-based position
            there (set by :meth:`chainrun.Chain.stream_turn`).
    """

    step: str
    text: str
    answer_ttft_ms: float | None
    answer_done_ms: float
    pending: tuple[str, ...] = ()
    usage: TurnUsage = field(default_factory=TurnUsage)
    conversation_id: str | None = None
    turn_index: int | None = None
    type: Literal["answer_done"] = "answer_done"


@dataclass(frozen=True)
class TurnFinished(_AsJson):
    """The turn ended; ``status`` is ok | cut | refused | replaced | error | cancelled
    (``replaced``: a validating step's ``on_reject = "replace"`` answered its safe text;
    ``cut``: the answer step failed, e.g. at its deadline, after part of its answer had
    reached the user: ``output`` is that part, ``error_type`` the step's error, and
    the steps after the answer did not run).

    ``duration_ms``: all steps done (checks after the answer included);
    ``answer_ttft_ms``: the shopper's wait for the first answer token, whatever the status
    (None: no answer token reached the user); ``answer_done_ms``: until the answer was
    complete, ok turns only (None otherwise: a cut answer never was). ``truncated``: the
    answer step's answer was cut at its token cap (finish reason ``length``; the text is
    the cut-off answer).
    ``conversation_id`` / ``turn_index``: the turn's conversation and its 1-based
    position there. ``products``: the ids of the products the turn's search showed, in
    the order shown (None: no search ran ok); a caller that keeps its own thread (a
    replay) hands them back in the next turn's history
    (:class:`~chainrun.conversations.history.HistoryTurn`).
    """

    turn_id: int | None
    run_id: int | None
    output: str | None
    status: str
    duration_ms: float
    label: str | None = None
    verdicts: dict[str, Any] = field(default_factory=dict)
    error_type: str | None = None
    answer_ttft_ms: float | None = None
    answer_done_ms: float | None = None
    truncated: bool = False
    conversation_id: str | None = None
    turn_index: int | None = None
    products: tuple[str, ...] | None = None
    #: the actions waiting for the shopper's yes that this turn asked
    #: (:class:`chainrun.tools.confirm.PendingAction`); confirm or deny one with the
    #: next turn (``Chain.stream_turn(..., confirm=ID)`` / ``deny=ID``, or a message)
    pending_actions: tuple[Any, ...] = ()
    #: what this turn decided about earlier pending actions: ``[{id, tool, decision,
    #: reply}]`` (decision ``confirmed``, ``denied``, ``expired``, ``asked_again`` or
    #: ``kept``: a request beside the action ran and the action stays pending)
    decisions: tuple[dict[str, Any], ...] = ()
    #: the turn of an earlier request with the same Idempotency-Key, read from the log:
    #: nothing ran for this request (:mod:`chainrun.desk.keys`)
    repeated: bool = False
    #: what the answer step's prompt showed after the turn's history (its sections and
    #: the message; None: not known); a caller that keeps its own thread hands it back
    #: as the next turn's ``HistoryTurn.context``, so the next prompt starts with this
    #: one (the layout prompt caches reuse)
    context: str | None = None
    #: the answer step's messages after the history when it called tools (its user
    #: message, the tool calls and their results; () when none), handed back as the next
    #: turn's ``HistoryTurn.messages``
    tool_messages: tuple[dict[str, Any], ...] = ()
    #: from the request's arrival to the turn's first step being free to start, in ms:
    #: the time at the front desk (:mod:`chainrun.desk`), part of ``duration_ms`` and
    #: ``answer_ttft_ms`` (None: not known, e.g. a repeated request's first turn)
    admit_ms: float | None = None
    type: Literal["turn_finished"] = "turn_finished"


Event = (
    StepStarted | TokenDelta | ToolCallEvent | ProductsShown | StepFinished | AnswerDone
    | TurnFinished
)
