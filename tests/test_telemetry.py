"""OpenTelemetry export: spans and GenAI metrics from logged turns, to the SDK's in-memory
exporter and, end to end, from ``chainrun serve`` to a local OTLP/HTTP receiver."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import reply_by_step
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otel_helpers import Otel
from serve_helpers import chat, serving, sse

from chainrun.chain import Chain
from chainrun.config import LLM_CLASSIFY_STEP, config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply, words_in_sentences
from chainrun.telemetry.otel import otel_requested


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.shutdown()


def _by_name(spans: Any) -> dict[str, Any]:
    return {s.name: s for s in spans}


async def test_spans_carry_the_genai_attributes_of_the_log(config, store, fake, otel) -> None:
    factory = lambda: Chain(config, store=store, providers={"local": fake}, quiet=True)  # noqa: E731
    async with serving(factory, observers=[otel.telemetry]) as (url, _):
        async with httpx.AsyncClient(base_url=url) as client:
            events = await chat(client, "a rain jacket?", conversation_id="conv-9")
    turn = events[-1][1]
    spans = otel.spans.get_finished_spans()
    names = sorted(s.name for s in spans)
    # three model calls: compose, validate, critique (classify calls no model; the policy
    # step was skipped on this product question)
    assert names == sorted(["invoke_workflow chainrun-shop", "step classify", "retrieval retrieve",
                            "step compose", "step validate", "step critique"]
                           + ["chat gemma-3-270m"] * 3)  # fmt: skip
    by = _by_name(spans)
    root = by["invoke_workflow chainrun-shop"]
    assert root.parent is None
    assert root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert root.attributes["gen_ai.conversation.id"] == "conv-9"
    assert root.attributes["chainrun.turn.id"] == turn["turn_id"]
    assert root.attributes["gen_ai.usage.input_tokens"] == turn["usage"]["input_tokens"]
    assert by["retrieval retrieve"].attributes["gen_ai.operation.name"] == "retrieval"
    steps = [s for s in spans if s.name.startswith(("step ", "retrieval "))]
    assert all(s.parent.span_id == root.context.span_id for s in steps)
    calls = {c.step: c for c in store.calls(turn["run_id"])}
    for s in spans:
        if not s.name.startswith("chat "):
            continue
        parent = next(p for p in steps if p.context.span_id == s.parent.span_id)
        step = parent.attributes["chainrun.step.name"]
        c, a = calls[step], s.attributes
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "local"
        assert a["gen_ai.request.model"] == c.model
        assert a["gen_ai.usage.input_tokens"] == c.input_tokens
        assert a["gen_ai.usage.output_tokens"] == c.output_tokens
        assert a["gen_ai.usage.reasoning.output_tokens"] == 0
        assert a["gen_ai.response.finish_reasons"] == ("stop",)
        assert a["chainrun.hedge.attempt"] == 1 and a["chainrun.hedge.outcome"] == "not_fired"
        assert "error.type" not in a and "server.address" not in a  # unknown: not set
        # the log's times: the attempt lies inside its step, the step inside the turn
        assert parent.start_time <= s.start_time <= s.end_time <= parent.end_time + 1_000_000
        assert root.start_time <= parent.start_time and parent.end_time <= root.end_time + 1_000_000
        assert (s.end_time - s.start_time) / 1e6 == pytest.approx(c.duration_ms, abs=0.01)
    m = otel.metrics()
    assert sum(p.count for p in m["gen_ai.client.operation.duration"]) == 3
    assert sum(p.count for p in m["gen_ai.client.operation.time_to_first_chunk"]) == 3
    gaps = sum(len(c.chunk_gaps_ms) for c in store.calls(turn["run_id"]))
    assert sum(p.count for p in m["gen_ai.client.operation.time_per_output_chunk"]) == gaps
    tokens = {p.attributes["gen_ai.token.type"]: p for p in m["gen_ai.client.token.usage"]
              if p.attributes["gen_ai.request.model"] == "gemma-3-270m"}  # fmt: skip
    assert tokens["input"].sum == turn["usage"]["input_tokens"] and tokens["input"].count == 3
    assert tokens["output"].sum == turn["usage"]["output_tokens"]
    for p in m["gen_ai.client.operation.duration"]:
        assert p.attributes["gen_ai.operation.name"] == "chat"


async def test_unknown_token_counts_are_not_emitted(config, store, otel) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("no usage here", ttft_s=0.002, usage=False),
    }))  # fmt: skip
    factory = lambda: Chain(config, store=store, providers={"local": fake}, quiet=True)  # noqa: E731
    async with serving(factory, observers=[otel.telemetry]) as (url, _):
        async with httpx.AsyncClient(base_url=url) as client:
            events = await chat(client, "hi")
    assert events[-1][1]["usage"]["unknown_calls"] == 1
    chats = [s for s in otel.spans.get_finished_spans() if s.name.startswith("chat ")]
    without = [s for s in chats if "gen_ai.usage.input_tokens" not in s.attributes]
    assert len(chats) == 3 and len(without) == 1  # compose, validate, critique
    m = otel.metrics()
    counts = {p.attributes["gen_ai.token.type"]: p.count for p in m["gen_ai.client.token.usage"]}
    assert counts == {"input": 2, "output": 2}
    assert sum(p.count for p in m["gen_ai.client.operation.duration"]) == 3


async def test_hedged_attempts_are_spans_with_their_outcome(store, otel) -> None:
    config = config_from_dict({"steps": {"classify": {  # classified by the model, hedged
        **LLM_CLASSIFY_STEP, "hedge": {"delay_ms": 20, "max_attempts": 2}}}})  # fmt: skip
    seen: list[int] = []
    base = reply_by_step()

    def script(req: Any) -> FakeReply:
        if "Category:" in req.messages[-1]["content"]:
            seen.append(1)
            slow = len(seen) % 2 == 1  # every primary is slow, every copy fast
            return FakeReply("sizing", ttft_s=0.5 if slow else 0.001)
        return base(req)

    fake = FakeProvider(name="local", script=script)
    factory = lambda: Chain(config, store=store, providers={"local": fake}, quiet=True)  # noqa: E731
    async with serving(factory, observers=[otel.telemetry]) as (url, _):
        async with httpx.AsyncClient(base_url=url) as client:
            events = await chat(client, "does it run small?")
    classify = next(s for s in events[-1][1]["steps"] if s["step"] == "classify")
    assert classify["hedge_fired"] and classify["hedge_won"]
    spans = otel.spans.get_finished_spans()
    step = next(s for s in spans if s.name == "step classify")
    assert step.attributes["chainrun.hedge.fired"]
    assert step.attributes["chainrun.hedge.attempts"] == 2
    attempts = sorted((s for s in spans if s.parent and s.parent.span_id == step.context.span_id),
                      key=lambda s: s.attributes["chainrun.hedge.attempt"])  # fmt: skip
    assert [a.attributes["chainrun.hedge.outcome"] for a in attempts] == ["cancelled", "duplicate"]
    assert attempts[1].start_time - attempts[0].start_time >= 15_000_000  # the copy at d = 20 ms


async def test_a_cancelled_turn_is_exported_too(config, store, otel) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(words_in_sentences(300), ttft_s=0.001, gap_s=0.01),
    }))  # fmt: skip
    factory = lambda: Chain(config, store=store, providers={"local": fake}, quiet=True)  # noqa: E731
    async with serving(factory, observers=[otel.telemetry]) as (url, _):
        async with httpx.AsyncClient(base_url=url) as client:
            async with client.stream("POST", "/chat", json={"message": "hi"}) as r:
                async for event, _ in sse(r):
                    if event == "token":
                        break
            for _ in range(100):
                if otel.spans.get_finished_spans():
                    break
                await asyncio.sleep(0.02)
    root = next(s for s in otel.spans.get_finished_spans() if s.name.startswith("invoke_workflow"))
    assert root.attributes["chainrun.turn.status"] == "cancelled"
    assert root.attributes["error.type"] == "cancelled"
    compose = next(s for s in otel.spans.get_finished_spans() if s.name == "step compose")
    assert compose.attributes["chainrun.step.status"] == "cancelled"


def test_otel_requested_follows_the_standard_variables() -> None:
    assert not otel_requested({})
    assert otel_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert otel_requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    off = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}
    assert not otel_requested(off)


# -- end to end: chainrun serve -> OTLP/HTTP -> a receiver decoding the protobuf ---------
class _Receiver(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: dict[str, list[bytes]] = {}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.bodies.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _attrs(kvs: Any) -> dict[str, Any]:
    out = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


def test_serve_exports_to_a_local_otlp_receiver(tmp_path: Path) -> None:
    receiver = _Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    db = tmp_path / "log.db"
    with LabServer("lognormal", median_ms=5, sigma=0.3, n_tokens=8, per_token_ms=1) as lab:
        lab_port = lab.port
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        port_env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT":
                    f"http://127.0.0.1:{receiver.server_address[1]}",
                    "OTEL_SERVICE_NAME": "shop-chat", "PYTHONPATH": str(Path.cwd())}  # fmt: skip
        port_env.pop("CHAINRUN_SERVE_TOKEN", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
             "--db", str(db)],
            stderr=subprocess.PIPE, text=True, env=port_env,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            url = line.split()[2].rstrip("/")
            for _ in range(200):
                try:
                    with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.05)
            req = urllib.request.Request(f"{url}/chat", method="POST",
                                         data=b'{"message": "a linen shirt?"}',
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read().decode()
            assert "event: turn" in text
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            proc.stderr.close()
    receiver.shutdown()
    receiver.server_close()
    assert proc.returncode == 0
    spans = []
    for body in receiver.bodies["/v1/traces"]:
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            resource = _attrs(rs.resource.attributes)
            assert resource["service.name"] == "shop-chat"
            assert resource["service.instance.id"].endswith(f":{proc.pid}")
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    assert len(by_name["invoke_workflow chainrun-shop"]) == 1
    chats = by_name["chat gemma-3-270m"]
    assert len(chats) == 3  # compose, validate, critique: classify calls no model
    for s in chats:
        a = _attrs(s.attributes)
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "local"
        assert a["server.address"] == "127.0.0.1" and a["server.port"] == lab_port
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.response.model"] == "gemma-3-270m"
    metrics = {}
    for body in receiver.bodies["/v1/metrics"]:
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    metrics[m.name] = m
    assert {"gen_ai.client.operation.duration", "gen_ai.client.token.usage",
            "gen_ai.client.operation.time_to_first_chunk",
            "gen_ai.client.operation.time_per_output_chunk"} <= set(metrics)  # fmt: skip
    duration = metrics["gen_ai.client.operation.duration"]
    assert duration.unit == "s" and sum(p.count for p in duration.histogram.data_points) == 3
    with Store.open(db) as store:
        assert store.list_runs()[0].status == "complete"
