"""Replays and evals never act by default: a tool with side effects that the model asks
for in ``chainrun replay`` or ``chainrun eval`` is not carried out (counted by the tool
itself); the model is told the tool's ``replay_result`` and the call row says
``stubbed``; ``--act`` carries it out, once per turn. The lab is the model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w
from cli_runner import chainrun
from counted_tools import CART, CART_RUNS

from chainrun.lab import LabServer
from chainrun.log.store import Store

MESSAGES = ["put 2 of JKT-12 in my cart", "add 1 SHO-3 to the cart", "cart 3 of ACC-7"]


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=4, tool_calls={"rounds": 1}) as server:
        yield server


def _setup(tmp: Path, lab: LabServer, **cart: object) -> tuple[Path, Path, Path]:
    cfg = tmp / "chainrun.toml"
    cfg.write_text(tomli_w.dumps({
        "order": ["compose"], "answer_step": "compose",
        "providers": {"local": {"base_url": lab.base_url}},
        "steps": {"compose": {"prompt": "{message}", "tools": ["add_to_cart"]}},
        "tools": {"add_to_cart": {**CART, **cart}},
    }))  # fmt: skip
    requests = tmp / "r.jsonl"
    requests.write_text("".join(json.dumps({"id": f"r{i}", "message": m}) + "\n"
                                for i, m in enumerate(MESSAGES)))  # fmt: skip
    cases = tmp / "c.jsonl"
    cases.write_text("".join(json.dumps({"id": f"c{i}", "message": m, "assert": [
        {"type": "tool-called", "tool": "add_to_cart", "status": "stubbed"}]}) + "\n"
        for i, m in enumerate(MESSAGES)))  # fmt: skip
    return cfg, requests, cases


def _rows(db: Path, run_id: int) -> list[tuple[str, str | None]]:
    with Store.open(db, create=False) as s:
        return [(t.status, t.result) for t in s.tool_calls(run_id)]


@pytest.mark.parametrize("command", ["replay", "eval"])
def test_a_replay_and_an_eval_never_act_by_default(lab: LabServer, tmp_path: Path,
                                                   command: str) -> None:  # fmt: skip
    cfg, requests, cases = _setup(tmp_path, lab)
    db = tmp_path / "log.db"
    CART_RUNS.clear()
    target = requests if command == "replay" else cases
    res = chainrun(command, str(target), "--config", str(cfg), "--db", str(db))
    assert res.returncode == 0, res.output
    assert CART_RUNS == []  # the tool itself says it never ran
    assert _rows(db, 1) == [("stubbed", '{"stubbed": true}')] * 3


def test_act_carries_out_the_tool_once_per_turn(lab: LabServer, tmp_path: Path) -> None:
    cfg, requests, _ = _setup(tmp_path, lab)
    db = tmp_path / "log.db"
    CART_RUNS.clear()
    res = chainrun("replay", str(requests), "--config", str(cfg), "--db", str(db), "--act")
    assert res.returncode == 0, res.output
    assert sorted(CART_RUNS) == ["ACC-7", "JKT-12", "SHO-3"]
    assert [s for s, _ in _rows(db, 1)] == ["ok"] * 3


def test_a_declared_stub_result_and_a_tool_that_runs_in_replays(
    lab: LabServer, tmp_path: Path
) -> None:
    cfg, requests, _ = _setup(tmp_path, lab, replay_result={"added": "nothing", "dry_run": True})
    db = tmp_path / "log.db"
    CART_RUNS.clear()
    assert chainrun("replay", str(requests), "--config", str(cfg), "--db", str(db)).returncode == 0
    assert CART_RUNS == []
    assert {r for _, r in _rows(db, 1)} == {'{"added": "nothing", "dry_run": true}'}
    cfg, requests, _ = _setup(tmp_path, lab, replay="run")
    assert chainrun("replay", str(requests), "--config", str(cfg), "--db", str(db)).returncode == 0
    assert len(CART_RUNS) == 3


def test_record_tells_the_model_what_the_live_turn_was_told_and_runs_nothing(
    lab: LabServer, tmp_path: Path
) -> None:
    """``replay = "record"``: live turns (request ids r0..r2) carry the tool out; the
    replay of lines with those ids runs it 0 times, and each call row is ``recorded``
    with the live turn's result; a line with no live turn behind it is ``not_recorded``."""
    from chainrun.chain import Chain
    from chainrun.config import load_config

    cfg, requests, _ = _setup(tmp_path, lab, replay="record")
    db = tmp_path / "log.db"
    CART_RUNS.clear()

    async def live_turns() -> None:
        with Store.open(db) as store:
            async with Chain(load_config(cfg), store=store, kind="live", quiet=True) as chain:
                for i, m in enumerate(MESSAGES[:2]):
                    await chain.run_turn(m, request_id=f"r{i}")

    asyncio.run(live_turns())
    live = _rows(db, 1)
    assert [s for s, _ in live] == ["ok"] * 2 and len(CART_RUNS) == 2
    res = chainrun("replay", str(requests), "--config", str(cfg), "--db", str(db))
    assert res.returncode == 0, res.output
    assert len(CART_RUNS) == 2  # the replay ran it 0 times
    with Store.open(db, create=False) as s:
        rows = sorted(s.tool_calls(2), key=lambda r: r.turn_id or 0)
    assert [r.status for r in rows] == ["recorded"] * 3
    assert [r.result for r in rows[:2]] == [r for _, r in live]  # the live turns' results
    assert '"added": "JKT-12"' in (rows[0].result or "")
    assert rows[2].error_type == "not_recorded"  # r2 had no live turn
