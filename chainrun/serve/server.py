"""Run the serve app under uvicorn: loopback by default, a bearer token for anything else."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.errors import UserInputError
from chainrun.log.store import Store
from chainrun.runtime.event_loop import uvicorn_loop
from chainrun.runtime.listen_socket import listening_socket
from chainrun.serve.app import ServeState, create_app
from chainrun.serve.settings import DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL_ID, TOKEN_ENV
from chainrun.serve.turns import TurnObserver


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``
    (see :func:`chainrun.runtime.listen_socket.listening_socket`).

    Raises:
        UserInputError: the address cannot be bound (in use, not local, bad name).
    """
    return listening_socket(host, port)


def serve(
    config: ChainConfig,
    db: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    model_id: str = DEFAULT_MODEL_ID,
    observers: list[TurnObserver] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Serve the chat backend until interrupted (blocking; SIGINT/SIGTERM stop it, in-flight
    turns are cancelled and logged, the run is closed).

    Args:
        config: the chain's configuration.
        db: the SQLite run log every turn is written to (a run of kind ``live``).
        host: the address to listen on; anything but loopback needs ``token``.
        port: TCP port (0: any free one; the bound address is printed on stderr).
        token: require ``Authorization: Bearer TOKEN`` (see :data:`TOKEN_ENV`).
        model_id: the chain's model id on the OpenAI-compatible face.
        observers: told about every logged turn (e.g. the OpenTelemetry exporter).
        max_body_bytes: the largest request body, in bytes (default 1 MiB); a larger one
            is answered 413 without being read whole.

    Raises:
        UserInputError: a non-loopback host without a token; ``max_body_bytes`` below 1;
            an address that cannot be bound; an unusable log file.
    """
    if max_body_bytes < 1:
        raise UserInputError(f"--max-body-bytes: expected at least 1, got {max_body_bytes}")
    if not is_loopback(host) and not token:
        raise UserInputError(
            f"--host {host}: serving beyond loopback needs a bearer token; "
            f"set {TOKEN_ENV} in the environment"
        )
    sock = bind(host, port)
    try:
        store = Store.open(db)
    except BaseException:
        sock.close()
        raise
    state = ServeState(
        lambda: Chain(config, store=store, kind="live", quiet=True),
        observers=observers or [],
        model_id=model_id,
        freeze_gc=True,  # a long-running process: start-up objects out of every GC pass
    )
    app = create_app(state, token=token, max_body_bytes=max_body_bytes)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            loop=uvicorn_loop(),  # uvloop when installed (chainrun.runtime.event_loop)
            timeout_keep_alive=30,
            timeout_graceful_shutdown=5,  # then open streams are cancelled (turns logged)
            backlog=2048,
        )
    )
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if sock.family == socket.AF_INET6 else bound[0]
    print(f"chainrun serve: http://{shown}:{bound[1]}/ (pid {os.getpid()}, log {db})",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        with _stop_signals_return():
            server.run(sockets=[sock])
    finally:
        store.close()


class _Stopped(Exception):
    pass


@contextlib.contextmanager
def _stop_signals_return() -> Iterator[None]:
    """Make SIGINT/SIGTERM a normal return once uvicorn has shut down gracefully.

    uvicorn re-raises a caught stop signal after its shutdown, under the handler that was
    there before it started; with the default SIGTERM handler that kills the process
    before the caller's clean-up (flushing telemetry) can run.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise _Stopped()

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except _Stopped:
        pass
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
