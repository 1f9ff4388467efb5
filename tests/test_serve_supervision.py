"""``chainrun serve --workers N`` watches its workers: one that dies is said at once in
one line, reaped, its turn in flight logged ``lost`` from the log's own record, and a
new worker takes its place; ``/readyz`` says how many serve.

The PostgreSQL test runs the real ``chainrun serve --workers 2`` against the lab (made
slow while the turn to be cut is in flight) on the server ``.ci/run`` starts; the
supervisor's restart and back-off are also tested on their own, with workers that are
plain forked functions.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from log_backends import need_pg, pg_schema
from serve_helpers import children, kill_with_workers, workers_ready

from chainrun.lab import LabServer
from chainrun.lab.scenarios import load_scenario
from chainrun.log.store import Store
from chainrun.serve.workers import Supervisor, WorkerBoard, WorkerSlot

ROOT = Path(__file__).resolve().parents[1]


class Lines:
    """A process's stderr lines, read as they come by a thread."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout_s: float = 30.0) -> list[str]:
        """The lines holding ``needle`` once there is one (an AssertionError after
        ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                found = [ln for ln in self.lines if needle in ln]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no line with {needle!r} in {timeout_s} s: {self.lines}")

    def join(self) -> None:
        self._thread.join(timeout=30)


def _readyz(base: str) -> dict[str, Any]:
    """``/readyz`` of whichever worker takes the connection (200 or a starting 503)."""
    r = httpx.get(f"{base}/readyz", timeout=5)
    assert r.status_code in (200, 503), r.text
    body: dict[str, Any] = r.json()
    return body


def _chat(base: str, message: str, conversation: str, key: str | None = None) -> dict[str, Any]:
    """One ``/chat`` turn on a new connection (``key``: its Idempotency-Key); its closing
    ``turn`` event."""
    headers = {"Idempotency-Key": key} if key else {}
    with httpx.Client(base_url=base, timeout=60) as client, client.stream(
        "POST", "/chat", json={"message": message, "conversation_id": conversation},
        headers=headers,
    ) as r:
        assert r.status_code == 200
        body = r.read().decode()
    last = [line for line in body.splitlines() if line.startswith("data: ")][-1]
    payload: dict[str, Any] = json.loads(last[len("data: "):])
    return payload


def _claimer_pid(url: str, conversation: str, index: int, timeout_s: float = 30.0) -> int:
    """The pid of the process whose run claimed turn ``index`` of the conversation, once
    it has (the log's own record of who is answering it)."""
    deadline = time.monotonic() + timeout_s
    with Store.open(url, create=False) as store:
        while True:
            row = store.log.query(
                "select last_index, claimed_run_id from conversation_index where "
                "conversation_id = ?", [conversation])  # fmt: skip
            if row and row[0]["last_index"] == index:
                break
            assert time.monotonic() < deadline, f"turn {index} never started: {row}"
            time.sleep(0.02)
        meta = store.log.scalar("select meta from runs where id = ?", [row[0]["claimed_run_id"]])
    return int(json.loads(meta)["writer"]["pid"])


def test_a_worker_killed_mid_turn_is_replaced_and_its_turn_logged_lost(
    tmp_path: Path,
) -> None:
    from benchmarks._pg import free_port

    fast = load_scenario("fast", n_tokens=4, record_bodies=True)
    # the turn to be cut: its answer's first token, then a pause; the kill comes once the
    # turn has claimed its index (it has started: the lab holds its answer meanwhile)
    slow = load_scenario("fast", n_tokens=4, record_bodies=True,
                         pause={"after_tokens": 1, "ms": 60_000, "p": 1.0})  # fmt: skip
    messages = [f"turn {k}: a rain jacket in size {k} please" for k in range(1, 5)]
    conv = "sup-conv"
    with pg_schema(need_pg()) as url, LabServer(fast) as lab:
        config = tmp_path / "chainrun.toml"
        config.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "serve", "--workers", "2", "--port", str(port),
             "--config", str(config)],
            env={**os.environ, "CHAINRUN_DB": url,
                 "CHAINRUN_CATALOG_DB": str(tmp_path / "catalog.db")},
            cwd=ROOT, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        err = Lines(proc.stderr)
        base = f"http://127.0.0.1:{port}"
        try:
            assert workers_ready(base, 2), err.lines
            assert _readyz(base)["workers"] == {"serving": 2, "workers": 2}
            first = [_chat(base, m, conv) for m in messages[:2]]
            assert [t["turn_index"] for t in first] == [1, 2]

            lab.set_scenario(slow)
            with httpx.Client(base_url=base, timeout=60) as client, client.stream(
                "POST", "/chat", json={"message": messages[2], "conversation_id": conv},
                headers={"Idempotency-Key": "cut-1"},
            ) as r:
                assert r.status_code == 200
                victim = _claimer_pid(url, conv, index=3)  # the turn started: mid-turn
                assert victim in children(proc.pid)
                os.kill(victim, signal.SIGKILL)
                with pytest.raises(httpx.HTTPError):
                    for _ in r.iter_lines():  # the worker's end cuts the stream
                        pass
            (said,) = err.wait_for(f"worker {victim} killed by signal 9")
            assert f"1 turn it had in flight logged lost ({conv} turn 3)" in said, said
            replacement = int(said.split("worker ")[-1].split()[0])
            assert "started in its place" in said
            # reaped at once: no zombie, and the new worker is the parent's child
            assert not Path(f"/proc/{victim}").exists()
            assert replacement in children(proc.pid) and victim not in children(proc.pid)
            deadline = time.monotonic() + 60
            while _readyz(base)["workers"]["serving"] < 2:
                assert time.monotonic() < deadline, "the new worker never served"
                time.sleep(0.1)
            assert workers_ready(base, 2)

            # the client sends the cut request again, the same key: it gets the lost turn
            # (its request id kept from the claim), not a wait until the key's bound
            again = _chat(base, messages[2], conv, key="cut-1")
            lab.set_scenario(fast)  # (records forgotten: the next turn's request alone)
            nxt = _chat(base, messages[3], conv)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_with_workers(proc.pid)
                proc.wait()
            err.join()
            assert proc.stderr is not None
            proc.stderr.close()
        assert proc.returncode == 0, err.lines
        assert len([ln for ln in err.lines if "killed by signal" in ln]) == 1, err.lines
        assert again["status"] == "lost" and again["turn_index"] == 3, again
        assert nxt["turn_index"] == 4 and nxt["status"] == "ok", nxt
        asked = [json.dumps(r.get("messages")) for r in lab.requests()]
        answer_requests = [s for s in asked if messages[3] in s]
        assert answer_requests, asked
        assert any(messages[0] in s and messages[1] in s for s in answer_requests)
        with Store.open(url, create=False) as store:
            rows, _ = store.conversation(conv, last=10)
            runs = {r.id: r for r in store.list_runs()}
        assert [(t.turn_index, t.status) for t in rows] == [
            (1, "ok"), (2, "ok"), (3, "lost"), (4, "ok")]  # fmt: skip
        lost = rows[2]
        assert lost.input == messages[2] and lost.output is None
        assert lost.error_type == "process_ended"
        assert runs[lost.run_id].status == "interrupted"


