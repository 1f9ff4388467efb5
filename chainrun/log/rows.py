"""The run log's rows: one typed model per table, used both to write and to read.

``runs`` → ``turns`` → ``steps`` and ``calls`` (one ``calls`` row per model call
attempt). The same class is filled by the chain, written by :class:`~chainrun.log.store.Store`
and handed back by ``Store.turns/steps/calls``, so report, compare, scoring and the
CLI read attributes, not dict keys. ``tests/test_store.py`` pins every model's fields
to its table's columns after all migrations (:mod:`chainrun.log.migrations`).

Column names follow the OpenTelemetry GenAI semantic conventions where one fits
(noted per field); chainrun-specific ones (hedging, reasoning effort) have no
convention and are exported with a ``chainrun.`` prefix. Times are in ms unless the
name says otherwise. ``None`` means unknown and is stored as NULL, never as 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chainrun.hedging.outcome import AttemptOutcome

__all__ = [
    "AttemptOutcome",
    "CallRow",
    "EvalResultRow",
    "RunKind",
    "RunRow",
    "RunStatus",
    "StepRow",
    "StepStatus",
    "ToolCallRow",
    "ToolCallStatus",
    "TurnLog",
    "TurnRow",
    "TurnStatus",
    "TurnUsage",
    "prompt_text",
    "winning_calls",
]

RunKind = Literal["replay", "live", "eval"]
#: ``lost_turns``: the run ended, and the log refused some of its turns' rows (they
#: returned but are not in the log; :class:`chainrun.errors.LogWriteError`)
RunStatus = Literal["running", "complete", "failed", "interrupted", "lost_turns"]
#: ok: answered; cut: the answer step failed (its deadline, a broken stream) after part
#: of its answer had reached the user, which is the turn's output (``error_type`` says
#: why); refused: a step failed closed (or a check refused); replaced: a validating
#: step answered its safe text instead; error: a provider could not be reached;
#: cancelled: the caller went away (Ctrl-C, a closed stream); lost: its process died
#: before the turn was logged (logged from the index it had claimed on a shared log)
TurnStatus = Literal["ok", "cut", "refused", "replaced", "error", "cancelled", "lost"]
#: failed_open: no answer, the turn went on; failed_closed: no answer, the turn was
#: refused (or, for the answer step once part of its answer had reached the user, the
#: turn ended ``cut``); skipped: never started (the turn was refused first);
#: cancelled: stopped while running (the caller went away, or a sibling failed closed)
StepStatus = Literal["ok", "failed_open", "failed_closed", "skipped", "cancelled"]

#: the attempt outcomes whose answer a step used (the race's winner)
WINNER_OUTCOMES: tuple[AttemptOutcome, ...] = ("not_fired", "primary", "duplicate")
#: the attempt outcomes of requests really sent to a server
SENT_OUTCOMES: tuple[AttemptOutcome, ...] = (
    "not_fired", "primary", "duplicate", "cancelled", "shadow_finished", "rejected", "error",
)  # fmt: skip


class _Row(BaseModel):
    """A table row. JSON columns (lists, dicts) are encoded on write, decoded on read."""

    model_config = ConfigDict(extra="ignore")
    #: fields stored as JSON text
    json_fields: ClassVar[frozenset[str]] = frozenset()

    def to_db(self) -> dict[str, Any]:
        """The row as the table's columns (``id`` left out while it is None).

        Read from the instance's ``__dict__`` (the fields, in declaration order), not
        ``model_dump()``: every field is a scalar or JSON data that is encoded here, so
        the deep copy ``model_dump`` makes bought nothing (it was most of the cost of
        writing a turn's rows, on the event loop).
        """
        row = dict(self.__dict__)
        for name in self.json_fields:
            value = row[name]
            if value is not None:
                row[name] = self._json_text(name, value)
        if row["id"] is None:
            del row["id"]
        return row

    def _json_text(self, name: str, value: Any) -> str:
        """A JSON column's text."""
        if not value and isinstance(value, dict | list):
            return "{}" if isinstance(value, dict) else "[]"  # the common empty verdicts
        return json.dumps(value, ensure_ascii=False)

    @classmethod
    def from_db(cls, row: Mapping[str, Any]) -> Self:
        """A row read back from SQLite (JSON columns decoded, 0/1 as bool)."""
        data = dict(row)
        for name in cls.json_fields:
            value = data.get(name)
            if isinstance(value, str):
                data[name] = json.loads(value)
        return cls.model_validate(data)


class RunRow(_Row):
    """One run: a replay, an eval or the live turns of one chain object."""

    table: ClassVar[str] = "runs"

    json_fields = frozenset({"meta"})
    #: the run's number in this log
    id: int | None = None
    #: replay, eval or live
    kind: RunKind
    #: the label given with --label, if any
    label: str | None = None
    #: the ChainConfig as canonical JSON (holds no API key: only the key's variable name)
    config: str | None = None
    #: the replay / eval file, if any
    source: str | None = None
    #: when the run started (ISO-8601 UTC)
    started_at: str | None = None  # ISO-8601 UTC
    #: when the run ended; NULL while running or when its process died
    ended_at: str | None = None
    #: running, complete, failed or interrupted (the writing process is gone)
    status: RunStatus = "running"
    #: turns logged in the run
    n_turns: int | None = 0
    #: run-level facts as JSON, e.g. the writing process (``writer``: host, pid, start time)
    meta: dict[str, Any] | None = None


class TurnRow(_Row):
    """One turn of the chain: a row of ``turns``."""

    table: ClassVar[str] = "turns"

    json_fields = frozenset({"verdicts"})
    #: the turn's id (reserved before its row is written: the id TurnFinished returns)
    id: int | None = None
    #: the run it belongs to (runs.id)
    run_id: int | None = None
    #: the request's id in a replay or eval file ("CASE#REPEAT" for evals)
    request_id: str | None = None
    #: the chat it belongs to (OpenTelemetry: gen_ai.conversation.id)
    conversation_id: str | None = None  # gen_ai.conversation.id
    #: the turn's 1-based position in its conversation (NULL: logged before conversations
    #: had turn indexes)
    turn_index: int | None = None
    #: the user's message as logged (matches of redacting checks masked)
    input: str
    #: the answer that reached the user (a refusal's text for a refused turn; for a
    #: cut, cancelled or failed turn the part of the answer streamed before it ended,
    #: NULL when none was)
    output: str | None = None
    #: the classify label the turn got, if any
    label: str | None = None
    #: ok, cut, refused, replaced, error, cancelled or lost
    status: TurnStatus = "ok"
    #: every checking step's verdict, by step name (JSON)
    verdicts: dict[str, Any] = Field(default_factory=dict)
    #: when the turn started (ISO-8601 UTC)
    started_at: str | None = None

    @field_validator("verdicts", mode="before")
    @classmethod
    def _no_verdicts(cls, v: Any) -> Any:
        return {} if v is None else v

    #: all steps done, checks that ran after the answer included
    duration_ms: float | None = None
    #: for replayed turns: the latency the original live turn recorded, if known
    original_ms: float | None = None
    #: from the request's arrival to the turn's first step being free to start: the time
    #: at the front desk (the run's creation, the owner check, the key, the conversation's
    #: place and pending actions: mostly waits on the log); part of ``duration_ms`` and
    #: ``answer_ttft_ms`` (NULL: turns logged before migration 250)
    admit_ms: float | None = None
    #: why the turn failed, if it did (see error types)
    error_type: str | None = None
    #: from the turn's start to the first token of the answer that reached the user
    #: (the shopper's wait); NULL for a turn with no answer, and for turns logged
    #: before migration 003
    answer_ttft_ms: float | None = None
    #: from the turn's start to the answer being complete
    answer_done_ms: float | None = None
    #: the answer step's answer was cut at its token cap (finish reason ``length``); the
    #: turn's output is the cut-off text (NULL, read as false, for turns logged before
    #: migration 060)
    truncated: bool = False

    @field_validator("truncated", mode="before")
    @classmethod
    def _null_is_not_truncated(cls, v: Any) -> Any:
        return False if v is None else v

    #: the shopper the turn was for, as the shop vouched for them (NULL: no identity)
    user_id: str | None = None
    #: the client's ``Idempotency-Key`` the turn was started with (NULL: none)
    idempotency_key: str | None = None


class StepRow(_Row):
    """One step of one turn: a row of ``steps`` (a summary over its attempts)."""

    table: ClassVar[str] = "steps"

    json_fields = frozenset({"detail", "updates"})
    #: row id
    id: int | None = None
    #: the run (runs.id)
    run_id: int | None = None
    #: the turn (turns.id)
    turn_id: int | None = None
    #: the step's name in the config
    step: str
    #: the step's kind (llm, guard, retrieve, ...)
    kind: str = "llm"
    #: ok, failed_open, failed_closed, skipped or cancelled
    status: StepStatus = "ok"
    #: when the step really started, from the turn's start (concurrent steps overlap)
    started_offset_ms: float = 0.0
    #: from the step's start to its end, all attempts included
    duration_ms: float = 0.0
    #: the step's output text (the answer, a label, a verdict, the products found)
    output: str | None = None
    #: why the step failed, if it did (see error types)
    error_type: str | None = None
    #: attempts sent (1 when not hedged)
    n_attempts: int = 0
    #: the hedge delay d in force for this call (NULL: not hedged)
    hedge_delay_ms: float | None = None  # the delay d in force (None: no hedging)
    #: the primary was still running at d and a copy was due
    hedge_fired: bool = False  # the primary was still running at d and a copy was due
    #: a copy settled first
    hedge_won: bool = False  # a copy settled first
    #: the primary's answer minus the winning copy's, once the primary (left to finish as a
    #: shadow) answered; NULL when unknown or when the primary won
    time_saved_ms: float | None = None  # measured from a shadow loser, else unknown
    #: step-specific facts as JSON (e.g. retrieval searches, output check figures)
    detail: dict[str, Any] | None = None  # step-specific (e.g. retrieval searches)
    #: the turn-state fields the step handed on, as JSON by field name (each field's
    #: logged form, e.g. ``products``: a list of product objects); NULL: it set none
    #: (failed, skipped, a check), or it was logged before migration 090
    updates: dict[str, Any] | None = None
    #: the step only reads the answer and does not hold it back: its time is not part
    #: of the shopper's wait (validate, critique)
    post_answer: bool = False
    #: the step's answer was cut at its token cap (its winning call's finish reason is
    #: ``length``; the Responses API's ``response.incomplete``, ``max_output_tokens``);
    #: NULL, read as false, for steps logged before migration 060
    truncated: bool = False

    @field_validator("truncated", mode="before")
    @classmethod
    def _null_is_not_truncated(cls, v: Any) -> Any:
        return False if v is None else v

    def hedge_rounds(self) -> list[HedgeRound]:
        """The step's model call, round by round: a call with tools logs each round's
        hedge in ``detail["hedge_rounds"]``; any other step has one round, this row's."""
        logged = (self.detail or {}).get("hedge_rounds")
        if isinstance(logged, list) and logged:
            return [HedgeRound(int(r.get("round", i + 1)), bool(r.get("fired")),
                               bool(r.get("won")), r.get("time_saved_ms"))
                    for i, r in enumerate(logged) if isinstance(r, dict)]  # fmt: skip
        return [HedgeRound(1, bool(self.hedge_fired), bool(self.hedge_won), self.time_saved_ms)]


@dataclass(frozen=True)
class HedgeRound:
    """One round of a step's model call as hedged (:meth:`StepRow.hedge_rounds`).

    Attributes:
        round: the round, from 1.
        fired: a copy became due (the primary was still running at the delay d).
        won: a copy (or retry) answered first.
        time_saved_ms: the primary's answer minus the winning copy's, when measured.
    """

    round: int
    fired: bool
    won: bool
    time_saved_ms: float | None = None


class CallRow(_Row):
    """One model call attempt: a row of ``calls``.

    The request fields (model, reasoning effort, token cap, stop) are those of the
    request actually sent, after any per-target override.
    """

    table: ClassVar[str] = "calls"

    json_fields = frozenset({"chunk_gaps_ms", "server_timings", "stop"})
    #: row id
    id: int | None = None
    #: the run (runs.id)
    run_id: int | None = None
    #: the turn (turns.id)
    turn_id: int | None = None
    #: the step's name
    step: str
    #: 1 for the original, 2, 3, ... for hedge copies (numbered within its round)
    attempt: int = 1
    #: the round of the step's model call: 1, then one more for each time the model
    #: asked for tools and got their results (NULL, read as 1, before migration 130)
    round: int = 1
    #: provider name from the config (the hedge target this attempt used)
    target: str | None = None
    #: the provider's kind (OpenTelemetry: gen_ai.provider.name)
    provider: str | None = None  # gen_ai.provider.name
    #: the server's host and port (OpenTelemetry: server.address, server.port)
    server_address: str | None = None  # server.address (+ port)
    #: the model asked for (OpenTelemetry: gen_ai.request.model)
    model: str | None = None  # gen_ai.request.model
    #: the model the server said answered (OpenTelemetry: gen_ai.response.model)
    response_model: str | None = None  # gen_ai.response.model
    #: the server's id of the response (OpenTelemetry: gen_ai.response.id)
    response_id: str | None = None  # gen_ai.response.id
    #: the reasoning effort sent (exported as chainrun.request.reasoning_effort)
    reasoning_effort: str | None = None  # chainrun.request.reasoning_effort
    #: the request was streamed (OpenTelemetry: gen_ai.request.stream)
    stream: bool = False  # gen_ai.request.stream
    #: the temperature sent (OpenTelemetry: gen_ai.request.temperature)
    temperature: float | None = None  # gen_ai.request.temperature
    #: the token cap sent, visible plus reasoning (OpenTelemetry: gen_ai.request.max_tokens)
    max_tokens: int | None = None  # gen_ai.request.max_tokens
    #: the stop sequences sent, JSON list (OpenTelemetry: gen_ai.request.stop_sequences)
    stop: list[str] | None = None  # gen_ai.request.stop_sequences
    #: the messages sent, as JSON text (UTF-8, not ASCII-escaped). While the turn runs
    #: the step hands the message list itself: it is masked (``[log] redact``) as data and
    #: encoded once, when the row is written (:func:`prompt_text`)
    prompt: str | list[dict[str, Any]] | None = None
    #: the text the call returned (what arrived, for a cut or cancelled call)
    output: str | None = None
    #: reasoning text the server streamed, if any
    reasoning: str | None = None
    #: when the request was sent (ISO-8601 UTC wall clock)
    started_at: str | None = None  # ISO-8601 UTC wall clock
    #: when the request was sent, from the step's start (NULL: never sent)
    started_offset_ms: float | None = None  # from the step's start; None: never sent
    #: time to first token: from sending to the first content or reasoning chunk
    #: (OpenTelemetry: gen_ai.client.operation.time_to_first_chunk, in s there)
    ttft_ms: float | None = None  # gen_ai.client.operation.time_to_first_chunk (as ms)
    #: from sending to the first piece of a tool call (a round that asks for tools has
    #: no TTFT when it streams no text: this is its first event); NULL: none came
    first_tool_call_ms: float | None = None
    #: from sending to the end of the stream (OpenTelemetry:
    #: gen_ai.client.operation.duration, in s there)
    duration_ms: float | None = None  # gen_ai.client.operation.duration (as ms)
    #: time between consecutive chunks, JSON list (one fewer than n_chunks)
    chunk_gaps_ms: list[float] = Field(default_factory=list)  # time between chunks
    #: the time between tokens: the mean gap between the chunks that carried text
    #: (content or reasoning), in ms (:attr:`chainrun.timing.StreamTimer.time_between_tokens_ms`);
    #: NULL with fewer than two such chunks, and in rows logged before it was recorded
    time_between_tokens_ms: float | None = None
    #: chunks received (see what is measured: chunks)
    n_chunks: int = 0
    #: bytes of the response received (what a cancelled loser cost on the wire)
    bytes_received: int = 0
    #: prompt tokens, cached ones included; NULL when not reported (OpenTelemetry:
    #: gen_ai.usage.input_tokens)
    input_tokens: int | None = None  # gen_ai.usage.input_tokens (includes cached)
    #: generated tokens, reasoning ones included; NULL when not reported (OpenTelemetry:
    #: gen_ai.usage.output_tokens)
    output_tokens: int | None = None  # gen_ai.usage.output_tokens (includes reasoning)
    #: reasoning tokens, a subset of output_tokens (OpenTelemetry:
    #: gen_ai.usage.reasoning.output_tokens)
    reasoning_tokens: int | None = None  # gen_ai.usage.reasoning.output_tokens
    #: prompt tokens served from the server's cache, a subset of input_tokens (OpenTelemetry:
    #: gen_ai.usage.cache_read.input_tokens)
    cached_input_tokens: int | None = None  # gen_ai.usage.cache_read.input_tokens
    #: why generation stopped: stop, length, ... (OpenTelemetry: gen_ai.response.finish_reasons)
    finish_reason: str | None = None  # gen_ai.response.finish_reasons[0]
    #: the stream ended without a finish reason (see what is measured: truncated answers)
    truncated: bool = False
    #: why the call failed, if it did (OpenTelemetry: error.type; see error types)
    error_type: str | None = None  # error.type (vocabulary: chainrun.errors.error_type)
    #: the error's message (the server's own where it sent one)
    error_message: str | None = None
    #: the attempt's place in its race (None: not recorded, e.g. a row written by hand)
    outcome: AttemptOutcome | None = "not_fired"
    #: the client's own event-loop lag when the attempt started
    loop_lag_ms: float | None = None  # the client's own event-loop lag when it started
    #: a copy fired while the client's event loop was late
    fired_late: bool = False  # a copy fired while the client's event loop was late
    #: how long the attempt waited for room in its provider's rate limit before it was
    #: sent, in ms (NULL: it did not wait; only a call's first attempt waits)
    rate_limit_wait_ms: float | None = None
    #: llama.cpp's own timings block (prompt_ms, predicted_ms, ...), if the server sent one
    server_timings: dict[str, Any] | None = None  # llama.cpp's `timings` block, if sent

    @field_validator("round", mode="before")
    @classmethod
    def _null_is_round_one(cls, v: Any) -> Any:
        return 1 if v is None else v

    @property
    def first_event_ms(self) -> float | None:
        """From sending to the call's first event, in ms: its TTFT, or, for a round that
        asked for tools and streamed no text, its first tool-call piece (None: neither)."""
        return self.ttft_ms if self.ttft_ms is not None else self.first_tool_call_ms

    def _json_text(self, name: str, value: Any) -> str:
        if name == "chunk_gaps_ms":
            # to the µs; f"{g:.3f}" parses back to the same float as round(g, 3) (both round
            # the exact binary value correctly) at a third of json.dumps's cost per gap
            return "[" + ",".join([f"{g:.3f}" for g in value]) + "]"
        return super()._json_text(name, value)

    def to_db(self) -> dict[str, Any]:
        """The row as the table's columns, the prompt encoded as JSON text if it is still
        the message list (:func:`prompt_text`)."""
        row = super().to_db()
        if isinstance(row["prompt"], list):
            row["prompt"] = prompt_text(row["prompt"])
        return row


@dataclass(frozen=True)
class TurnUsage:
    """Tokens summed over a turn's model calls (every attempt: copies cost tokens too).

    A count a call did not report (a cancelled loser, a server that sent no usage) is
    unknown, not 0: a field no call reported is None (a server that never sends
    ``prompt_tokens_details`` leaves ``cached_input_tokens`` None, never 0); a field some
    calls reported is their sum; ``unknown_calls`` says how many calls of ``calls`` added
    nothing. The GenAI conventions' inclusions hold: ``input_tokens`` includes cached
    ones and ``output_tokens`` includes reasoning ones.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_input_tokens: int | None = None
    calls: int = 0
    unknown_calls: int = 0

    def as_json(self) -> dict[str, int | None]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "calls": self.calls,
            "unknown_calls": self.unknown_calls,
        }


#: attempts the hedging engine decided not to send (no request left the process)
UNSENT_OUTCOMES = frozenset({"budget_exhausted", "suppressed"})


ToolCallStatus = Literal[
    "ok", "error", "timeout", "invalid_arguments", "unknown_tool", "not_started", "stubbed",
    "recorded", "awaiting_confirmation", "confirmed", "denied", "expired",
]


class EvalResultRow(_Row):
    """One assertion's verdict on one turn of an eval run: a row of ``eval_results``,
    written by ``chainrun eval`` (:func:`chainrun.evals.scoring.score_run`)."""

    table: ClassVar[str] = "eval_results"
    #: row id
    id: int | None = None
    #: the eval run (runs.id)
    run_id: int | None = None
    #: the turn judged (turns.id)
    turn_id: int | None = None
    #: the eval case's id
    case_id: str
    #: which repeat of the case (0: the first)
    repeat: int = 0
    #: the assertion type (equals, regex, llm-rubric, ...)
    type: str
    #: the step judged (NULL: the final answer, or the whole turn)
    step: str | None = None
    #: the verdict (NULL: skipped, no verdict given; ``detail`` says why)
    passed: bool | None = None
    #: what the assertion saw, or why it was skipped
    detail: str | None = None
    #: the grader configuration an llm-rubric verdict was given under (JSON text; NULL
    #: for other types)
    grader: str | None = None
    #: when the verdict was given (ISO-8601 UTC)
    scored_at: str | None = None


class ReviewJudgementRow(_Row):
    """One reviewer's judgement of one request's two answers, shown side by side in a
    blind, random order (``chainrun review A B``): a row of ``review_judgements``."""

    table: ClassVar[str] = "review_judgements"
    json_fields: ClassVar[frozenset[str]] = frozenset({"tags"})
    #: row id
    id: int | None = None
    #: the baseline run (runs.id)
    run_a: int
    #: the candidate run (runs.id), answering the same requests
    run_b: int
    #: the request both runs answered (turns.request_id)
    request_id: str
    #: who judged (``--reviewer``)
    reviewer: str
    #: when (ISO-8601 UTC)
    judged_at: str
    #: the run shown on the left (run_a or run_b): the order the reviewer saw
    left_run: int
    #: what the reviewer picked: ``left``, ``same`` or ``right``
    choice: Literal["left", "same", "right"]
    #: the run whose answer was judged better (NULL: the same)
    preferred_run: int | None = None
    #: tags per run: ``{"a": [...], "b": [...]}`` (invented fact, wrong route, rude,
    #: unhelpful, too long)
    tags: dict[str, list[str]] = Field(default_factory=dict)
    #: the reviewer's note
    note: str | None = None


class ToolCallRow(_Row):
    """One tool call a model asked for: a row of ``tool_calls`` (see
    :mod:`chainrun.tools.runner` for what each status means). Times in ms; offsets from
    the step's start; NULL: the tool never started."""

    table: ClassVar[str] = "tool_calls"
    #: row id
    id: int | None = None
    #: the run (runs.id)
    run_id: int | None = None
    #: the turn (turns.id)
    turn_id: int | None = None
    #: the step whose model asked
    step: str
    #: the model call attempt that asked (the hedged race's winner)
    attempt: int = 1
    #: the step's tool round (1: the model's answer to the message)
    round: int = 1
    call_id: str  # gen_ai.tool.call.id
    tool: str  # gen_ai.tool.name
    #: the arguments as the model sent them (JSON text; ``[log] redact`` applied)
    arguments: str | None = None
    #: ``"{turn id}:{step}:{round}:{position}"``, handed to the tool
    idempotency_key: str | None = None
    #: the tool's ``side_effects`` (False for a name that is no tool)
    side_effects: bool = False
    #: ok | error | timeout | invalid_arguments | unknown_tool | not_started | stubbed
    #: (a replay or an eval did not carry out a side-effecting tool: ``[tools.NAME] replay``)
    status: ToolCallStatus = "ok"
    #: when the tool started, from the step's start (NULL: it never started)
    started_offset_ms: float | None = None
    #: how long it ran (NULL: it never started)
    duration_ms: float | None = None
    #: what the model was told: the result, or ``{"error": ...}`` (JSON text)
    result: str | None = None
    #: invalid_arguments, unknown_tool, timeout, not_started, result_not_json or the
    #: exception's class name (NULL: ok)
    error_type: str | None = None
    #: the error as the model was told it
    error_message: str | None = None
    #: the turn was cancelled while the tool ran; it was awaited to its end
    turn_cancelled: bool = False
    #: how the call was read where the server strayed from the API's shape, comma-separated
    #: (``index_inferred``, ``new_call_on_same_index``, ``name_fragments_joined``,
    #: ``arguments_object``, ``fragment_reattached``, ``id_missing``, ``id_reused``:
    #: :class:`chainrun.timing.ToolCallAssembler`); NULL: as the API documents it
    wire_notes: str | None = None
    #: a ``confirm`` tool's call (status ``awaiting_confirmation``, then ``confirmed``,
    #: ``denied`` or ``expired``): the question chainrun asked, from the arguments
    question: str | None = None
    #: when the pending action expires (ISO-8601 UTC)
    expires_at: str | None = None
    #: the last turn index of the conversation that may decide it
    expires_after_turn: int | None = None
    #: who decided: the shopper's user id, ``shopper`` (no identity), ``new_request``
    #: (the shopper asked for something else) or ``expiry``
    decided_by: str | None = None
    #: when it was decided (ISO-8601 UTC)
    decided_at: str | None = None
    #: the turn that decided it
    decided_turn_id: int | None = None
    #: a run of a confirmed action: the action's id (the asking call's idempotency key)
    action_id: str | None = None


@dataclass
class TurnLog:
    """A turn's row with its steps' and calls' rows: what the chain writes in one
    transaction and what ``Store.turn`` reads back.

    ``steps`` are in display order; each call's ``started_offset_ms`` is from its
    step's start, each step's from the turn's start.
    """

    turn: TurnRow
    steps: list[StepRow] = field(default_factory=list)
    calls: list[CallRow] = field(default_factory=list)
    #: the tool calls the turn's models asked for, in the order asked
    tool_calls: list[ToolCallRow] = field(default_factory=list)

    @property
    def turn_id(self) -> int:
        assert self.turn.id is not None
        return self.turn.id

    @property
    def started_at(self) -> datetime | None:
        """The turn's wall-clock start (UTC), or None when the row has none."""
        value = self.turn.started_at
        return datetime.fromisoformat(value) if value else None

    def tool_calls_of(self, step: str) -> list[ToolCallRow]:
        """The tool calls ``step``'s model asked for, in the order asked."""
        return [t for t in self.tool_calls if t.step == step]

    def calls_of(self, step: str) -> list[CallRow]:
        """The calls rows of ``step``, by round, then attempt number."""
        return sorted((c for c in self.calls if c.step == step),
                      key=lambda c: (c.round, c.attempt))  # fmt: skip

    def usage(self) -> TurnUsage:
        """The turn's tokens summed over its sent calls (see :class:`TurnUsage`)."""
        return calls_usage(self.calls)


def calls_usage(calls: Iterable[CallRow]) -> TurnUsage:
    """Tokens summed over the sent calls among ``calls`` (see :class:`TurnUsage`): a count
    no call reported is None, never 0."""
    sums: dict[str, int | None] = dict.fromkeys(
        ("input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens")
    )
    n = unknown = 0
    for c in calls:
        if c.outcome in UNSENT_OUTCOMES:
            continue
        n += 1
        if c.input_tokens is None and c.output_tokens is None:
            unknown += 1
        for key in sums:
            value = getattr(c, key)
            if value is not None:
                sums[key] = (sums[key] or 0) + int(value)
    return TurnUsage(**sums, calls=n, unknown_calls=unknown)


def round_winners(calls: Iterable[CallRow]) -> dict[tuple[int, str, int], CallRow]:
    """The attempt that won each round of each step's call, by ``(turn_id, step, round)``
    (turn id 0 for rows not logged yet): the call with ``outcome`` in
    :data:`WINNER_OUTCOMES` (the last without an error if a round has several)."""
    best: dict[tuple[int, str, int], CallRow] = {}
    for c in calls:
        if c.outcome not in WINNER_OUTCOMES:
            continue
        key = (c.turn_id or 0, c.step, c.round)
        prev = best.get(key)
        if prev is None or (c.error_type is None, c.attempt) >= (prev.error_type is None,
                                                                  prev.attempt):  # fmt: skip
            best[key] = c
    return best


def winning_calls(calls: Iterable[CallRow]) -> dict[tuple[int, str], CallRow]:
    """The attempt whose answer each step used, by ``(turn_id, step)`` (turn id 0 for rows
    not logged yet): the call with ``outcome`` in :data:`WINNER_OUTCOMES`; if a step has
    several (retries, or rounds of a call with tools), the last one without an error (the
    last round's: the answer)."""
    best: dict[tuple[int, str], CallRow] = {}
    for (turn, step, _), c in sorted(round_winners(calls).items(), key=lambda kv: kv[0][2]):
        prev = best.get((turn, step))
        if prev is None or (c.error_type is None) >= (prev.error_type is None):
            best[(turn, step)] = c
    return best


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """The one encoding of ``calls.prompt``: the messages as JSON, non-ASCII text kept as
    UTF-8 (``ensure_ascii=False``), whether or not ``[log] redact`` masked them first."""
    return json.dumps(messages, ensure_ascii=False)
