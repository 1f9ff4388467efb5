"""Several processes' logs read as one: ids renumbered, rows still joined, runs tagged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import UserInputError
from chainrun.log.several_logs import merge_logs
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider


async def _log(path: Path, kind: str, n: int, prefix: str) -> None:
    store = Store.open(path)
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(config_from_dict({}), store=store, providers={"local": fake},
                     kind=kind, quiet=True) as chain:  # type: ignore[arg-type]  # fmt: skip
        for i in range(n):
            await chain.run_turn(f"question {i}", conversation_id=f"{prefix}-{i}")
    store.close()


@pytest.fixture
async def logs(tmp_path: Path) -> list[Path]:
    a, b = tmp_path / "shop-a.db", tmp_path / "shop-b.db"
    await _log(a, "live", 3, "a")
    await _log(a, "replay", 2, "a-replay")
    await _log(b, "live", 4, "b")
    return [a, b]


def test_merge_renumbers_ids_and_keeps_rows_joined(logs: list[Path]) -> None:
    merged = merge_logs(logs)
    db = merged.store.db
    assert merged.processes == ["shop-a", "shop-b"]
    runs = list(db.table("runs").rows_where(order_by="id"))
    assert [(json.loads(r["meta"])["process"], json.loads(r["meta"])["source_run_id"], r["kind"])
            for r in runs] == [("shop-a", 1, "live"), ("shop-a", 2, "replay"),
                               ("shop-b", 1, "live")]  # fmt: skip
    turns = list(db.table("turns").rows)
    assert len(turns) == 9 and len({t["id"] for t in turns}) == 9
    by_run = {r["id"]: json.loads(r["meta"])["process"] for r in runs}
    for t in turns:  # each turn still belongs to its own process's run
        assert t["conversation_id"].startswith(by_run[t["run_id"]][-1])
    ids = {t["id"]: t for t in turns}
    for table in ("steps", "calls"):
        rows = list(db.table(table).rows)
        assert rows and all(r["turn_id"] in ids for r in rows)
        assert all(r["run_id"] == ids[r["turn_id"]]["run_id"] for r in rows)
    # six steps a turn (one of retrieve and policy skipped), three model calls
    assert db.table("steps").count == 9 * 6 and db.table("calls").count == 9 * 3
    assert merged.run_id("1@shop-b") == "3" and merged.run_id("live") == "live"
    # a bare id named a renumbered run of whichever log it fell in (new user)
    with pytest.raises(UserInputError, match="name a run as RUN@PROCESS"):
        merged.run_id("3")
    with pytest.raises(UserInputError, match="no log named 'shop-c'"):
        merged.run_id("1@shop-c")
    with pytest.raises(UserInputError, match="no run 7"):
        merged.run_id("7@shop-a")
    merged.store.close()


def test_merge_refuses_two_logs_of_one_name(tmp_path: Path, logs: list[Path]) -> None:
    other = tmp_path / "x"
    other.mkdir()
    copy = other / "shop-a.db"
    copy.write_bytes(logs[0].read_bytes())
    with pytest.raises(UserInputError, match="two logs named 'shop-a'"):
        merge_logs([logs[0], copy])


def test_compare_reads_a_fleet_of_logs(logs: list[Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "chainrun", "compare", "2@shop-a", "live", "--json",
         "--db", str(logs[0]), "--db", str(logs[1])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["logs"] == ["shop-a", "shop-b"]
    assert doc["a"]["selector"] == "2@shop-a" and doc["a"]["n_turns"] == 2
    assert doc["b"]["kind"] == "live" and doc["b"]["n_turns"] == 7  # both processes' live runs
    assert doc["turn"]["a"]["n"] == 2 and doc["turn"]["b"]["n"] == 7
    bad = subprocess.run(
        [sys.executable, "-m", "chainrun", "compare", "1@nope", "live",
         "--db", str(logs[0]), "--db", str(logs[1])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "no log named 'nope'" in bad.stderr
