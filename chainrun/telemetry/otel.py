"""OpenTelemetry export of logged turns: spans and GenAI client metrics (extra ``chainrun[otel]``).

Built from what the run log holds once a turn is logged
(:class:`~chainrun.log.rows.TurnLog`), so spans carry exactly the log's facts,
with the log's times:

* one span per turn: ``invoke_workflow {workflow}`` (``gen_ai.operation.name =
  invoke_workflow``, ``gen_ai.conversation.id``, the turn's summed usage);
* one per step: ``retrieval {step}`` for a retrieve step, ``step {step}`` for a model
  step (with its hedge summary);
* one per sent attempt of a model step: ``chat {model}`` with the GenAI attributes
  (``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.response.id``, ``gen_ai.response.finish_reasons``, ``gen_ai.request.*``,
  ``gen_ai.usage.input_tokens`` (includes cached), ``gen_ai.usage.output_tokens``
  (includes reasoning), ``gen_ai.usage.reasoning.output_tokens``,
  ``gen_ai.usage.cache_read.input_tokens``, ``server.address``/``server.port``,
  ``error.type``) and ``chainrun.*`` for what has no convention: reasoning effort,
  hedge attempt, target and outcome, TTFT in ms;
* one per tool call: ``execute_tool {tool}`` (``gen_ai.operation.name = execute_tool``,
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type = function``,
  ``gen_ai.tool.call.arguments`` as logged, after ``[log] redact``) with
  ``chainrun.tool.*`` for its status, idempotency key, round and side effects, and the
  attempt that asked (``chainrun.hedge.attempt``).

Metrics (histograms in s or tokens, names and bucket boundaries from the OpenTelemetry
GenAI semantic conventions, "Metrics for GenAI client operations"), one record per sent
attempt and never when the value is unknown (a NULL in the log):
``gen_ai.client.operation.duration``, ``gen_ai.client.operation.time_to_first_chunk``,
``gen_ai.client.operation.time_per_output_chunk`` (one record per gap between chunks)
and ``gen_ai.client.token.usage`` (``gen_ai.token.type`` = input | output).

:func:`telemetry_from_env` sets up the standard OTLP/HTTP exporters, which read the
standard ``OTEL_EXPORTER_OTLP_*`` variables; ``OTEL_SERVICE_NAME`` names the service
(default ``chainrun``) and each process adds ``service.instance.id`` (host:pid) so a
fleet's spans tell processes apart.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chainrun.errors import ConfigError
from chainrun.log.rows import UNSENT_OUTCOMES, CallRow, StepRow, ToolCallRow, TurnLog
from chainrun.retrieval.products import PRODUCTS_FIELD

if TYPE_CHECKING:  # the otel extra is optional: imported lazily below
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

#: gen_ai.client.operation.duration / time_to_first_chunk bucket boundaries, in s (semconv)
DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                      20.48, 40.96, 81.92)  # fmt: skip
#: gen_ai.client.operation.time_per_output_chunk bucket boundaries, in s (semconv)
CHUNK_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
#: gen_ai.client.token.usage bucket boundaries, in tokens (semconv)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)  # fmt: skip

INSTALL_HINT = "OpenTelemetry export needs the otel extra: pip install 'chainrun[otel]'"


def _otel() -> Any:
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return trace, metrics


def _ns(start: datetime, offset_ms: float) -> int:
    return int(start.timestamp() * 1e9) + int(offset_ms * 1e6)


def _set(span: Span, attrs: Mapping[str, Any]) -> None:
    """Set the attributes whose value is known (OpenTelemetry has no null)."""
    for key, value in attrs.items():
        if value is not None:
            span.set_attribute(key, value)


def _server(address: str | None) -> tuple[str | None, int | None]:
    if not address:
        return None, None
    host, _, port = address.rpartition(":")
    if host and port.isdigit():
        return host.strip("[]"), int(port)
    return address, None


class Telemetry:
    """Turns logged turns into spans and GenAI metrics (a
    :class:`~chainrun.serve.turns.TurnObserver`).

    Args:
        tracer_provider: where spans go (None: the global one, e.g. an app's own setup).
        meter_provider: where metrics go (None: the global one).
        workflow: the workflow's name in the turn span's name (the served model id).

    Raises:
        ConfigError: the ``otel`` extra is not installed.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        workflow: str = "chainrun",
    ) -> None:
        trace, metrics = _otel()
        self._trace = trace
        self.workflow = workflow
        self.tracer = trace.get_tracer("chainrun", tracer_provider=tracer_provider)
        meter = metrics.get_meter("chainrun", meter_provider=meter_provider)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )  # fmt: skip
        self.ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk", unit="s",
            description="Time to receive the first chunk of a streamed response",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )  # fmt: skip
        self.tpoc = meter.create_histogram(
            "gen_ai.client.operation.time_per_output_chunk", unit="s",
            description="Time between consecutive chunks of a streamed response",
            explicit_bucket_boundaries_advisory=CHUNK_BUCKETS_S,
        )  # fmt: skip
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )  # fmt: skip

    # -- the observer hook -------------------------------------------------------------
    def turn_logged(self, turn: TurnLog) -> None:
        """Emit the spans and metrics of one logged turn (quick: spans go to a batch
        processor, which exports them from its own thread)."""
        start = turn.started_at
        if start is None:
            return
        row = turn.turn
        usage = turn.usage()
        span = self.tracer.start_span(
            f"invoke_workflow {self.workflow}",
            kind=self._trace.SpanKind.INTERNAL,
            start_time=_ns(start, 0.0),
        )
        _set(span, {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.conversation.id": row.conversation_id,
            "gen_ai.usage.input_tokens": usage.input_tokens if usage.calls else None,
            "gen_ai.usage.output_tokens": usage.output_tokens if usage.calls else None,
            "chainrun.run.id": row.run_id,
            "chainrun.turn.id": row.id,
            "chainrun.turn.status": row.status,
            "chainrun.turn.label": row.label,
            "chainrun.turn.answer_ttft_ms": row.answer_ttft_ms,
            "chainrun.turn.answer_done_ms": row.answer_done_ms,
            "chainrun.turn.calls_usage_unknown": usage.unknown_calls,
            "error.type": row.error_type or (
                row.status if row.status in ("error", "cancelled", "cut") else None),
        })  # fmt: skip
        if row.status in ("error", "cancelled", "cut"):
            span.set_status(self._trace.StatusCode.ERROR, row.status)
        ctx = self._trace.set_span_in_context(span)
        for step in turn.steps:
            self._step(turn, step, start, ctx)
        span.end(end_time=_ns(start, row.duration_ms or 0.0))

    def _step(self, turn: TurnLog, step: StepRow, start: datetime, ctx: Any) -> None:
        if step.status == "skipped":
            return
        offset = step.started_offset_ms or 0.0
        # a search step, whatever its kind: it logged searches or handed on products
        retrieve = "searches" in (step.detail or {}) or PRODUCTS_FIELD in (step.updates or {})
        name = f"retrieval {step.step}" if retrieve else f"step {step.step}"
        span = self.tracer.start_span(name, context=ctx, start_time=_ns(start, offset))
        attrs: dict[str, Any] = {
            "chainrun.step.name": step.step,
            "chainrun.step.kind": step.kind,
            "chainrun.step.status": step.status,
            "error.type": step.error_type,
        }
        if retrieve:
            attrs["gen_ai.operation.name"] = "retrieval"
            detail = step.detail or {}
            attrs["chainrun.retrieval.results"] = len(detail.get("results") or [])
            attrs["chainrun.retrieval.stopped_after"] = detail.get("stopped_after")
        else:
            attrs.update({
                "chainrun.hedge.attempts": step.n_attempts,
                "chainrun.hedge.fired": bool(step.hedge_fired),
                "chainrun.hedge.won_by_copy": bool(step.hedge_won),
                "chainrun.hedge.delay_ms": step.hedge_delay_ms,
                "chainrun.hedge.time_saved_ms": step.time_saved_ms,
            })  # fmt: skip
        _set(span, attrs)
        if step.status in ("failed_open", "failed_closed", "cancelled"):
            span.set_status(self._trace.StatusCode.ERROR, step.status)
        step_ctx = self._trace.set_span_in_context(span)
        for call in turn.calls_of(step.step):
            if call.outcome not in UNSENT_OUTCOMES:
                self._attempt(call, start, offset, step_ctx)
        step_end = offset + (step.duration_ms or 0.0)
        for tool_call in turn.tool_calls_of(step.step):
            self._tool(tool_call, start, offset, step_end, step_ctx)
        span.end(end_time=_ns(start, step_end))

    def _tool(self, row: ToolCallRow, start: datetime, step_offset: float, step_end: float,
              ctx: Any) -> None:  # fmt: skip
        """One ``execute_tool {tool}`` span (OpenTelemetry GenAI semantic conventions,
        "Execute tool span"); a call that never ran (invalid arguments, cancelled before
        it started) is a span of no duration at the step's end, with its status."""
        ran = row.started_offset_ms is not None
        begin = step_offset + row.started_offset_ms if row.started_offset_ms is not None \
            else step_end
        span = self.tracer.start_span(f"execute_tool {row.tool}", context=ctx,
                                      kind=self._trace.SpanKind.INTERNAL,
                                      start_time=_ns(start, begin))  # fmt: skip
        _set(span, {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": row.tool,
            "gen_ai.tool.call.id": row.call_id,
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.arguments": row.arguments,
            "chainrun.tool.status": row.status,
            "chainrun.tool.idempotency_key": row.idempotency_key,
            "chainrun.tool.side_effects": bool(row.side_effects),
            "chainrun.tool.round": row.round,
            "chainrun.tool.turn_cancelled": bool(row.turn_cancelled),
            "chainrun.hedge.attempt": row.attempt,
            "chainrun.tool.duration_ms": row.duration_ms,
            "error.type": row.error_type,
            # a confirm tool's pending action, or the run of one the shopper confirmed
            "chainrun.action.id": row.action_id or (row.idempotency_key if row.question
                                                    else None),
            "chainrun.action.question": row.question,
            "chainrun.action.expires_at": row.expires_at,
        })  # fmt: skip
        if row.status not in ("ok", "awaiting_confirmation"):
            span.set_status(self._trace.StatusCode.ERROR, row.status)
        end = begin + (row.duration_ms or 0.0) if ran else begin
        if row.action_id is not None:  # the confirmation: its own span beside the run
            confirm = self.tracer.start_span(f"confirm_action {row.tool}", context=ctx,
                                             kind=self._trace.SpanKind.INTERNAL,
                                             start_time=_ns(start, begin))  # fmt: skip
            _set(confirm, {"chainrun.action.id": row.action_id,
                           "chainrun.action.decision": "confirmed",
                           "chainrun.tool.status": row.status})  # fmt: skip
            confirm.end(end_time=_ns(start, end))
        span.end(end_time=_ns(start, end))

    def _attempt(self, call: CallRow, start: datetime, step_offset: float,
                 ctx: Any) -> None:  # fmt: skip
        offset = step_offset + (call.started_offset_ms or 0.0)
        model = call.model
        span = self.tracer.start_span(
            f"chat {model}" if model else "chat", context=ctx,
            kind=self._trace.SpanKind.CLIENT, start_time=_ns(start, offset),
        )  # fmt: skip
        host, port = _server(call.server_address)
        common = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": call.provider,
            "gen_ai.request.model": model,
            "gen_ai.response.model": call.response_model,
            "server.address": host,
            "server.port": port,
            "error.type": call.error_type,
        }
        _set(span, {
            **common,
            "gen_ai.response.id": call.response_id,
            "gen_ai.response.finish_reasons":
                [call.finish_reason] if call.finish_reason else None,
            "gen_ai.request.max_tokens": call.max_tokens,
            "gen_ai.request.temperature": call.temperature,
            "gen_ai.request.stream": bool(call.stream),
            "gen_ai.usage.input_tokens": call.input_tokens,
            "gen_ai.usage.output_tokens": call.output_tokens,
            "gen_ai.usage.reasoning.output_tokens": call.reasoning_tokens,
            "gen_ai.usage.cache_read.input_tokens": call.cached_input_tokens,
            "chainrun.request.reasoning_effort": call.reasoning_effort,
            "chainrun.hedge.attempt": call.attempt,
            "chainrun.hedge.target": call.target,
            "chainrun.hedge.outcome": call.outcome,
            "chainrun.ttft_ms": call.ttft_ms,
            "chainrun.truncated": bool(call.truncated),
        })  # fmt: skip
        if call.error_type:
            span.set_status(self._trace.StatusCode.ERROR, call.error_type)
        span.end(end_time=_ns(start, offset + (call.duration_ms or 0.0)))
        self._metrics(call, {k: v for k, v in common.items() if v is not None})

    def _metrics(self, call: CallRow, attrs: dict[str, Any]) -> None:
        if call.duration_ms is not None:
            self.duration.record(call.duration_ms / 1000.0, attrs)
        if call.ttft_ms is not None:
            self.ttfc.record(call.ttft_ms / 1000.0, attrs)
        for gap in call.chunk_gaps_ms:
            self.tpoc.record(gap / 1000.0, attrs)
        no_error = {k: v for k, v in attrs.items() if k != "error.type"}
        if call.input_tokens is not None:
            self.tokens.record(call.input_tokens, {**no_error, "gen_ai.token.type": "input"})
        if call.output_tokens is not None:
            self.tokens.record(call.output_tokens, {**no_error, "gen_ai.token.type": "output"})


