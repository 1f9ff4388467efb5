"""The run log's file deleted during a replay: the replay stops at the next turn and says,
in one line, which turns went with the file.

Before: SQLite went on writing into the deleted file (the process held it open) without
an error; the replay ran every request, printed a summary of a run that no longer
existed anywhere and exited 0 (or, once the path was gone, said "no such log" at the
very end). The log here is a real SQLite file, deleted from outside as a user would
(``rm``), with the lab as the model server.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chainrun.lab import LabServer

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"


def _logged_requests(db: Path) -> list[str]:
    """The request ids of the turns committed so far (read-only: never creates the log)."""
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return [r[0] for r in conn.execute("select request_id from turns order by id")]
        finally:
            conn.close()
    return []


@pytest.mark.parametrize("as_json", [False, True])
def test_a_log_deleted_mid_replay_stops_it_with_one_line_naming_the_lost_turns(
    tmp_path: Path, as_json: bool
) -> None:
    db = tmp_path / "log.db"
    # a turn takes ~1 s here: the replay is far from its end when the file is deleted
    with LabServer("lognormal", median_ms=300, sigma=0.1, n_tokens=8) as lab:
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "replay", str(REPLAY), "--config", str(cfg),
             "--db", str(db), *(["--json"] if as_json else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )  # fmt: skip
        try:
            deadline, before = time.monotonic() + 60, []
            while not before and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
                before = _logged_requests(db)
            assert proc.poll() is None, f"ended before the delete: {proc.communicate()}"
            for suffix in ("", "-wal", "-shm"):  # rm log.db*
                Path(f"{db}{suffix}").unlink(missing_ok=True)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("chainrun: error: run log ") and str(db) in line
    assert "deleted or replaced while run 1 was writing it" in line
    for request_id in before:  # the turns committed before the delete went with the file
        assert request_id in line
    # it stopped at the first turn after the delete, not after the last request
    stopped = line.rsplit("stopped with ", 1)
    assert len(stopped) == 2 and stopped[1].endswith(" requests not run"), line
    assert int(stopped[1].split()[0]) >= 1
    if as_json:
        error = json.loads(stdout)["error"]
        assert error["type"] == "log_file_gone" and error["file"] == str(db)
        assert error["message"] == line.removeprefix("chainrun: error: ")
    else:
        assert stdout == ""  # no summary of a run that exists nowhere
    assert not db.exists()  # no new, empty log left where the deleted one was
    assert not os.path.exists(f"{db}-wal")
