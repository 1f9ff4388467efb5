"""What the run log stores: one record type per table row.

Column names follow the OpenTelemetry GenAI semantic conventions where one fits
(noted per field); chainrun-specific ones (hedging, reasoning effort) have no
convention and would be exported with a ``chainrun.`` prefix.
All times are in ms unless the name says otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from chainrun.hedging.outcome import AttemptOutcome

RunKind = Literal["replay", "live", "eval"]
RunStatus = Literal["running", "complete", "failed", "interrupted"]


@dataclass
class CallRecord:
    """One model call attempt: a row of ``calls``."""

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
    prompt: str | None = None  # the messages sent, as JSON
    output: str | None = None
    reasoning: str | None = None
    started_at: str | None = None  # ISO-8601 UTC wall clock
    started_offset_ms: float = 0.0  # from the step's start
    ttft_ms: float | None = None  # gen_ai.client.operation.time_to_first_chunk (as ms)
    duration_ms: float | None = None  # gen_ai.client.operation.duration (as ms)
    chunk_gaps_ms: list[float] = field(default_factory=list)  # time between chunks
    n_chunks: int = 0
    bytes_received: int = 0
    input_tokens: int | None = None  # gen_ai.usage.input_tokens (includes cached)
    output_tokens: int | None = None  # gen_ai.usage.output_tokens (includes reasoning)
    reasoning_tokens: int | None = None  # gen_ai.usage.reasoning.output_tokens
    cached_input_tokens: int | None = None  # gen_ai.usage.cache_read.input_tokens
    finish_reason: str | None = None  # gen_ai.response.finish_reasons[0]
    truncated: bool = False
    error_type: str | None = None  # error.type
    error_message: str | None = None
    outcome: AttemptOutcome = "not_fired"  # its place in the hedged race (chainrun.hedging)
    loop_lag_ms: float | None = None  # the client's own event-loop lag when it started
    fired_late: bool = False  # a copy fired while the client's event loop was late
    server_timings: dict[str, Any] | None = None  # llama.cpp's `timings` block, if sent

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepRecord:
    """One step of one turn: a row of ``steps`` (summary over its attempts)."""

    step: str
    kind: str = "llm"
    status: str = "ok"  # ok | failed_open | failed_closed | skipped | cancelled
    started_offset_ms: float = 0.0  # from the turn's start
    duration_ms: float = 0.0
    output: str | None = None
    error_type: str | None = None
    n_attempts: int = 0
    hedge_delay_ms: float | None = None  # the delay d in force (None: no hedging)
    hedge_fired: bool = False  # the primary was still running at d and a copy was due
    hedge_won: bool = False  # a copy settled first
    time_saved_ms: float | None = None  # measured from a shadow loser, else unknown
    detail: dict[str, Any] | None = None  # step-specific (e.g. retrieval searches)


@dataclass
class TurnRecord:
    """One turn of the chain: a row of ``turns``, with its steps and calls."""

    input: str
    request_id: str | None = None
    conversation_id: str | None = None  # gen_ai.conversation.id
    output: str | None = None
    label: str | None = None
    status: str = "ok"  # ok | refused | error | cancelled
    verdicts: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    duration_ms: float | None = None
    #: for replayed turns: the latency the original live turn recorded, if known
    original_ms: float | None = None
    error_type: str | None = None
    steps: list[StepRecord] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
