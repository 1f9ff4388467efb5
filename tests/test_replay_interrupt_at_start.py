"""Ctrl-C while a replay's chain is still starting (its provider's startup check not
answered yet) says what happened: no run was made and nothing was logged.

Before: a bare ``chainrun: interrupted`` (exit 130), which named neither the run (there
was none) nor whether anything was kept. The provider here is a real socket that accepts
connections and never answers, so the startup check is what the replay waits on.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"


@pytest.fixture
def silent_server() -> Iterator[tuple[str, threading.Event]]:
    """A loopback server that accepts and never answers; the event is set at its first
    connection (the replay's startup check is under way)."""
    sock = socket.create_server(("127.0.0.1", 0))
    connected = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed at the end of the test
            held.append(conn)
            connected.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", connected
    finally:
        sock.close()
        for conn in held:
            conn.close()
        thread.join(timeout=5)


def test_ctrl_c_before_the_first_turn_says_nothing_was_logged(
    tmp_path: Path, silent_server: tuple[str, threading.Event]
) -> None:
    base_url, connected = silent_server
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{base_url}"\n')
    db = tmp_path / "log.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "replay", str(REPLAY), "--config", str(cfg),
         "--db", str(db)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert connected.wait(60), "the replay never sent its startup check"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err == (
        "chainrun: replay interrupted before its first turn (while the chain was starting: "
        "its providers' startup checks, the models it loads): no run was made and nothing "
        "was logged\n"
    )
    assert out == "" and not db.exists()  # the log this command would have made: not left
