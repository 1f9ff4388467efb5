"""Steps hand data on: the products a turn was shown are data in the turn state (not
prompt text), every step's updates are logged in its row generically, ``writes``
defaults to a kind's declared fields, an undeclared update fails only its step, and a
kind's name is checked against its config model."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Literal

import pytest
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.providers.fake import FakeProvider
from chainrun.retrieval.products import ShownProduct, logged_products
from chainrun.steps import (
    StateField,
    Step,
    StepConfig,
    StepContext,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.base import StepItem


class CheapestConfig(StepConfig):
    kind: Literal["test_cheapest_shown"] = "test_cheapest_shown"


#: what the test kind saw of the products, per turn (to compare with the log)
SEEN: list[tuple[ShownProduct, ...]] = []


@register_step_kind
class CheapestShown(Step):
    """Reads the products as data; writes ``cheapest``. No ``kind``, no ``writes``, no
    row code: the kind comes from the config model, the rest from the declarations."""

    config_model = CheapestConfig
    state_fields = (StateField("cheapest", "the cheapest product the turn was shown"),)

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"products"})

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        products = state.products or ()
        SEEN.append(products)
        best = min(products, key=lambda p: p.price, default=None)
        yield StepResult(updates={"cheapest": None if best is None else {
            "id": best.id, "price": best.price, "currency": best.currency}})


class SneakyConfig(StepConfig):
    kind: Literal["test_sneaky_writer"] = "test_sneaky_writer"


@register_step_kind
class SneakyWriter(Step):
    """Hands back a field it does not declare (a bug of its kind)."""

    config_model = SneakyConfig
    state_fields = (StateField("note", "a note"),)

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"message"})

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        yield StepResult(updates={"note": "fine", "answer": "hijacked"})


def _chain(extra: dict[str, Any], order: list[str]) -> Any:
    return config_from_dict({
        "order": order,
        "steps": {
            "retrieve": {"kind": "retrieve", "when": {},
                         "retrieval": {"searches": ["keyword", "filter"]}},
            "compose": {"prompt": "Products:\n{products}\nShopper: {message}\nStylist:"},
            **extra,
        },
    })  # fmt: skip


async def test_a_test_kind_reads_the_products_as_data_and_its_field_is_logged(store) -> None:
    SEEN.clear()
    cfg = _chain({"cheapest": {"kind": "test_cheapest_shown"}},
                 ["retrieve", "cheapest", "compose"])  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("a rain jacket under 100 euros")
    assert done.status == "ok"
    steps = {s.step: s for s in store.steps(done.run_id)}
    # the retrieve step's row holds the products as data (what compose was shown)
    logged = logged_products(steps["retrieve"].updates)
    assert logged, steps["retrieve"].updates
    (seen,) = SEEN
    assert [p.id for p in seen] == [p.id for p in logged]
    assert all(isinstance(p.price, float) and p.currency == "EUR" for p in seen)
    assert all(p.price < 100 for p in seen)  # the filter search's price cap, as data
    assert all(isinstance(n, int) for p in seen for n in p.sizes.values())
    first = steps["retrieve"].updates["products"][0]
    assert {"id", "title", "price", "currency", "colours", "sizes", "stock"} <= set(first)
    # the test kind's field is in its row, though the kind has no code for the row
    best = min(seen, key=lambda p: p.price)
    assert steps["cheapest"].kind == "test_cheapest_shown"
    assert steps["cheapest"].updates == {
        "cheapest": {"id": best.id, "price": best.price, "currency": "EUR"}}
    # the prompt still shows the products as text lines, one a product
    (request,) = fake.requests
    prompt = request.messages[-1]["content"]
    for p in seen:
        assert f"- [{p.id}] {p.title} | {p.category} | €{p.price:.2f}" in prompt


async def test_the_products_field_shows_none_when_nothing_was_found(store) -> None:
    SEEN.clear()
    cfg = _chain({"cheapest": {"kind": "test_cheapest_shown"}},
                 ["retrieve", "cheapest", "compose"])  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("zzqx wvvy")
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["retrieve"].updates is not None
    assert steps["retrieve"].updates["products"] == []
    assert steps["cheapest"].updates == {"cheapest": None}
    assert "Products:\n(none)\n" in fake.requests[0].messages[-1]["content"]


@pytest.mark.parametrize("on_failure", ["open", "closed"])
async def test_an_undeclared_update_fails_the_step_under_its_on_failure(
    store, on_failure: str
) -> None:
    cfg = _chain({"sneaky": {"kind": "test_sneaky_writer", "on_failure": on_failure}},
                 ["sneaky", "retrieve", "compose"])  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("a rain jacket")
    steps = {s.step: s for s in store.steps(done.run_id)}
    sneaky = steps["sneaky"]
    assert sneaky.status == f"failed_{on_failure}"
    assert sneaky.error_type == "internal_error"
    assert "['answer']" in (sneaky.detail or {})["error"]
    assert sneaky.updates is None  # none of its updates was applied
    if on_failure == "open":
        assert done.status == "ok"
        assert done.output == "Try the Storm Shell, light and dry."
    else:
        assert done.status == "refused"


def test_a_kinds_name_must_agree_with_its_config_model() -> None:
    assert CheapestShown.kind == "test_cheapest_shown"  # taken from the config model

    class Mismatch(Step):
        kind = "test_mismatch_a"
        config_model = CheapestConfig

        @property
        def reads(self) -> frozenset[str]:
            return frozenset()

        def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
            raise NotImplementedError

    with pytest.raises(ValueError, match="config_model CheapestConfig says kind "
                                         "'test_cheapest_shown'"):
        register_step_kind(Mismatch)

    class Nameless(Step):
        @property
        def reads(self) -> frozenset[str]:
            return frozenset()

        def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
            raise NotImplementedError

    with pytest.raises(ValueError, match="no kind"):
        register_step_kind(Nameless)
