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
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chainrun.hedging.outcome import AttemptOutcome

__all__ = [
    "AttemptOutcome",
    "CallRow",
    "RunKind",
    "RunRow",
    "RunStatus",
    "StepRow",
    "StepStatus",
    "TurnLog",
    "TurnRow",
    "TurnStatus",
    "TurnUsage",
]

RunKind = Literal["replay", "live", "eval"]
RunStatus = Literal["running", "complete", "failed", "interrupted"]
#: ok: answered; refused: a step failed closed (or a check refused); error: a provider
#: could not be reached; cancelled: the caller went away (Ctrl-C, a closed stream)
TurnStatus = Literal["ok", "refused", "replaced", "error", "cancelled"]
#: failed_open: no answer, the turn went on; failed_closed: no answer, the turn was
#: refused; skipped: never started (the turn was refused first); cancelled: stopped
#: while running (the caller went away, or a sibling failed closed)
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

    json_fields = frozenset({"meta"})
    id: int | None = None
    kind: RunKind
    label: str | None = None
    #: the ChainConfig as canonical JSON (holds no API key: only the key's variable name)
    config: str | None = None
    #: the replay / eval file, if any
    source: str | None = None
    started_at: str | None = None  # ISO-8601 UTC
    ended_at: str | None = None
    status: RunStatus = "running"
    n_turns: int | None = 0
    meta: dict[str, Any] | None = None


class TurnRow(_Row):
    """One turn of the chain: a row of ``turns``."""

    json_fields = frozenset({"verdicts"})
    id: int | None = None
    run_id: int | None = None
    request_id: str | None = None
    conversation_id: str | None = None  # gen_ai.conversation.id
    input: str
    output: str | None = None
    label: str | None = None
    status: TurnStatus = "ok"
    verdicts: dict[str, Any] = Field(default_factory=dict)
    started_at: str | None = None

    @field_validator("verdicts", mode="before")
    @classmethod
    def _no_verdicts(cls, v: Any) -> Any:
        return {} if v is None else v

    #: all steps done, checks that ran after the answer included
    duration_ms: float | None = None
    #: for replayed turns: the latency the original live turn recorded, if known
    original_ms: float | None = None
    error_type: str | None = None
    #: from the turn's start to the first token of the answer that reached the user
    #: (the shopper's wait); NULL for a turn with no answer, and for turns logged
    #: before migration 003
    answer_ttft_ms: float | None = None
    #: from the turn's start to the answer being complete
    answer_done_ms: float | None = None


class StepRow(_Row):
    """One step of one turn: a row of ``steps`` (a summary over its attempts)."""

    json_fields = frozenset({"detail"})
    id: int | None = None
    run_id: int | None = None
    turn_id: int | None = None
    step: str
    kind: str = "llm"
    status: StepStatus = "ok"
    #: when the step really started, from the turn's start (concurrent steps overlap)
    started_offset_ms: float = 0.0
    duration_ms: float = 0.0
    output: str | None = None
    error_type: str | None = None
    n_attempts: int = 0
    hedge_delay_ms: float | None = None  # the delay d in force (None: no hedging)
    hedge_fired: bool = False  # the primary was still running at d and a copy was due
    hedge_won: bool = False  # a copy settled first
    time_saved_ms: float | None = None  # measured from a shadow loser, else unknown
    detail: dict[str, Any] | None = None  # step-specific (e.g. retrieval searches)
    #: the step only reads the answer and does not hold it back: its time is not part
    #: of the shopper's wait (validate, critique)
    post_answer: bool = False


