"""chainrun local status | down: another install's server is left alone."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cli_runner import chainrun

from chainrun.cli import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the local server ------------------------------------------------------------------

_HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_local_status_and_down_leave_another_installs_server_alone(tmp_path: Path) -> None:
    # another virtualenv's llama-server (a stand-in answering /health), recorded in the
    # shared state directory the way that install's chainrun records it
    other_bin = tmp_path / "other-venv" / "bin" / "llama-server"
    other_bin.parent.mkdir(parents=True)
    other_bin.symlink_to(sys.executable)
    model = tmp_path / "other-model.gguf"
    port = _free_port()
    args = [str(other_bin), "-c", _HEALTH_SERVER, str(port), "--model", str(model)]
    proc = subprocess.Popen(args, start_new_session=True)
    home = tmp_path / "home"
    home.mkdir()
    (home / "local-server.json").write_text(json.dumps({  # as an older chainrun wrote it
        "pid": proc.pid, "port": port, "model_path": str(model), "started_at": time.time(),
        "log_path": str(home / "llama-server.log")}))  # fmt: skip
    env = {"CHAINRUN_HOME": str(home)}
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            time.sleep(0.05)
        status = chainrun("local", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["running"] is False  # not this install's server
        assert [(o["pid"], o["binary"]) for o in doc["others"]] == [(proc.pid, str(other_bin))]
        text = chainrun("local", "status", env=env).stdout
        assert "not running" in text and "another install's server" in text
        down = chainrun("local", "down", env=env)
        assert down.returncode == 2 and "another install's" in down.stderr
        assert "--force" in down.stderr and proc.poll() is None  # left alone
        forced = chainrun("local", "down", "--force", "--json", env=env)
        assert forced.returncode == 0, forced.stderr
        assert json.loads(forced.stdout)["pid"] == proc.pid
        assert proc.wait(timeout=10) is not None
        assert not list(home.glob("local-server*.json"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_json_usage_errors_are_a_json_document_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["chainrun", "runs", "--limit", "0", "--json"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    err = json.loads(captured.out)["error"]
    assert err["type"] == "usage_error" and "--limit" in err["message"]
    assert len(captured.err.strip().splitlines()) == 1
