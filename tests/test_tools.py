"""Tools: the config model, building tools from it, and the once-only runner (no model)."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from virtual_time import run_virtual, vloop

from chainrun.errors import ConfigError
from chainrun.tools import (
    FunctionTool,
    ToolCall,
    ToolConfig,
    ToolContext,
    TurnTools,
    build_tools,
)
from chainrun.tools.runner import ToolCallRecord

CART_SCHEMA = {
    "type": "object",
    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
    "required": ["sku", "qty"],
}


def cart_config(**kw: Any) -> ToolConfig:
    return ToolConfig(description="Add to cart", parameters=CART_SCHEMA,
                      function="x:y", side_effects=True, **kw)  # fmt: skip


class Counter:
    """A tool that counts its runs and remembers what it was given."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.runs: list[dict[str, Any]] = []
        self.finished = 0
        self.delay_s = delay_s
        self.started = asyncio.Event()

    async def __call__(self, sku: str, qty: int, idempotency_key: str,
                       context: ToolContext) -> dict[str, Any]:  # fmt: skip
        self.runs.append({"sku": sku, "qty": qty, "key": idempotency_key,
                          "call_id": context.call_id})  # fmt: skip
        self.started.set()
        await asyncio.sleep(self.delay_s)
        self.finished += 1
        return {"added": sku, "qty": qty, "cart_size": len(self.runs)}


def turn_tools(fn: Any, *, clear: Any = None, side_effects: bool = True) -> TurnTools:
    cfg = ToolConfig(description="Add to cart", parameters=CART_SCHEMA, function="x:y",
                     side_effects=side_effects)  # fmt: skip
    return TurnTools({"add_to_cart": FunctionTool("add_to_cart", cfg, fn)}, turn_key="42",
                     turn_id=42, clear_to_act=clear)  # fmt: skip


def call(args: Any, call_id: str = "call_1", name: str = "add_to_cart",
         position: int | None = None) -> ToolCall:  # fmt: skip
    """A call; its position in its answer defaults to the number in a ``call_N`` id."""
    text = args if isinstance(args, str) else json.dumps(args)
    if position is None:
        digits = call_id.rpartition("_")[2]
        position = int(digits) - 1 if digits.isdigit() and int(digits) > 0 else 0
    return ToolCall(call_id=call_id, name=name, arguments=text, position=position)


# -- config -------------------------------------------------------------------------------


def test_tool_config_refuses_an_invalid_schema() -> None:
    with pytest.raises(ValidationError, match="not a valid JSON Schema"):
        ToolConfig(description="d", parameters={"type": "object", "properties": 3},
                   function="m:f")  # fmt: skip


def test_tool_config_wants_an_object_schema_and_one_target() -> None:
    with pytest.raises(ValidationError, match="object schema"):
        ToolConfig(description="d", parameters={"type": "string"}, function="m:f")
    with pytest.raises(ValidationError, match="exactly one of function"):
        ToolConfig(description="d", function="m:f", url="http://127.0.0.1:1/x")
    with pytest.raises(ValidationError, match="exactly one of function"):
        ToolConfig(description="d")
    with pytest.raises(ValidationError, match="module:callable"):
        ToolConfig(description="d", function="no_colon")
    with pytest.raises(ValidationError, match="reserved"):
        ToolConfig(description="d", function="m:f", parameters={
            "type": "object", "properties": {"idempotency_key": {"type": "string"}}})


def test_build_tools_names_a_callable_that_does_not_import() -> None:
    cfg = ToolConfig(description="d", function="no_such_module_xyz:f")
    with pytest.raises(ConfigError) as e:
        build_tools({"lookup": cfg})
    assert str(e.value).startswith("tools.lookup.function: cannot import 'no_such_module_xyz'")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"tools.lookup.function: module 'json' has no attr"):
        build_tools({"lookup": ToolConfig(description="d", function="json:nope")})
    with pytest.raises(ConfigError, match=r"tools.bad name: tool name"):
        build_tools({"bad name": ToolConfig(description="d", function="json:dumps")})


def test_build_tools_finds_a_module_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "beside_cfg_tools.py").write_text(textwrap.dedent("""
        def lookup(order_id):
            return {"order_id": order_id, "status": "shipped"}
    """))
    tools = build_tools({"lookup": ToolConfig(description="d", function="beside_cfg_tools:lookup")},
                        base_dir=tmp_path)  # fmt: skip
    assert isinstance(tools["lookup"], FunctionTool)
    assert tools["lookup"].definition()["name"] == "lookup"