class ExportingTelemetry(Telemetry):
    """:class:`Telemetry` with its own SDK providers and OTLP/HTTP exporters
    (see :func:`telemetry_from_env`); :meth:`shutdown` flushes and stops them."""

    def __init__(self, tracer_provider: Any, meter_provider: Any, *, workflow: str) -> None:
        super().__init__(tracer_provider, meter_provider, workflow=workflow)
        self._tp = tracer_provider
        self._mp = meter_provider

    def shutdown(self) -> None:
        """Export what is pending and stop the exporters (blocking, bounded by the SDK's
        export timeouts)."""
        self._tp.shutdown()
        self._mp.shutdown()


def otel_requested(env: Mapping[str, str] | None = None) -> bool:
    """True when the standard variables ask for OTLP export: an ``OTEL_EXPORTER_OTLP_*
    ENDPOINT`` is set and ``OTEL_SDK_DISABLED`` is not ``true``."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    keys = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")  # fmt: skip
    return any(env.get(k) for k in keys)


def telemetry_from_env(workflow: str = "chainrun") -> ExportingTelemetry:
    """Telemetry exporting by OTLP/HTTP (protobuf) as the standard ``OTEL_*`` variables say
    (endpoint, headers, timeout, compression, metric export interval).

    Raises:
        ConfigError: the ``otel`` extra is not installed, or ``OTEL_EXPORTER_OTLP_PROTOCOL``
            asks for something other than ``http/protobuf``.
    """
    _otel()
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol != "http/protobuf":
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: chainrun exports OTLP over "
            "http/protobuf; point it at the collector's HTTP port (4318)"
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attrs: dict[str, Any] = {"service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attrs["service.name"] = "chainrun"
    resource = Resource.create(attrs)
    tp = SdkTracerProvider(resource=resource)
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    mp = SdkMeterProvider(resource=resource, metric_readers=[reader])
    return ExportingTelemetry(tp, mp, workflow=workflow)
