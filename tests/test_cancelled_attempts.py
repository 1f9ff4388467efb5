"""Cancelled attempts: one truth in the calls rows, the spans and the metrics.

A hedge loser cancelled mid-stream, and the calls of a turn the caller cancelled, had
``calls.error_type`` NULL (the documented vocabulary has ``cancelled``), ended spans
with status UNSET and no ``error.type``, and ``gen_ai.client.operation.duration``
points without ``error.type``. The lab streams over real HTTP to the real ``openai``
client; the spans and metrics go to the OpenTelemetry SDK's in-memory exporters.
Also: the hedging of a cancelled turn is counted as it happened (the copy fired and
is charged to the load budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.trace import StatusCode
from otel_helpers import Otel

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.events import TokenDelta
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import Faults
from chainrun.log.store import Store


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.shutdown()


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast") as lab:
        yield lab


def chain_config(lab: LabServer, **step: Any) -> Any:
    answer = {"provider": "lab", "prompt": "{message}", "max_output_tokens": 200,
              "deadline_s": 10.0, "on_failure": "closed", **step}
    return config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"lab": {"base_url": lab.base_url}},
        "steps": {"answer": answer},
    })  # fmt: skip


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def call_spans(otel: Otel) -> dict[int, Any]:
    return {s.attributes["chainrun.hedge.attempt"]: s
            for s in otel.spans.get_finished_spans() if s.name.startswith("chat")}  # fmt: skip


async def test_a_hedge_loser_cancelled_mid_stream(lab: LabServer, otel: Otel) -> None:
    # the primary sends its first token and then pauses; the copy (at 100 ms) answers whole
    lab.set_scenario(Scenario(name="loser", n_tokens=6, per_token_ms=1, faults=Faults(
        pause={"after_tokens": 1, "ms": 3000}, attempts=[1])))  # fmt: skip
    cfg = chain_config(lab, stream=False,
                       hedge={"delay_ms": 100, "max_attempts": 2, "max_extra_load": 1.0})
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("does the linen shirt run small?")
            await chain.flush()
            logged = store.turn(done.turn_id)
    assert done.status == "ok" and logged is not None
    calls = {c.attempt: c for c in logged.calls}
    assert calls[1].outcome == "cancelled" and calls[1].truncated  # cut mid-stream
    assert calls[1].error_type == "cancelled"
    assert calls[2].outcome == "duplicate" and calls[2].error_type is None
    otel.telemetry.turn_logged(logged)
    spans = call_spans(otel)
    assert spans[1].attributes["error.type"] == "cancelled"
    assert spans[1].status.status_code == StatusCode.ERROR
    assert "error.type" not in spans[2].attributes
    assert spans[2].status.status_code == StatusCode.UNSET
    points = otel.metrics()["gen_ai.client.operation.duration"]
    assert sorted(str(p.attributes.get("error.type")) for p in points) == ["None", "cancelled"]


async def test_calls_of_a_turn_the_caller_cancelled(lab: LabServer, otel: Otel) -> None:
    lab.set_scenario(Scenario(name="long", n_tokens=200, per_token_ms=10))
    cfg = chain_config(lab, stream=True)
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            async with contextlib.aclosing(chain.stream_turn("cancel me")) as events:
                async for ev in events:
                    if isinstance(ev, TokenDelta):
                        break  # the caller goes away mid-stream
            await chain.flush()
            turn = store.turns(chain.run_id)[0]
            logged = store.turn(turn.id or 0)
    assert turn.status == "cancelled" and logged is not None
    (call,) = logged.calls
    assert call.truncated and call.error_type == "cancelled"
    otel.telemetry.turn_logged(logged)
    (span,) = call_spans(otel).values()
    assert span.attributes["error.type"] == "cancelled"
    assert span.status.status_code == StatusCode.ERROR
    (point,) = otel.metrics()["gen_ai.client.operation.duration"]
    assert point.attributes["error.type"] == "cancelled"


async def test_a_cancelled_turn_s_hedge_is_counted_and_charged(lab: LabServer) -> None:
    """A hedged step cancelled after its copy was sent: hedge_fired = 1 in its row, and
    the copy is paid from the load budget (the next call may not hedge on credit it
    spent)."""
    lab.set_scenario(Scenario(name="slow", n_tokens=50, per_token_ms=20,
                              latency={"model": "lognormal", "median_ms": 400, "sigma": 0.0}))
    # reserve 1, deposits of 0.1: one copy, then the budget is spent for ten calls
    cfg = chain_config(lab, stream=True, hedge={"delay_ms": 50, "max_attempts": 2,
                                                "max_extra_load": 0.1})  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            task = asyncio.ensure_future(chain.run_turn("first"))
            assert await until(lambda: len(lab.requests()) == 2)  # the copy was sent
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            second = await chain.run_turn("second")
            await chain.flush()
            steps = {t.id: s for t in store.turns(chain.run_id)
                     for s in store.steps(chain.run_id) if s.turn_id == t.id}  # fmt: skip
            turns = sorted(store.turns(chain.run_id), key=lambda t: t.id or 0)
            calls = store.calls(chain.run_id)
    assert [t.status for t in turns] == ["cancelled", "ok"]
    first_step = steps[turns[0].id]
    assert first_step.hedge_fired and first_step.n_attempts == 2
    assert {c.error_type for c in calls if c.turn_id == turns[0].id} == {"cancelled"}
    # the second call's copy is refused: the budget was spent by the cancelled turn's copy
    second_calls = sorted((c for c in calls if c.turn_id == second.turn_id),
                          key=lambda c: c.attempt)  # fmt: skip
    assert [c.outcome for c in second_calls][:2] == ["primary", "budget_exhausted"]
