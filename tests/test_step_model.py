"""The open step model: each kind's own config model (a union discriminated on kind),
kinds' own turn-state fields, steps saying what they need, and routing with ``when``."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Literal

import pytest
from conftest import model_classify_config, reply_by_step
from pydantic import Field

from chainrun.chain import Chain
from chainrun.config import LLM_CLASSIFY_STEP, ChainConfig, config_from_dict, config_from_snapshot
from chainrun.errors import ConfigError
from chainrun.events import StepFinished, StepStarted
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.steps import (
    StateField,
    Step,
    StepConfig,
    StepContext,
    StepNeeds,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.base import StepItem

ROOT = Path(__file__).resolve().parents[1]


class OrderFinderConfig(StepConfig):
    """The config model of a kind defined outside the package."""

    kind: Literal["test_order_finder"] = "test_order_finder"
    #: the orders this lookup knows, by order number
    orders: dict[str, str] = Field(default_factory=dict)
    #: what the step writes when the message names no known order
    unknown: str = "no such order"


class OrderFinder(Step):
    """Finds the order the message names; writes the ``order`` state field."""

    kind = "test_order_finder"
    config_model = OrderFinderConfig
    state_fields = (StateField("order", "the shopper's order", empty="(no order)"),)
    config: OrderFinderConfig

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"message"})

    @property
    def writes(self) -> frozenset[str]:
        return frozenset({"order"})

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        found = [v for k, v in self.config.orders.items() if k in state.message]
        ctx.row.output = found[0] if found else self.config.unknown
        ctx.row.duration_ms = ctx.elapsed_ms()
        yield StepResult(updates={"order": ctx.row.output})


register_step_kind(OrderFinder)

_ORDER_CHAIN = {
    "order": ["lookup", "compose"],
    "steps": {
        "lookup": {"kind": "test_order_finder", "orders": {"A17": "A17: shipped on Monday"}},
        "compose": {"prompt": "Order: {order}\nShopper: {message}\nStylist:"},
    },
}


async def test_a_kind_from_a_test_module_adds_a_field_another_prompt_reads(store) -> None:
    cfg = config_from_dict(_ORDER_CHAIN)
    assert isinstance(cfg.steps["lookup"], OrderFinderConfig)
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        assert chain.graph.deps["compose"] == {"lookup"}  # an edge from the kind's field
        done = await chain.run_turn("where is my order A17?")
    assert done.status == "ok"
    (request,) = fake.requests
    assert request.messages[-1]["content"].startswith("Order: A17: shipped on Monday\n")
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["lookup"].kind == "test_order_finder"
    assert steps["lookup"].output == "A17: shipped on Monday"
    # the stored snapshot validates again through the kind's own model
    again = config_from_snapshot(store.get_run(done.run_id).config or "")
    assert again == cfg and isinstance(again.steps["lookup"], OrderFinderConfig)


def test_a_key_the_kinds_model_does_not_take_is_one_error_line() -> None:
    data = {**_ORDER_CHAIN, "steps": {**_ORDER_CHAIN["steps"],
                                      "lookup": {"kind": "test_order_finder", "colour": "red"}}}
    with pytest.raises(ConfigError) as e:
        config_from_dict(data, "shop.toml")
    msg = str(e.value)
    assert msg.startswith("shop.toml: steps.lookup.colour: a step of kind 'test_order_finder' "
                          "takes no key 'colour'"), msg
    assert "\n" not in msg
    # its own keys are checked by its model: a bad value names the key
    bad = {**_ORDER_CHAIN, "steps": {**_ORDER_CHAIN["steps"],
                                     "lookup": {"kind": "test_order_finder", "unknown": 3}}}
    with pytest.raises(ConfigError, match=r"^chainrun\.toml: steps\.lookup\.unknown: "):
        config_from_dict(bad, "chainrun.toml")


def test_nothing_in_the_package_names_the_test_kind() -> None:
    found = subprocess.run(
        ["grep", "-rIl", "test_order_finder\\|OrderFinder", str(ROOT / "chainrun")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert found.returncode == 1 and found.stdout == "", found.stdout


def test_a_built_in_kind_refuses_keys_of_another_kind() -> None:
    """A retrieve step once accepted reasoning_effort (and every other llm key) silently."""
    with pytest.raises(ConfigError) as e:
        config_from_dict({"steps": {"retrieve": {"reasoning_effort": "low"}}}, "chainrun.toml")
    assert str(e.value) == (
        "chainrun.toml: steps.retrieve.reasoning_effort: a step of kind 'retrieve' takes no "
        "key 'reasoning_effort' (its keys: after, deadline_s, follow_ups, kind, on_failure, "
        "retrieval, when) (got 'low')"
    )
    with pytest.raises(ConfigError, match=r"steps\.validate\.retrieval: a step of kind 'llm' "):
        config_from_dict({"steps": {"validate": {"retrieval": {"k": 3}}}})
    with pytest.raises(ConfigError, match=r"kind 'guard' takes no key 'labels'"):
        config_from_dict({"order": ["g", "retrieve", "compose"], "steps": {"g": {
            "kind": "guard", "on_missing_verdict": "open", "labels": ["a"]}}})  # fmt: skip


def test_a_step_changing_kind_does_not_inherit_the_default_steps_keys() -> None:
    """[steps.classify] kind = "test_order_finder": the default classify's prompt and
    labels are not keys of that kind, so the table is the user's whole."""
    cfg = config_from_dict({"steps": {"classify": {"kind": "test_order_finder"}}})
    assert cfg.steps["classify"] == OrderFinderConfig()


