"""R replicas of the embedded local model, for trying a replica pool on one machine.

:func:`start` runs R llama-servers with the embedded model (the binary, model, chat
template and prompt-cache options of :mod:`chainrun.runtime.local_model`), each on its
own loopback port, and records them in ``home()/replicas.json``; :func:`stop` stops the
recorded ones. They are not the install's local model server: they carry
:data:`REPLICA_ENV` instead of ``CHAINRUN_CHECKOUT``, so :func:`local_model.status`,
``chainrun local up`` and ``chainrun local down`` neither use nor stop them, and
stopping them leaves the install's server (which other users may share) alone.

A chainrun.toml then names them as one provider's replicas::

    [providers.local]
    replicas = ["http://127.0.0.1:PORT1/v1", "http://127.0.0.1:PORT2/v1"]
    prompt_cache = "slot"
    sampling_fields = true

On a machine of few cores the replicas share them: R replicas of a CPU model give R
prompt caches, not R times the tokens a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from chainrun.errors import ProviderUnavailable
from chainrun.runtime import local_model
from chainrun.runtime.processes import pid_exists

__all__ = ["REPLICA_ENV", "Replica", "running", "start", "stop"]

#: the environment variable naming, in a replica's process, the checkout that started it
REPLICA_ENV = "CHAINRUN_REPLICA_OF"


@dataclass(frozen=True)
class Replica:
    """One started replica: its process, port and log file."""

    pid: int
    port: int
    log_path: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _state() -> Path:
    return local_model.home() / "replicas.json"


def running() -> list[Replica]:
    """The recorded replicas whose process still runs."""
    try:
        doc = json.loads(_state().read_text())
    except (OSError, ValueError):
        return []
    out = []
    for d in doc if isinstance(doc, list) else []:
        try:
            r = Replica(int(d["pid"]), int(d["port"]), str(d["log_path"]))
        except (KeyError, TypeError, ValueError):
            continue
        if pid_exists(r.pid) and _is_replica(r.pid):
            out.append(r)
    return out


def _is_replica(pid: int) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(e.startswith(REPLICA_ENV.encode() + b"=") for e in env)


def start(
    n: int,
    *,
    slots: int = local_model.DEFAULT_SLOTS,
    context: int = local_model.DEFAULT_CONTEXT,
    threads: int | None = None,
    extra_args: list[str] | None = None,
    timeout_s: float = local_model.STARTUP_TIMEOUT_S,
) -> list[Replica]:
    """Start ``n`` replicas (each ``-np slots``, ``-c context``; ``threads``: ``-t``, None:
    llama-server's default) on free loopback ports, and wait until each answers
    ``/health``; recorded with those already running.

    Raises:
        ValueError: ``n`` < 1.
        ProviderUnavailable: the model is not installed, or a replica exited or was not
            healthy within ``timeout_s`` (s); the replicas started here are stopped.
    """
    if n < 1:
        raise ValueError(f"replicas: n must be >= 1, got {n}")
    binary = local_model.server_binary()
    model = local_model.model_path()
    home = local_model.home()
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != local_model.CHECKOUT_ENV}
    env[REPLICA_ENV] = local_model.checkout()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(binary.parent), env.get("LD_LIBRARY_PATH", "")) if p
    )
    started: list[tuple[Replica, subprocess.Popen[bytes]]] = []
    try:
        for _ in range(n):
            port = local_model.free_port()
            log_path = home / f"replica-{port}.log"
            args = [
                str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
                "--jinja", "--chat-template-file", str(local_model.CHAT_TEMPLATE),
                "-np", str(slots), "-c", str(context), "--no-webui",
                *local_model.prompt_cache_args(binary),
                *(["-t", str(threads)] if threads else []),
                *(extra_args or []),
            ]  # fmt: skip
            with open(log_path, "ab") as out:
                proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True)  # fmt: skip
            started.append((Replica(proc.pid, port, str(log_path)), proc))
        deadline = time.monotonic() + timeout_s
        for replica, proc in started:
            while not local_model.healthy(replica.port):
                if proc.poll() is not None:
                    raise ProviderUnavailable(
                        f"replica on port {replica.port} exited with code {proc.returncode} "
                        f"during start; see {replica.log_path}"
                    )
                if time.monotonic() > deadline:
                    raise ProviderUnavailable(
                        f"replica on port {replica.port} not healthy after {timeout_s:.0f} s; "
                        f"see {replica.log_path}"
                    )
                time.sleep(0.2)
    except BaseException:
        for replica, proc in started:
            _kill(replica.pid)
            proc.wait(timeout=10)
        raise
    mine = [r for r, _ in started]
    _write_state(running() + mine)
    for _, proc in started:
        _reaped[proc.pid] = proc
    return mine


#: the replicas this process started, reaped when stopped (no zombie)
_reaped: dict[int, subprocess.Popen[bytes]] = {}


def _write_state(replicas: list[Replica]) -> None:
    _state().write_text(json.dumps([asdict(r) for r in replicas]))


def _kill(pid: int) -> None:
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        until = time.monotonic() + wait_s
        while time.monotonic() < until:
            child = _reaped.get(pid)
            if child is not None and child.poll() is not None:
                return
            if not pid_exists(pid):
                return
            time.sleep(0.1)


def stop(replicas: list[Replica] | None = None) -> list[Replica]:
    """Stop ``replicas`` (None: every recorded one that runs), by their process ids only;
    returns those stopped. The install's local model server is not touched."""
    targets = running() if replicas is None else [r for r in replicas if _is_replica(r.pid)]
    for r in targets:
        _kill(r.pid)
        child = _reaped.pop(r.pid, None)
        if child is not None:
            child.wait(timeout=10)
    gone = {r.pid for r in targets}
    _write_state([r for r in running() if r.pid not in gone])
    return targets
