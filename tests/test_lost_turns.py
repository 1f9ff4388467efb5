"""A log write that fails during a replay: the lost turn is named, the run says so.

Before: ``chainrun replay`` printed a 107-line traceback and exited 1 (with ``--json``
stdout was empty); in the library, once a caller had caught the error from
``flush()``, the run ended ``complete``. Here the log refuses one turn's rows (a trigger
aborts the insert of request ``r2``'s turn: a batch the database refuses), with the lab
as the model server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import LogWriteError
from chainrun.lab import LabServer
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]


def refuse_request(db: Path, request_id: str) -> None:
    """Make the log refuse the turn row of ``request_id`` (as a full disk or a
    constraint would refuse a batch)."""
    with Store.open(db) as store:
        store.db.execute(
            "create trigger refuse_turn before insert on turns "
            f"when new.request_id = '{request_id}' "
            "begin select raise(abort, 'the log refused this turn'); end"
        )


def write_replay(tmp_path: Path) -> Path:
    p = tmp_path / "set.jsonl"
    p.write_text("".join(json.dumps({"id": f"r{i}", "message": f"question {i}"}) + "\n"
                         for i in range(1, 5)))  # fmt: skip
    return p


def chainrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chainrun", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip


@pytest.mark.parametrize("as_json", [False, True])
def test_replay_names_the_lost_turn_in_one_line(
    lab_config: Path, tmp_path: Path, as_json: bool
) -> None:
    db = tmp_path / "log.db"
    refuse_request(db, "r2")
    args = ["replay", str(write_replay(tmp_path)), "--config", str(lab_config), "--db", str(db)]
    proc = chainrun(*args, *(["--json"] if as_json else []))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "not logged" in ln]
    assert len(lines) == 1, proc.stderr
    assert "request r2" in lines[0] and "turn " in lines[0]
    assert "the log refused this turn" in lines[0]
    if as_json:
        doc = json.loads(proc.stdout)
        (lost,) = doc["lost_turns"]
        assert lost["request_id"] == "r2" and isinstance(lost["turn_id"], int)
        assert "refused" in lost["error"]
        assert doc["status"] == "lost_turns"
    with Store.open(db) as store:
        (run,) = store.list_runs()
        assert run.status == "lost_turns"
        logged = {t.request_id for t in store.turns(run.id or 0)}
    assert logged == {"r1", "r3", "r4"}


async def test_a_caught_flush_error_still_ends_the_run_lost_turns(
    lab: LabServer, tmp_path: Path
) -> None:
    db = tmp_path / "log.db"
    refuse_request(db, "b")
    cfg = config_from_dict({"providers": {"local": {"base_url": lab.base_url}}})
    store = Store.open(db)
    try:
        chain = Chain(cfg, store=store)
        async with chain:
            done = {rid: await chain.run_turn(f"question {rid}", request_id=rid)
                    for rid in ("a", "b", "c")}  # fmt: skip
            with pytest.raises(LogWriteError) as caught:
                await chain.flush()  # the caller catches it and goes on
            (lost,) = caught.value.lost
            assert lost.request_id == "b" and lost.turn_id == done["b"].turn_id
            assert "request b" in str(caught.value)
        run = store.get_run(chain.run_id or 0)
        assert run.status == "lost_turns"  # not "complete", whoever caught what
    finally:
        store.close()