def test_placeholders_are_the_fields_of_built_ins_and_registered_kinds() -> None:
    with pytest.raises(ConfigError, match=r"steps\.compose\.prompt: unknown placeholder "
                                          r"\{nope\}; expected one of .*\{order\}"):  # fmt: skip
        config_from_dict({"steps": {"compose": {"prompt": "{nope}"}}})
    # a field a registered kind declares, but no step of this chain writes
    cfg = config_from_dict({"steps": {"compose": {"prompt": "{order} {message}"}}})
    with pytest.raises(ConfigError, match=r"steps\.compose: reads \{order\}, which no step "
                                          r"writes"):  # fmt: skip
        Chain(cfg)


class NeedsOther(Step):
    """A kind that calls nothing itself but asks for a provider: the chain opens it."""

    kind = "test_needs_other"

    @property
    def reads(self) -> frozenset[str]:
        return frozenset()

    @property
    def writes(self) -> frozenset[str]:
        return frozenset()

    def needs(self) -> StepNeeds:
        return StepNeeds(providers=("other",))

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        yield StepResult()


register_step_kind(NeedsOther)


async def test_the_chain_opens_what_each_step_asks_for(store) -> None:
    cfg = config_from_dict({
        "order": ["asks", "compose"],
        "providers": {"other": {"base_url": "http://127.0.0.1:9/v1"}},
        "steps": {"asks": {"kind": "test_needs_other"}, "compose": {"prompt": "{message}"}},
    })  # fmt: skip
    local, other = FakeProvider(name="local"), FakeProvider(name="other")
    chain = Chain(cfg, store=store, providers={"local": local, "other": other})
    assert chain.needs["asks"].providers == ("other",)
    assert chain.needs["compose"].providers == ("local",) and chain.needs["compose"].log
    async with chain:
        assert set(chain._providers) == {"local", "other"}
        done = await chain.run_turn("hi")
    assert done.status == "ok"


# -- routing: when ----------------------------------------------------------------------

_ROUTED = {
    "off_path_steps": "after_answer",
    "steps": {"retrieve": {"when": {"label": ["product_search", "styling"]}}},
}


