"""Every config round-trips: through the snapshot stored with each run (what ``replay
--resume`` validates again) and through the effective TOML of ``chainrun config show``.

The configs are generated from the config models themselves (every key of every model,
each kind's own model included, values drawn from the key's type and constraints), so
a key added later is covered without touching this test: a key that dumps to something
its own model refuses (a hedged run once stored ``hedge.deadline_s: null``, which
``--resume`` then refused) fails here.
"""

from __future__ import annotations

import tempfile
import types
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo

from chainrun.config import (
    ChainConfig,
    ProviderConfig,
    config_from_dict,
    config_from_snapshot,
    effective_toml,
    load_config,
    step_config_models,
)
from chainrun.errors import ConfigError
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

#: Strings the generator draws besides free text, so that keys constrained to names
#: (providers, steps, searches, checks, state fields, percentiles, URLs) are reached.
VOCAB = [
    "local", "backup", "classify", "retrieve", "compose", "validate", "critique", "guard",
    "finder", "label", "products", "answer", "message", "keyword", "keyword_any", "hybrid",
    "filter", "vector", "card", "iban", "email", "p95", "p50", "sizing", "returns",
    "{message}", "Shopper: {message}\nProducts: {products}\n", "http://127.0.0.1:8080/v1",
    "https://shop.openai.azure.com", "2024-10-21", "SHOP_KEY", r"\bORD-\d{6}\b", "json",
]  # fmt: skip


class _Window(BaseModel):
    model_config = {"extra": "forbid", "frozen": True}

    #: days
    days: int = Field(default=30, ge=1, le=365)
    #: whether returns count
    returns: bool = False


class FinderConfig(StepConfig):
    """A registered kind's own model, with keys of many types."""

    kind: Literal["test_roundtrip_finder"] = "test_roundtrip_finder"
    #: attempts, at most 5
    tries: int = Field(default=1, ge=1, le=5)
    #: a timeout in s
    timeout_s: float = Field(default=2.5, gt=0)
    #: how to match
    mode: Literal["exact", "prefix"] = "exact"
    #: order prefixes
    prefixes: list[str] = Field(default_factory=list)
    #: weights by name
    weights: dict[str, int] = Field(default_factory=dict)
    #: an optional note
    note: str | None = None
    #: a nested table
    window: _Window = Field(default_factory=_Window)


class Finder(Step):
    kind = "test_roundtrip_finder"
    config_model = FinderConfig
    state_fields = (StateField("found", "what the finder found"),)

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"message"})

    @property
    def writes(self) -> frozenset[str]:
        return frozenset({"found"})

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        yield StepResult(updates={"found": state.message})


register_step_kind(Finder)

#: Tables a model needs before any other key validates (required keys, "one of" keys).
SEEDS: dict[type[BaseModel], list[dict[str, Any]]] = {
    ProviderConfig: [
        {},
        {"kind": "azure", "endpoint": "https://shop.openai.azure.com",
         "api_version": "2024-10-21", "api_key_env": "SHOP_KEY"},
    ],
}


def _seeds(model: type[BaseModel]) -> list[dict[str, Any]]:
    if model in SEEDS:
        return SEEDS[model]
    if model.__name__ == "HedgeConfig":
        return [{"delay_ms": 50.0}, {"delay": "p95"}]
    if model.__name__ == "GuardConfig":
        return [{"kind": "guard", "on_missing_verdict": "open"}]
    return [{}]


