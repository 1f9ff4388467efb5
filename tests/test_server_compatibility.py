"""The compatibility page's every cell, shown by running it: for each server family
(chainrun.lab.servers.SERVER_PROFILES) the lab sends its streams as that family does and
chainrun's chain reads them through the real ``openai`` client; what chainrun logged is
turned into the cell's words and compared with the page's claim. The page itself
(docs/reference/compatibility.md) must hold the table as generated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from counted_tools import ORDER, RUNS

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
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
    lab.set_scenario(Scenario(name=family, server=family, n_tokens=6, **scenario))
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
    ran = len(RUNS) if done.status == "ok" and RUNS == [1042] * len(RUNS) else 0
    out["tool calls"] = ("no" if not ran else "yes" + (f", {ran} in parallel" if ran > 1 else ""))
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