# -- the supervisor on its own -------------------------------------------------------------
def _sleep_forever(slot: WorkerSlot) -> None:
    slot.mark(True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        time.sleep(1)


def test_the_supervisor_replaces_a_dead_worker_and_backs_off_one_that_keeps_dying(
    tmp_path: Path,
) -> None:
    """Workers that are forked functions: one killed is replaced at once and said in one
    line; a slot whose workers die at their start waits longer each time; a stop signal
    ends every worker, with no back-off left waiting."""
    marker = tmp_path / "die"
    marker.write_text("")

    def worker(slot: WorkerSlot) -> None:
        if slot.index == 1 and marker.exists():
            os._exit(3)  # dies at its start while the marker is there
        _sleep_forever(slot)

    said: list[str] = []
    sock = socket.socket()
    sup = Supervisor(sock, 2, worker, say=said.append, backoff_first_s=0.2)

    def wait_until(ok: Callable[[], bool], deadline: float) -> None:
        while time.monotonic() < deadline and not ok():
            time.sleep(0.02)

    def stop_later() -> None:
        deadline = time.monotonic() + 30
        try:
            wait_until(lambda: any("a new worker in 0.4 s" in s for s in said), deadline)
            marker.unlink()
            wait_until(lambda: any("after its back-off" in s for s in said), deadline)
            healthy = [p for p, w in sup.workers().items() if w == 0]
            os.kill(healthy[0], signal.SIGKILL)
            wait_until(lambda: any("killed by signal 9" in s for s in said), deadline)
            wait_until(lambda: sup.board.serving() == 2, deadline)
        finally:  # whatever happened, the supervisor is stopped
            os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_later)
    stopper.start()
    try:
        failed = sup.run_until_stopped()
    finally:
        stopper.join()
        sock.close()
    assert failed == {}
    deaths = [s for s in said if "exited with 3" in s]
    # the first death starts a new worker at once; then 0.2 s, 0.4 s
    assert "started in its place" in deaths[0]
    assert "a new worker in 0.2 s" in deaths[1] and "a new worker in 0.4 s" in deaths[2]
    (killed,) = [s for s in said if "killed by signal 9" in s]
    assert "started in its place" in killed
    assert sup.workers() == {}  # every one reaped
    assert any(s.startswith("chainrun serve: stopping 2 workers") for s in said)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no reaper has collected yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_the_workers_end_when_their_parent_is_killed() -> None:
    """kill -9 of serve's parent (the supervisor) ends its workers too: none serves on
    unsupervised (each asked the kernel for SIGTERM at its parent's death)."""
    parent = os.fork()
    if parent == 0:  # the supervisor's process
        try:
            Supervisor(socket.socket(), 2, _sleep_forever, say=lambda _: None).run_until_stopped()
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while len(children(parent)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = children(parent)
    assert len(workers) == 2
    os.kill(parent, signal.SIGKILL)
    os.waitpid(parent, 0)
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [w for w in workers if _alive(w)]
    for w in left:  # never leave one behind, whatever the assertion says
        os.kill(w, signal.SIGKILL)
    assert left == []


def test_the_board_counts_the_slots_marked_serving_across_a_fork() -> None:
    board = WorkerBoard(3)
    pid = os.fork()
    if pid == 0:
        board.slot(2).mark(True)
        os._exit(0)
    os.waitpid(pid, 0)
    board.slot(0).mark(True)
    assert board.slot(1).counts() == {"serving": 2, "workers": 3}
    board.set(2, False)
    assert board.serving() == 1
