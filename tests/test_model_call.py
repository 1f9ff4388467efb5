"""A step's hedged model call is one piece (chainrun.steps.model_call.HedgedCall): a
kind of a test module composes it and is hedged and logged like the built-in model step;
a call with tools counts its copies, fires and wins per round (checked against the
lab's own request log), and its rounds that ask for tools have their first-event time
(audit item 1 passes such a chain)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from typing import Any, Literal

import pytest
from test_tool_steps import tool_config

from chainrun.analysis.summary import hedge_stats
from chainrun.audit import audit
from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.lab.scenarios import Lognormal, Scenario
from chainrun.lab.tool_calls import ToolCallsConfig
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.steps import (
    BuildContext,
    ModelStepConfig,
    StateField,
    Step,
    StepContext,
    StepNeeds,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.base import StepItem
from chainrun.steps.model_call import CallResult, HedgedCall
from chainrun.steps.model_config import template_fields


class ShoutConfig(ModelStepConfig):
    kind: Literal["test_model_shout"] = "test_model_shout"


@register_step_kind
class Shout(Step):
    """A kind of a test module that calls a model: it composes the hedged call (no
    subclass of the model step) and writes the answer, upper-cased, to ``shout``."""

    config_model = ShoutConfig
    config: ShoutConfig
    state_fields = (StateField("shout", "the model's answer, upper-cased"),)

    def __init__(self, name: str, config: ShoutConfig) -> None:
        super().__init__(name, config)
        self.call = HedgedCall(name, config)

    @property
    def reads(self) -> frozenset[str]:
        return template_fields(*self.config.templates().values())

    def needs(self) -> StepNeeds:
        return self.call.needs()

    async def open(self, ctx: BuildContext) -> None:
        await self.call.open(ctx)

    async def aclose(self) -> None:
        await self.call.aclose()

    def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        return self.call.step_items(ctx, self.call.request(state), self._shout)

    @staticmethod
    def _shout(call: CallResult) -> StepResult:
        if call.error is not None:
            return StepResult(error=call.error)
        return StepResult(updates={"shout": (call.text or "").upper()})


HEDGE = {"delay_ms": 30, "max_attempts": 2, "max_extra_load": 1.0, "targets": ["backup"]}


def _script(req: ChatRequest) -> FakeReply:
    return FakeReply("quiet words", ttft_s=0.002)


async def test_a_kind_that_composes_the_hedged_call_is_hedged_and_logged_like_llm(
    store: Store,
) -> None:
    # the primary answers in 0.4 s, the backup at once: each step's copy fires and wins
    slow = FakeProvider(name="local", script=lambda r: FakeReply("quiet words", ttft_s=0.4))
    fast = FakeProvider(name="backup", script=_script)
    model = {"provider": "local", "prompt": "Say: {message}", "max_output_tokens": 16,
             "deadline_s": 5.0, "hedge": HEDGE}  # fmt: skip
    cfg = config_from_dict({
        "order": ["shout", "reply"], "answer_step": "reply",
        "providers": {"local": {"base_url": "http://127.0.0.1:9/v1"},
                      "backup": {"base_url": "http://127.0.0.1:9/v1"}},
        "steps": {"shout": {"kind": "test_model_shout", **model},
                  "reply": model},
    })  # fmt: skip
    async with Chain(cfg, store=store, providers={"local": slow, "backup": fast}) as chain:
        done = await chain.run_turn("hello")
    assert done.status == "ok"
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["shout"].updates == {"shout": "QUIET WORDS"}
    calls = store.calls(done.run_id)
    by_step = {name: [c for c in calls if c.step == name] for name in ("shout", "reply")}
    for name in ("shout", "reply"):
        s = steps[name]
        assert (s.n_attempts, s.hedge_fired, s.hedge_won, s.hedge_delay_ms) == (2, True, True, 30)
        assert [(c.round, c.attempt, c.target, c.outcome) for c in by_step[name]] == [
            (1, 1, "local", "cancelled"), (1, 2, "backup", "duplicate")]
    # the same row fields as the built-in model step's, but for the step and what it sent
    skip = {"id", "step", "prompt", "started_at", "started_offset_ms", "ttft_ms",
            "first_tool_call_ms", "duration_ms", "chunk_gaps_ms", "time_between_tokens_ms",
            "loop_lag_ms",
            "bytes_received", "response_id"}  # fmt: skip
    for ours, builtin in zip(by_step["shout"], by_step["reply"], strict=True):
        a, b = ours.model_dump(), builtin.model_dump()
        assert {k: v for k, v in a.items() if k not in skip} == \
            {k: v for k, v in b.items() if k not in skip}
        assert (a["ttft_ms"] is None) == (b["ttft_ms"] is None)
    # the step's hedger is the engine's, with its own breakers
    shout = chain.steps["shout"]
    assert isinstance(shout, Shout) and shout.call.hedger.stats.fires == 1


def _tool_scenario(median_ms: float) -> Scenario:
    return Scenario(name="tools", latency=Lognormal(median_ms=median_ms, sigma=0.01),
                    n_tokens=4, per_token_ms=5,
                    tool_calls=ToolCallsConfig(rounds=1, fragments=3))  # fmt: skip


@pytest.fixture(scope="module")
def labs() -> Iterator[tuple[LabServer, LabServer]]:
    with LabServer(_tool_scenario(400)) as slow, LabServer(_tool_scenario(5)) as fast:
        yield slow, fast


N_TURNS = 3


async def test_hedge_stats_of_a_tool_run_count_the_copies_the_lab_received(
    labs: tuple[LabServer, LabServer], tmp_path: Any
) -> None:
    slow, fast = labs
    slow.reset()
    fast.reset()
    providers = {"local": {"base_url": slow.base_url}, "backup": {"base_url": fast.base_url}}
    cfg = tool_config(providers, tools=["order_status"], hedge={
        "delay_ms": 60, "max_attempts": 2, "max_extra_load": 1.0, "targets": ["backup"]})
    with Store.open(str(tmp_path / "tools.db")) as store:
        async with Chain(cfg, store=store) as chain:
            for i in range(N_TURNS):
                done = await chain.run_turn(f"Where is my order {1040 + i}?")
                assert done.status == "ok", done
            await chain.flush()
        run_id = chain.run_id or 0
        stats = hedge_stats(store, run_id)["steps"]["answer"]
        calls = store.calls(run_id)
        steps = store.steps(run_id)
        item1 = audit(store, runs=[run_id]).items[0]
    # each turn: round 1 asks for order_status, round 2 answers; each round its own race
    assert [s.detail["tool_rounds"] for s in steps] == [2] * N_TURNS  # type: ignore[index]
    # primaries go to the slow lab, copies to the fast one (the hedge's only target)
    primaries, copies = slow.requests(), fast.requests()
    assert len(primaries) == 2 * N_TURNS  # one a round
    assert stats["copies_sent"] == len(copies) == 2 * N_TURNS
    assert {r["attempt"] for r in primaries} == {"1"} and {r["attempt"] for r in copies} == {"2"}
    assert stats["n"] == 2 * N_TURNS  # rounds, each a call
    assert (stats["n_fired"], stats["n_won"]) == (2 * N_TURNS, 2 * N_TURNS)
    assert stats["extra_calls_per_turn"] == 2.0
    assert sorted((c.round, c.attempt) for c in calls) == sorted(
        [(1, 1), (1, 2), (2, 1), (2, 2)] * N_TURNS)
    # the round that asked for tools streamed no text: its first event is the tool call
    asked = [c for c in calls if c.round == 1 and c.outcome == "duplicate"]
    assert asked and all(c.ttft_ms is None and c.first_tool_call_ms is not None for c in asked)
    assert item1.verdict == "pass", (item1.evidence, item1.notes)
    assert all(g["missing_ttft"] == 0 for g in item1.figures["by_step_provider"])
