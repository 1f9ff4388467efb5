"""Telemetry out of the run log: OpenTelemetry spans and GenAI client metrics of each
logged turn (:mod:`chainrun.telemetry.otel`, extra ``chainrun[otel]``)."""
