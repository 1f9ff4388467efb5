"""The local model server starts at niceness 0 whatever the niceness of the command that
starts it: the server is shared by every later command of the install.

Before: a server started by a test run under ``nice -n 19`` ran at 19 for every later
user (a benchmark measured a starved model until someone reniced it). The server here is
a stand-in executable named llama-server (a small HTTP server answering ``/health``) of
an install of its own (its own binary, model and state directory): no real model, and
no other server of the machine is found, started or stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: a llama-server stand-in: answers GET /health on --port; prints nothing
_FAKE_SERVER = """#!{python}
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{{"status":"ok"}}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""

#: run in a child made nicer than 0: start the server through local_model.up, print what
#: it got, stop it; "unprivileged": setpriority(2) refuses to lower a niceness
_STARTER = """
import json, os, sys
from pathlib import Path
from chainrun.runtime import local_model
os.nice(10)
local_model.server_binary = lambda: Path(sys.argv[1])
local_model.model_path = lambda: Path(sys.argv[2])
if sys.argv[3] == "unprivileged":  # as setpriority(2) answers without CAP_SYS_NICE
    def refuse(*args):
        raise PermissionError(13, "Permission denied")
    os.setpriority = refuse
server = local_model.up(quiet=True, timeout_s=60)
try:
    print(json.dumps({"starter": os.getpriority(os.PRIO_PROCESS, 0),
                      "server": os.getpriority(os.PRIO_PROCESS, server.pid),
                      "pid": server.pid}))
finally:
    local_model.stop(server)
"""


@pytest.mark.parametrize("privilege", ["as_is", "unprivileged"])
def test_a_niced_starter_starts_the_server_at_niceness_0(tmp_path: Path, privilege: str) -> None:
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(_FAKE_SERVER.format(python=sys.executable))
    fake.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"")
    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-c", _STARTER, str(fake), str(model), privilege],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "CHAINRUN_HOME": str(home)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["starter"] > 0  # the command that started it ran niced
    # lowering a niceness needs CAP_SYS_NICE (root has it; CI runs as root)
    if privilege == "as_is" and os.geteuid() == 0:
        assert got["server"] == 0, got
        assert "niceness" not in proc.stderr
    else:  # the server keeps the starter's niceness, and one line says so
        assert got["server"] == got["starter"]
        assert proc.stderr.count(
            f"the local model server (pid {got['pid']}) runs at niceness {got['starter']}"
        ) == 1, proc.stderr
    assert not list(home.glob("local-server*.json"))  # stopped, its record removed