def _bounds(meta: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in meta:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def strategy_for(tp: Any, meta: list[Any] | None = None) -> st.SearchStrategy[Any]:
    """Values of type ``tp`` (within the constraints in ``meta``), as a TOML/JSON user
    would write them."""
    meta = list(meta or [])
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        inner = [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return strategy_for(args[0], [*meta, *inner])
    b = _bounds(meta)
    if tp is type(None):
        return st.none()
    if origin in (Union, types.UnionType):
        return st.one_of([strategy_for(a, meta) for a in args])
    if origin is Literal:
        return st.sampled_from(args)
    if tp is bool:
        return st.booleans()
    if tp is int:
        lo = b.get("ge", b["gt"] + 1 if "gt" in b else -1000)
        hi = b.get("le", b["lt"] - 1 if "lt" in b else 100_000)
        return st.integers(lo, hi)
    if tp is float:
        lo = b.get("ge", b.get("gt", -1000.0))
        hi = b.get("le", b.get("lt", 100_000.0))
        return st.floats(lo, hi, exclude_min="gt" in b, exclude_max="lt" in b,
                         allow_nan=False, allow_infinity=False)  # fmt: skip
    if tp is str:
        return st.one_of(st.sampled_from(VOCAB), st.text(max_size=12))
    if origin in (list, tuple, frozenset, set):
        items = strategy_for(args[0])
        lo = b.get("min_length", 0)
        return st.lists(items, min_size=lo, max_size=max(lo, b.get("max_length", 3)))
    if origin is dict:
        keys = strategy_for(args[0])
        return st.dictionaries(keys, strategy_for(args[1]), max_size=2)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return table(tp)
    # Any (a JSON Schema, say): small JSON values
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(VOCAB))
    return st.recursive(leaves, lambda c: st.lists(c, max_size=2)
                        | st.dictionaries(st.sampled_from(VOCAB), c, max_size=2), max_leaves=4)


def field_strategy(model: type[BaseModel], name: str) -> st.SearchStrategy[Any]:
    info = model.model_fields[name]
    return strategy_for(info.annotation, list(info.metadata))


@st.composite
def table(draw: st.DrawFn, model: type[BaseModel]) -> dict[str, Any]:
    """A table ``model`` accepts: keys tried in random order, each kept if the model
    still validates with it."""
    out = dict(draw(st.sampled_from(_seeds(model))))
    names = draw(st.permutations(sorted(model.model_fields)))
    for name in names[: draw(st.integers(0, len(names)))]:
        if name in out or name == "kind":
            continue
        value = draw(field_strategy(model, name))
        try:
            model.model_validate({**out, name: value})
        except ValidationError:
            continue
        out[name] = value
    return out


def _valid(data: dict[str, Any]) -> bool:
    try:
        config_from_dict(data)
    except ConfigError:
        return False
    return True


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A chainrun.toml's data: providers, the default steps plus a guard and a registered
    kind, top-level tables; every key kept only if the whole config still validates."""
    data: dict[str, Any] = {"providers": {"local": draw(table(ProviderConfig))}}
    if draw(st.booleans()):
        data["providers"]["backup"] = draw(table(ProviderConfig))
    order = ["classify", "retrieve", "compose", "validate", "critique"]
    extra = {"guard": "guard", "finder": "test_roundtrip_finder"}
    for name in draw(st.lists(st.sampled_from(sorted(extra)), unique=True)):
        order.insert(draw(st.integers(0, len(order))), name)
    data["order"] = order
    models = step_config_models()
    steps: dict[str, dict[str, Any]] = {}
    data["steps"] = steps
    for name in order:
        kind = extra.get(name, "retrieve" if name == "retrieve" else "llm")
        model = models[kind]
        steps[name] = {**draw(st.sampled_from(_seeds(model))), "kind": kind}
        keys = draw(st.permutations(sorted(set(model.model_fields) - {"kind"})))
        for key in keys[: draw(st.integers(0, len(keys)))]:
            value = draw(field_strategy(model, key))
            trial = {**data, "steps": {**steps, name: {**steps[name], key: value}}}
            if _valid(trial):
                steps[name][key] = value
    top = sorted(set(ChainConfig.model_fields) - {"providers", "steps", "order"})
    for key in draw(st.permutations(top))[: draw(st.integers(0, len(top)))]:
        value = draw(field_strategy(ChainConfig, key))
        if _valid({**data, key: value}):
            data[key] = value
    return data


def _has_none(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_has_none(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_none(v) for v in value)
    return False


def _same(a: ChainConfig, b: ChainConfig) -> None:
    assert a.snapshot() == b.snapshot()
    assert a.model_dump() == b.model_dump()
    assert {n: type(s) for n, s in a.steps.items()} == {n: type(s) for n, s in b.steps.items()}


def test_every_config_round_trips_through_its_snapshot_and_its_toml() -> None:
    seen: set[str] = set()

    @settings(max_examples=40, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(configs())
    def round_trip(data: dict) -> None:
        cfg = config_from_dict(data)
        # the snapshot a run stores, validated again as `replay --resume` does
        _same(config_from_snapshot(cfg.snapshot()), cfg)
        # the effective TOML, loaded again as a chainrun.toml (TOML has no null: a config
        # written with None values is not one a file can hold)
        if not _has_none(data):
            with tempfile.TemporaryDirectory() as d:
                p = Path(d) / "chainrun.toml"
                p.write_text(effective_toml(cfg, "test"), encoding="utf-8")
                _same(load_config(p), cfg)
        for name, t in data["steps"].items():
            seen.update(f"{name}.{k}" for k in t)
        seen.update(f"providers.{p.get('kind', 'openai')}" for p in data["providers"].values())
        seen.update(k for k in data if k not in ("steps", "providers", "order"))

    round_trip()
    # not a vacuous property: the configs held hedges, a kind's own keys, routing, azure
    assert any(k.endswith(".hedge") for k in seen), sorted(seen)
    assert any(k.startswith("finder.") and k != "finder.kind" for k in seen), sorted(seen)
    assert any(k.endswith(".when") for k in seen), sorted(seen)
    assert "providers.azure" in seen, sorted(seen)
