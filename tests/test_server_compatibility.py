"""The compatibility page's every cell, shown by running it: for each server family
(chainrun.lab.servers.SERVER_PROFILES) the lab sends its streams as that family does and
chainrun's chain reads them through the real ``openai`` client; what chainrun logged is
turned into the cell's words and compared with the page's claim. The page itself
(docs/reference/compatibility.md) must hold the table as generated."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from counted_tools import ORDER, RUNS

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer, load_scenario
from chainrun.lab.names import SERVER_FAMILY_NAMES
from chainrun.lab.scenarios import Scenario
from chainrun.lab.servers import (
    FEATURES,
    SERVER_PROFILES,
    THOUGHT,
    compatibility_table,
    expected_cell,
)
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "compatibility.md"
LABEL = {"type": "object", "required": ["label"], "additionalProperties": False,
         "properties": {"label": {"type": "string", "enum": ["order_status", "returns"]}}}


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast") as server:
        yield server


async def _turn(lab: LabServer, family: str, step: dict[str, Any], message: str,
                **scenario: Any) -> tuple[Any, Any]:  # fmt: skip
    """One turn of a one-step chain against the lab sending as ``family``: (finished
    turn, the step's winning call row)."""
    lab.set_scenario(Scenario(name=family, server=family, n_tokens=6, record_bodies=True,
                              **scenario))
    cfg = config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": lab.base_url}},
        "steps": {"answer": {"prompt": "{message}", "deadline_s": 10.0, **step}},
        "tools": {"order_status": ORDER},
    })  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn(message)
        calls = store.calls(chain.run_id or 0)
    return done, calls[-1]


async def observe(lab: LabServer, family: str) -> dict[str, str]:
    """Each feature's cell as chainrun's log shows it for ``family``."""
    profile = SERVER_PROFILES[family]
    done, call = await _turn(lab, family, {"stream": True}, "a rain jacket?",
                             prompt_cache={"warm_ttft_factor": 0.5})  # fmt: skip
    out: dict[str, str] = {}
    out["streamed TTFT"] = "yes" if call.ttft_ms is not None and done.output else "no"
    usage_ok = call.input_tokens is not None and call.output_tokens is not None
    out["usage"] = ("yes" + (" (on the finish chunk)" if profile.usage == "on_finish" else "")
                    if usage_ok else "no")  # fmt: skip
    if call.cached_input_tokens is None:
        out["cached tokens"] = "unknown: not reported"
    else:
        out["cached tokens"] = ("yes (`prompt_cache_hit_tokens`)"
                                if profile.usage == "deepseek" else "yes")  # fmt: skip
    out["reasoning tokens"] = ("unknown: not reported" if call.reasoning_tokens is None
                               else "yes")  # fmt: skip
    thought = "".join(THOUGHT)
    if not call.reasoning:
        out["reasoning text"] = "none sent" if "think" not in (done.output or "") else "leaked"
    elif call.reasoning == thought and thought not in (done.output or ""):
        out["reasoning text"] = ("moved out of the answer (`<think>` in content)"
                                 if profile.reasoning == "think_in_content"
                                 else "logged as reasoning (`reasoning_content`)")  # fmt: skip
    else:
        out["reasoning text"] = f"wrong: {call.reasoning!r}"
    RUNS.clear()
    done, _ = await _turn(lab, family, {"stream": True, "tools": ["order_status"],
                                        "max_tool_rounds": 2},
                          "where is order 1042?", tool_calls={"rounds": 1})  # fmt: skip
    # answered from the tool's result (the lab's last round: "order_status: {...}"): a
    # round the server refused leaves no such answer
    answered = '"status": "shipped"' in (done.output or "")
    ran = len(RUNS) if done.status == "ok" and answered and RUNS == [1042] * len(RUNS) else 0
    sent = [m for r in lab.requests() for m in r["messages"] or []
            if m.get("role") == "assistant" and m.get("tool_calls")]
    passed_back = bool(sent) and all(m.get("reasoning_content") == thought for m in sent)
    out["tool calls"] = ("no" if not ran else "yes" + (f", {ran} in parallel" if ran > 1 else "")
                         + (" (its `reasoning_content` passed back)" if passed_back else ""))
    done, _ = await _turn(lab, family, {"stream": False, "json_schema": LABEL},
                          "where is my order", schema_answers=True)  # fmt: skip
    try:
        ok = json.loads(done.output or "")["label"] in ("order_status", "returns")
    except (ValueError, KeyError, TypeError):
        ok = False
    out["response_format"] = "yes" if ok else "no"
    return out


@pytest.mark.parametrize("family", SERVER_FAMILY_NAMES)
async def test_every_cell_of_the_family_holds(lab: LabServer, family: str) -> None:
    observed = await observe(lab, family)
    claimed = {f: expected_cell(SERVER_PROFILES[family], f) for f in FEATURES}
    assert observed == claimed


def test_the_page_holds_the_generated_table() -> None:
    """Regenerate with ``python -c "from chainrun.lab.servers import compatibility_table;
    print(compatibility_table())"`` and paste it between the page's markers."""
    text = PAGE.read_text(encoding="utf-8")
    start, end = "<!-- table: generated -->\n", "\n<!-- end of table -->"
    assert start in text and end in text
    table = text.split(start, 1)[1].split(end, 1)[0]
    assert table == compatibility_table()


async def test_the_shops_tool_rounds_pass_deepseek_its_reasoning_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example shop against the lab sending as DeepSeek's thinking mode (reasoning
    before the tool call, a 400 for a tool-call message without it): two turns of one
    conversation each look the order up and answer from it; every request's assistant
    tool-call message, of this turn's rounds and of the earlier turn's history, holds
    the reasoning it was streamed with, and the lab refused none."""
    shop = ROOT / "examples" / "shop"
    monkeypatch.setenv("SHOP_DB", str(tmp_path / "shop.db"))
    scenario = load_scenario(shop / "lab.toml").model_copy(
        update={"server": "deepseek", "record_bodies": True})
    with LabServer(scenario) as lab:
        data = tomllib.loads((shop / "chainrun.toml").read_text(encoding="utf-8"))
        data["providers"]["local"]["base_url"] = lab.base_url
        cfg = config_from_dict(data, str(shop / "chainrun.toml"), path=str(shop / "chainrun.toml"))
        with Store.open(tmp_path / "log.db") as store:
            async with Chain(cfg, store=store, quiet=True) as chain:
                turns = [await chain.run_turn(m, conversation_id="c-ds")
                         for m in ("Where is my order 1042?", "Is order 1044 delivered?")]
        requests = lab.requests()
    assert [(t.status, t.label) for t in turns] == [("ok", "order_status")] * 2
    assert '"status": "shipped"' in (turns[0].output or "")
    assert '"status": "delivered"' in (turns[1].output or "")
    assert [r["status_code"] for r in requests] == [200] * len(requests)
    sent = [m for r in requests for m in r["messages"] or []
            if m.get("role") == "assistant" and m.get("tool_calls")]
    # turn 1's round 2 (its call); turn 2's round 1 (turn 1's, as history), round 2 (both)
    assert len(sent) == 4
    assert all(m.get("reasoning_content") == "".join(THOUGHT) for m in sent)
