"""Providers at start-up: a dead hedge target, a server that is not an OpenAI API."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import chainrun, short_replay
from static_files import serve_directory

from chainrun.lab import LabServer
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]


REPLAY = ROOT / "replays" / "commerce-12.jsonl"


# -- providers -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dead_hedge_target_does_not_block_the_run(lab: LabServer, tmp_path: Path) -> None:
    cfg = tmp_path / "hedged.toml"
    cfg.write_text(
        f'[providers.local]\nbase_url = "{lab.base_url}"\n'
        f'[providers.backup]\nbase_url = "http://127.0.0.1:{_free_port()}/v1"\n'
        '[steps.validate.hedge]\ndelay_ms = 1\nmax_attempts = 2\ntargets = ["local", "backup"]\n'
    )
    db = tmp_path / "log.db"
    replay = short_replay(tmp_path)
    proc = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "backup" in line]
    assert len(warnings) == 1 and "circuit breaker starts open" in warnings[0]
    doc = json.loads(proc.stdout)
    assert doc["turn"]["n"] == 3 and doc["status"] == "complete"
    with Store.open(db) as store:
        calls = store.calls(doc["run_id"])
        assert all(t.status == "ok" for t in store.turns(doc["run_id"]))
    to_backup = [c for c in calls if c.target == "backup"]
    assert to_backup and all(c.outcome == "suppressed" for c in to_backup)  # never sent
    # an unreachable primary still stops the run
    cfg.write_text(cfg.read_text().replace('targets = ["local", "backup"]',
                                           'targets = ["backup", "local"]')
                   + '[steps.compose]\nprovider = "backup"\n')  # fmt: skip
    proc = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2 and "cannot reach provider 'backup'" in proc.stderr


@pytest.fixture
def static_server(tmp_path: Path) -> Iterator[str]:
    """A plain static file server (not an OpenAI API) serving an empty directory."""
    root = tmp_path / "www"
    root.mkdir()
    with serve_directory(root) as url:
        yield url


def test_a_server_that_is_not_an_openai_api_stops_at_preflight(
    static_server: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "static.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{static_server}/v1"\n')
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(REPLAY), "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2
    assert "not an OpenAI-compatible API" in proc.stderr
    assert "HTTP 404 with text/html" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # a 200 that is no model list (a file where /v1/models would be) is caught too
    models = tmp_path / "www" / "v1" / "models"
    models.parent.mkdir()
    models.write_text("<html>hello</html>")
    proc = chainrun("run", "hi", "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2 and "HTTP 200" in proc.stderr
    with Store.open(db) as store:
        assert all(r.status != "complete" for r in store.list_runs())
