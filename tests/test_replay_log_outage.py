"""PostgreSQL stopped under ``chainrun replay``: the replay ends with one consistent
message (what was lost, the run, the resume command) and the summary of what it
answered, from memory since the log cannot be read.

Before: exit 2 with "20 log writes were lost in all" beside "the write is still queued",
no summary on stdout and no resume command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ROOT, short_replay
from log_backends import need_pg

from chainrun.lab import LabServer
from chainrun.log.store import Store


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A private PostgreSQL server this module may stop and start."""
    need_pg()
    from benchmarks._pg import PrivateCluster

    with PrivateCluster(fsync=False) as c:
        yield c


def test_a_replay_whose_database_stops_says_what_was_lost_and_how_to_resume(
    cluster: Any, tmp_path: Path
) -> None:
    replay = short_replay(tmp_path, 12)
    with LabServer("lognormal", median_ms=400, sigma=0.1, n_tokens=8) as lab:
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "replay", str(replay), "--config", str(cfg),
             "--db", cluster.url, "--concurrency", "1"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            run_id = None
            while time.monotonic() < deadline:  # until the run has a turn or two logged
                with Store.open(cluster.url) as s:
                    runs = s.list_runs(1)
                    if runs and runs[0].id is not None and len(s.turns(runs[0].id)) >= 2:
                        run_id = runs[0].id
                        break
                time.sleep(0.3)
            assert run_id is not None, "the replay logged no turn in 120 s"
            stopper = threading.Thread(target=cluster.stop, args=("fast",))
            stopper.start()
            stopper.join()
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            cluster.start()
    assert proc.returncode == 2, err
    # the summary of what the run answered, from memory: every request was answered
    assert out.startswith(f"run {run_id} (replay, log unreachable): 12 turns, "), out
    errors = [ln for ln in err.splitlines() if ln.startswith("chainrun: error:")]
    assert len(errors) == 1, err
    (line,) = errors
    assert f"of run {run_id} were lost" in line and "still queued" not in err
    assert line.endswith(f"once the database is back, chainrun replay {replay} --db "
                         f"{cluster.url} --resume {run_id} runs the rest"), line  # fmt: skip