def test_build_tools_reports_a_module_that_fails_while_importing(tmp_path: Path) -> None:
    (tmp_path / "broken_cfg_tools.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(ConfigError, match=r"broken_cfg_tools.*RuntimeError: boom at import"):
        build_tools({"t": ToolConfig(description="d", function="broken_cfg_tools:f")},
                    base_dir=tmp_path)  # fmt: skip


# -- the runner ---------------------------------------------------------------------------


async def test_a_call_runs_once_with_its_idempotency_key() -> None:
    tool = Counter()
    tt = turn_tools(tool)
    rec = await tt.run(call({"sku": "JKT-1", "qty": 2}), step="compose", attempt=2, round=1,
                       t0=tt.clock())  # fmt: skip
    # the same step, round and position asked again (a step run again): not run again
    again = await tt.run(call({"sku": "JKT-1", "qty": 2}), step="compose", attempt=1, round=1,
                         t0=tt.clock())  # fmt: skip
    assert rec.status == "ok" and again is rec
    assert len(tool.runs) == 1 and tool.runs[0]["key"] == "42:compose:1:0"
    assert json.loads(rec.content) == {"added": "JKT-1", "qty": 2, "cart_size": 1}
    assert rec.attempt == 2 and rec.duration_ms is not None and rec.started_offset_ms is not None
    assert len(tt.records) == 1


async def test_a_reused_call_id_in_a_new_round_is_a_new_call() -> None:
    """llama.cpp has sent one constant id; kimi restarts ``name:0`` each round: the id is
    not the call's identity, what the turn asked (round and position) is."""
    tool = Counter()
    tt = turn_tools(tool)
    first = await tt.run(call({"sku": "JKT-1", "qty": 1}, call_id="call_0"), step="compose",
                         attempt=1, round=1, t0=tt.clock())  # fmt: skip
    second = await tt.run(call({"sku": "JKT-2", "qty": 1}, call_id="call_0"), step="compose",
                          attempt=1, round=2, t0=tt.clock())  # fmt: skip
    assert second is not first and [r["sku"] for r in tool.runs] == ["JKT-1", "JKT-2"]
    assert [r["key"] for r in tool.runs] == ["42:compose:1:0", "42:compose:2:0"]


async def test_invalid_arguments_are_told_to_the_model_and_nothing_runs() -> None:
    tool = Counter()
    tt = turn_tools(tool)
    bad = await tt.run(call({"sku": "JKT-1", "qty": "two"}), step="s", attempt=1, round=1,
                       t0=tt.clock())  # fmt: skip
    not_json = await tt.run(call('{"sku": "JKT-1", ', call_id="call_2"), step="s", attempt=1,
                            round=1, t0=tt.clock())  # fmt: skip
    unknown = await tt.run(call({}, call_id="call_3", name="refund"), step="s", attempt=1,
                           round=1, t0=tt.clock())  # fmt: skip
    assert tool.runs == []
    assert bad.status == "invalid_arguments" and "$.qty" in json.loads(bad.content)["error"]
    assert not_json.status == "invalid_arguments" and "not JSON" in not_json.content
    assert unknown.status == "unknown_tool" and "add_to_cart" in unknown.content
    assert bad.duration_ms is None and bad.started_offset_ms is None


async def test_product_ids_the_catalogue_does_not_hold_are_refused_before_any_run() -> None:
    """product_arguments: a string or an array of ids, looked up once per call; any id
    the catalogue lacks refuses the call (even a replay's stub), naming every one."""
    schema = {"type": "object", "required": ["skus"],
              "properties": {"skus": {"type": "array", "items": {"type": "string"}}}}
    cfg = ToolConfig(description="Add several", parameters=schema, function="x:y",
                     side_effects=True, product_arguments=["skus"])  # fmt: skip
    asked: list[list[str]] = []

    async def known(ids: Any) -> list[str]:
        asked.append(list(ids))
        return [i for i in ids if i.startswith("JKT-")]

    runs: list[Any] = []
    tools = {"add": FunctionTool("add", cfg, lambda skus: runs.append(skus) or {"ok": True})}
    for act in (True, False):
        tt = TurnTools(tools, turn_key="7", known_products=known, act=act)
        bad = await tt.run(call({"skus": ["JKT-012", "lab", "x1", "lab"]}, name="add"),
                           step="s", attempt=1, round=1, t0=tt.clock())  # fmt: skip
        assert bad.status == "invalid_arguments" and runs == []
        assert json.loads(bad.content) == {"error": "no products 'lab', 'x1' in the catalogue "
                                           "(skus must be a product id); nothing was done"}
    assert asked == [["JKT-012", "lab", "x1"]] * 2
    tt = TurnTools(tools, turn_key="8", known_products=known)
    good = await tt.run(call({"skus": ["JKT-012"]}, name="add"), step="s", attempt=1,
                        round=1, t0=tt.clock())  # fmt: skip
    assert good.status == "ok" and runs == [["JKT-012"]]


async def test_a_failing_tool_is_an_error_the_model_sees() -> None:
    def explode(sku: str, qty: int) -> None:
        raise LookupError(f"no such sku {sku}")

    tt = turn_tools(explode)
    rec = await tt.run(call({"sku": "X", "qty": 1}), step="s", attempt=1, round=1, t0=tt.clock())
    assert rec.status == "error" and rec.error_type == "LookupError"
    assert json.loads(rec.content) == {"error": "LookupError: no such sku X"}


def test_a_slow_tool_times_out() -> None:
    async def slow(sku: str, qty: int) -> str:
        await asyncio.sleep(5)
        return "late"

    async def main() -> ToolCallRecord:
        cfg = cart_config(timeout_s=0.05)
        tools = {"add_to_cart": FunctionTool("add_to_cart", cfg, slow)}
        tt = TurnTools(tools, turn_key="t", clock=vloop().time)
        return await tt.run(call({"sku": "X", "qty": 1}), step="s", attempt=1, round=1,
                            t0=tt.clock())  # fmt: skip

    rec = run_virtual(main)  # virtual time: the tool's 5 s and its 50 ms timeout are exact
    assert rec.status == "timeout" and "do not call it again" in rec.content
    assert rec.duration_ms == pytest.approx(50.0)  # stopped at its timeout, not at 5 s


async def test_a_result_that_is_not_json_is_an_error() -> None:
    tt = turn_tools(lambda sku, qty: {1, 2})
    rec = await tt.run(call({"sku": "X", "qty": 1}), step="s", attempt=1, round=1, t0=tt.clock())
    assert rec.status == "error" and rec.error_type == "result_not_json"


async def test_cancelled_before_a_side_effect_started_it_never_starts() -> None:
    tool = Counter()
    gate = asyncio.Event()  # the turn is never clear to act: a guard still runs

    async def clear(step: str) -> None:
        await gate.wait()

    tt = turn_tools(tool, clear=clear)
    task = asyncio.create_task(tt.run(call({"sku": "X", "qty": 1}), step="s", attempt=1,
                                      round=1, t0=tt.clock()))  # fmt: skip
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()
    await asyncio.sleep(0.05)
    assert tool.runs == []
    assert [r.status for r in tt.records] == ["not_started"]


async def test_cancelled_while_a_side_effect_runs_it_finishes_once_and_is_recorded() -> None:
    tool = Counter(delay_s=0.2)
    tt = turn_tools(tool)
    task = asyncio.create_task(tt.run(call({"sku": "X", "qty": 1}), step="s", attempt=1,
                                      round=1, t0=tt.clock()))  # fmt: skip
    await tool.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tool.finished == 1 and len(tool.runs) == 1  # awaited to its end, never again
    (rec,) = tt.records
    assert rec.status == "ok" and rec.turn_cancelled
    assert rec.duration_ms is not None and rec.duration_ms >= 150


async def test_a_read_only_tool_does_not_wait_for_the_turn_to_be_clear() -> None:
    waited: list[str] = []

    async def clear(step: str) -> None:
        waited.append("waited")
        await asyncio.Event().wait()  # never clear

    tt = turn_tools(lambda sku, qty: {"stock": 3}, clear=clear, side_effects=False)
    rec = await tt.run(call({"sku": "X", "qty": 1}), step="s", attempt=1, round=1, t0=tt.clock())
    assert rec.status == "ok" and waited == []
