"""The model server gone mid-replay: the one error line names the run left ``failed`` and
the command that runs the rest, as the Ctrl-C line does.

Before: ``chainrun: error: cannot reach provider 'local' at URL`` and exit 2, naming
neither the run nor ``--resume`` (only docs/guides/reliability.md said how to go on). A
real lab stopped under a real replay, then started again on its port; the line's own
command is run.
"""

from __future__ import annotations

import contextlib
import shlex
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from chainrun.lab import LabServer

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"


def _turns(db: Path) -> int:
    """Turns committed so far (read-only: never creates the log)."""
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return int(conn.execute("select count(*) from turns").fetchone()[0])
        finally:
            conn.close()
    return 0


def _run_status(db: Path, run_id: int) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("select status from runs where id = ?", [run_id]).fetchone()[0])
    finally:
        conn.close()


def test_a_provider_gone_mid_replay_names_the_run_and_how_to_run_the_rest(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    lab = LabServer("lognormal", median_ms=300, sigma=0.1, n_tokens=8).start()
    try:
        port = lab.port
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "replay", str(REPLAY), "--config", str(cfg),
             "--db", str(db), "--concurrency", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not _turns(db) and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            assert proc.poll() is None, f"ended before the lab stopped: {proc.communicate()}"
            lab.stop()  # the model server goes away under the replay
            _, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        lab.stop()
    assert proc.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("chainrun: error: cannot reach provider 'local' at "), line
    logged = _turns(db)
    assert f"; run 1 ended failed with {logged} turns logged; once it answers, " in line
    assert _run_status(db, 1) == "failed"
    again = line.rsplit("once it answers, ", 1)[1]
    assert again.endswith(" runs the rest"), line
    argv = shlex.split(again.removesuffix(" runs the rest"))
    assert argv == ["chainrun", "replay", str(REPLAY), "--db", str(db), "--resume", "1"]
    # the model server back on its port: the line's own command runs the rest of run 1
    with LabServer("lognormal", median_ms=30, sigma=0.1, n_tokens=8).start(port=port or 0):
        resumed = subprocess.run([sys.executable, "-m", "chainrun", *argv[1:]],
                                 capture_output=True, text=True, cwd=tmp_path,
                                 timeout=120)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert _run_status(db, 1) == "complete"
    assert _turns(db) >= 12
