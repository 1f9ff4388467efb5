"""The OpenTelemetry SDK's in-memory exporters behind a :class:`chainrun.telemetry.otel.Telemetry`,
for the telemetry tests."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from chainrun.telemetry.otel import Telemetry


class Otel:
    """A Telemetry exporting to in-memory span and metric readers; ``shutdown()`` after."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tp = TracerProvider()
        self.tp.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.mp = MeterProvider(metric_readers=[self.reader])
        self.telemetry = Telemetry(self.tp, self.mp, workflow="chainrun-shop")

    def metrics(self) -> dict[str, list[Any]]:
        """Histogram data points by metric name."""
        out: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out

    def shutdown(self) -> None:
        self.tp.shutdown()
        self.mp.shutdown()