class CallRow(_Row):
    """One model call attempt: a row of ``calls``.

    The request fields (model, reasoning effort, token cap, stop) are those of the
    request actually sent, after any per-target override.
    """

    json_fields = frozenset({"chunk_gaps_ms", "server_timings", "stop"})
    id: int | None = None
    run_id: int | None = None
    turn_id: int | None = None
    step: str
    attempt: int = 1
    #: provider name from the config (the hedge target this attempt used)
    target: str | None = None
    provider: str | None = None  # gen_ai.provider.name
    server_address: str | None = None  # server.address (+ port)
    model: str | None = None  # gen_ai.request.model
    response_model: str | None = None  # gen_ai.response.model
    response_id: str | None = None  # gen_ai.response.id
    reasoning_effort: str | None = None  # chainrun.request.reasoning_effort
    stream: bool = False  # gen_ai.request.stream
    temperature: float | None = None  # gen_ai.request.temperature
    max_tokens: int | None = None  # gen_ai.request.max_tokens
    stop: list[str] | None = None  # gen_ai.request.stop_sequences
    prompt: str | None = None  # the messages sent, as JSON
    output: str | None = None
    reasoning: str | None = None
    started_at: str | None = None  # ISO-8601 UTC wall clock
    started_offset_ms: float | None = None  # from the step's start; None: never sent
    ttft_ms: float | None = None  # gen_ai.client.operation.time_to_first_chunk (as ms)
    duration_ms: float | None = None  # gen_ai.client.operation.duration (as ms)
    chunk_gaps_ms: list[float] = Field(default_factory=list)  # time between chunks
    n_chunks: int = 0
    bytes_received: int = 0
    input_tokens: int | None = None  # gen_ai.usage.input_tokens (includes cached)
    output_tokens: int | None = None  # gen_ai.usage.output_tokens (includes reasoning)
    reasoning_tokens: int | None = None  # gen_ai.usage.reasoning.output_tokens
    cached_input_tokens: int | None = None  # gen_ai.usage.cache_read.input_tokens
    finish_reason: str | None = None  # gen_ai.response.finish_reasons[0]
    truncated: bool = False
    error_type: str | None = None  # error.type (vocabulary: chainrun.errors.error_type)
    error_message: str | None = None
    #: the attempt's place in its race (None: not recorded, e.g. a row written by hand)
    outcome: AttemptOutcome | None = "not_fired"
    loop_lag_ms: float | None = None  # the client's own event-loop lag when it started
    fired_late: bool = False  # a copy fired while the client's event loop was late
    server_timings: dict[str, Any] | None = None  # llama.cpp's `timings` block, if sent

    def _json_text(self, name: str, value: Any) -> str:
        if name == "chunk_gaps_ms":
            # to the µs; f"{g:.3f}" parses back to the same float as round(g, 3) (both round
            # the exact binary value correctly) at a third of json.dumps's cost per gap
            return "[" + ",".join([f"{g:.3f}" for g in value]) + "]"
        return super()._json_text(name, value)


@dataclass(frozen=True)
class TurnUsage:
    """Tokens summed over a turn's model calls (every attempt: copies cost tokens too).

    A count a call did not report (a cancelled loser, a server that sent no usage) is
    unknown, not 0: ``unknown_calls`` says how many calls of ``calls`` added nothing.
    The GenAI conventions' inclusions hold: ``input_tokens`` includes cached ones and
    ``output_tokens`` includes reasoning ones.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0
    calls: int = 0
    unknown_calls: int = 0

    def as_json(self) -> dict[str, int]:
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

    @property
    def turn_id(self) -> int:
        assert self.turn.id is not None
        return self.turn.id

    @property
    def started_at(self) -> datetime | None:
        """The turn's wall-clock start (UTC), or None when the row has none."""
        value = self.turn.started_at
        return datetime.fromisoformat(value) if value else None

    def calls_of(self, step: str) -> list[CallRow]:
        """The calls rows of ``step``, by attempt number."""
        return sorted((c for c in self.calls if c.step == step), key=lambda c: c.attempt)

    def usage(self) -> TurnUsage:
        """The turn's tokens summed over its sent calls (see :class:`TurnUsage`)."""
        sums = {"input_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0,
                "cached_input_tokens": 0}  # fmt: skip
        calls = unknown = 0
        for c in self.calls:
            if c.outcome in UNSENT_OUTCOMES:
                continue
            calls += 1
            if c.input_tokens is None and c.output_tokens is None:
                unknown += 1
            for key in sums:
                value = getattr(c, key)
                if value is not None:
                    sums[key] += int(value)
        return TurnUsage(**sums, calls=calls, unknown_calls=unknown)