async def test_a_step_with_when_is_skipped_on_other_labels_and_logged(store) -> None:
    cfg = config_from_dict(_ROUTED)
    fake = FakeProvider(name="local", script=reply_by_step())
    events = []
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        # classify is on the answer's critical path now: retrieve routes on its label
        assert "classify" in chain.graph.deps["retrieve"]
        assert "classify" in chain.graph.ancestors("compose")
        assert "classify" not in chain.graph.deferred
        async for ev in chain.stream_turn("I want to send my jacket back"):
            events.append(ev)
    done = events[-1]
    assert done.status == "ok" and done.label == "returns"
    skipped = [e for e in events if isinstance(e, StepFinished) and e.step == "retrieve"]
    assert len(skipped) == 1 and skipped[0].status == "skipped"
    assert not any(isinstance(e, StepStarted) and e.step == "retrieve" for e in events)
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["retrieve"].status == "skipped"
    assert steps["retrieve"].detail == {
        "skipped": "when: label is 'returns', not one of product_search, styling"
    }
    # compose ran, seeing the unset products as their documented empty value
    compose_request = next(r for r in fake.requests if "Catalogue matches" in
                           r.messages[-1]["content"])  # fmt: skip
    assert "Catalogue matches:\n(none)\n" in compose_request.messages[-1]["content"]
    assert steps["compose"].status == "ok"


async def test_a_step_with_when_runs_on_its_labels(store) -> None:
    cfg = config_from_dict(_ROUTED)
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("a rain jacket under 100?")  # product_search
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["retrieve"].status == "ok" and steps["retrieve"].detail
    assert "skipped" not in steps["retrieve"].detail
    assert steps["classify"].started_offset_ms < steps["retrieve"].started_offset_ms


@pytest.mark.parametrize(("message", "label", "runs"), [
    ("Can I return these boots?", "returns", False),
    ("Do these boots run small?", "sizing", True),
])  # fmt: skip
async def test_the_negated_form(store, message: str, label: str, runs: bool) -> None:
    cfg = config_from_dict({"steps": {"retrieve": {"when": {"label": {"not": ["returns"]}}}}})
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn(message)
    assert done.label == label
    (retrieve,) = [s for s in store.steps(done.run_id) if s.step == "retrieve"]
    assert (retrieve.status == "ok") is runs
    if not runs:
        assert retrieve.status == "skipped"
        assert retrieve.detail == {"skipped": "when: label is 'returns', one of returns"}


async def test_an_unset_field_matches_no_list(store) -> None:
    """classify (by the model here) fails open (no label): a step routed on labels is
    skipped, one routed on `not` runs."""
    cfg = config_from_dict({"steps": {
        "classify": LLM_CLASSIFY_STEP,
        "retrieve": {"when": {"label": {"not": ["returns"]}}},
        "critique": {"when": {"label": ["styling"]}},
    }})  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step({
        "classify": FakeReply("x", error=TimeoutError())}))  # fmt: skip
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("hello")
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["classify"].status == "failed_open"
    assert steps["retrieve"].status == "ok"
    assert steps["critique"].status == "skipped"
    assert steps["critique"].detail == {"skipped": "when: label is unset, not one of styling"}


def test_the_routing_step_is_on_the_path_only_of_the_steps_that_route_on_it() -> None:
    """critique routes on the label, retrieve does not: classify stays off the answer's
    path (the answer does not wait for it); critique waits for it."""
    cfg = model_classify_config({"off_path_steps": "when_ready",
                                 "steps": {"critique": {"when": {"label": ["styling"]}}}})
    chain = Chain(cfg)
    assert "classify" in chain.graph.deps["critique"]
    assert "classify" not in chain.graph.ancestors("compose")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"steps": {"retrieve": {"when": {"colour": ["red"]}}}},
         "steps.retrieve.when.colour: not a turn-state field"),
        ({"steps": {"retrieve": {"when": {"label": []}}}}, "steps.retrieve.when.label"),
        ({"steps": {"retrieve": {"when": {"label": {"nicht": ["a"]}}}}},
         "steps.retrieve.when.label"),
        ({"steps": {"compose": {"when": {"label": ["a"]}}}},
         "steps.compose.when: the answer step always runs"),
    ],
)  # fmt: skip
def test_bad_when_is_one_line(data: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(data, "chainrun.toml")
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_public_names_still_import() -> None:
    from chainrun import ChainConfig as Top
    from chainrun import HedgeConfig, ProviderConfig, StepConfig, load_config

    assert Top is ChainConfig and callable(load_config)
    assert HedgeConfig.__name__ == "HedgeConfig" and ProviderConfig.__name__ == "ProviderConfig"
    assert isinstance(config_from_dict({}).steps["retrieve"], StepConfig)
