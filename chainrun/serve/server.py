"""Run the serve app under uvicorn: loopback by default, a bearer token for anything else."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

import uvicorn

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.desk.background import BackgroundRequests
from chainrun.errors import ChainrunError, UserInputError
from chainrun.log.backend import shown_url
from chainrun.log.lifecycle import lost_turns_of_process
from chainrun.log.migrations import utc_now
from chainrun.log.reads import SeedWindows
from chainrun.log.store import Store
from chainrun.runtime.event_loop import uvicorn_loop
from chainrun.runtime.listen_socket import listening_socket
from chainrun.serve.app import ServeState, create_app
from chainrun.serve.browsers import allowed_hosts, cors, is_loopback
from chainrun.serve.head_limit import HeadLimitedProtocol
from chainrun.serve.identity import IdentitySource
from chainrun.serve.settings import (
    CHAT_KEEPALIVE_S,
    CONVERSATION_HEADER,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MODEL_ID,
    SHUTDOWN_GRACE_S,
    TOKEN_ENV,
)
from chainrun.serve.turns import TurnObserver
from chainrun.serve.workers import Supervisor, WorkerSlot


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
    workers: int = 1,
    observer_factory: Callable[[], list[TurnObserver]] | None = None,
    seed_windows: SeedWindows | None = None,
    chat_keepalive_s: float | None = CHAT_KEEPALIVE_S,
    v1_keepalive_s: float | None = None,
    identity: IdentitySource | None = None,
    background: BackgroundRequests | None = None,
    conversation_header: str = CONVERSATION_HEADER,
    allowed_host: Sequence[str] = (),
    cors_origins: Sequence[str] = (),
    step_events: bool = False,
) -> None:
    """Serve the chat backend until interrupted (blocking; SIGINT/SIGTERM stop it, in-flight
    turns are cancelled and logged, the run is closed).

    With ``workers`` above 1 the listening socket is bound once and shared by that many
    worker processes (forked; the kernel spreads connections over them), each with its
    own chain, hedge windows and live run in the one log ``db`` (a run per process: see
    ``chainrun runs``). The parent watches them (:mod:`chainrun.serve.workers`): a worker
    that dies is said in one line at once, the turns it had in flight are logged
    ``lost``, and a new one takes its place (after a back-off when it keeps dying);
    ``/readyz`` says how many serve. SIGINT/SIGTERM to the parent stop every worker
    gracefully (each gets one SIGTERM).

    Args:
        config: the chain's configuration.
        db: the run log every turn is written to (a run of kind ``live``): a SQLite file
            or a ``postgresql://`` URL.
        host: the address to listen on; anything but loopback needs ``token``.
        port: TCP port (0: any free one; the bound address is printed on stderr).
        token: require ``Authorization: Bearer TOKEN`` (see :data:`TOKEN_ENV`).
        model_id: the chain's model id on the OpenAI-compatible face.
        observers: told about every logged turn (e.g. the OpenTelemetry exporter).
        max_body_bytes: the largest request body, in bytes (default 1 MiB); a larger one
            is answered 413 without being read whole.
        workers: worker processes sharing the socket (1: this process serves).
        seed_windows: seed each hedged step's latency window from the log's recent calls
            before the first turn (None: each process learns its own from zero).
        observer_factory: builds each worker's observers after the fork (an exporter's
            threads do not survive a fork; one with a ``shutdown()`` is shut down as its
            worker stops); with one worker, ``observers`` is used.
        chat_keepalive_s: s between keep-alive comment lines on ``/chat`` (None or 0: none).
        v1_keepalive_s: the same on the OpenAI face's streams (default none, as OpenAI's).
        identity: where the caller's identity is read (:mod:`chainrun.serve.identity`);
            None: none is taken and conversations are not bound.
        background: the chat UIs' background requests the OpenAI face recognises
            (:mod:`chainrun.desk.background`; None: the defaults).
        conversation_header: the header the OpenAI face reads a conversation id from.
        allowed_host: more ``Host`` names the server answers to besides ``host``'s own
            (:func:`chainrun.serve.browsers.allowed_hosts`: a wildcard ``host`` with none
            answers to any).
        cors_origins: the origins whose pages may call the server
            (:func:`chainrun.serve.browsers.cors`; none: no page but its own).
        step_events: every ``/chat`` stream carries the operator's events (each step's
            output, the checks' reasons: :func:`chainrun.serve.chat.step_events_wanted`).

    Raises:
        ConfigError: a chain that cannot be built from ``config``, or that its
            :meth:`~chainrun.chain.Chain.check` refuses (before anything is bound).
        UserInputError: a non-loopback host without a token; an origin that is none;
            ``max_body_bytes`` below 1; ``workers`` below 1; an address that cannot be
            bound; an unusable log.
        LogFileGone: (one worker) the log's SQLite file was deleted or replaced while
            serving: raised at the stop, naming the run's turns that went with it.
        WorkersFailed: (``workers`` above 1) once every worker has ended, when any of
            them exited with an error (each said its own on stderr as it ended).
    """
    if max_body_bytes < 1:
        raise UserInputError(f"--max-body-bytes: expected at least 1, got {max_body_bytes}")
    if workers < 1:
        raise UserInputError(f"--workers: expected at least 1, got {workers}")
    if not is_loopback(host) and not token:
        raise UserInputError(
            f"--host {host}: serving beyond loopback needs a bearer token; "
            f"set {TOKEN_ENV} in the environment"
        )
    try:
        cors(cors_origins)
    except ValueError as e:
        raise UserInputError(f"--cors-origin: {e}") from None
    web = (allowed_hosts(host, allowed_host), tuple(cors_origins), step_events)
    # a config that cannot start (a step's file unreadable, a tool that does not import,
    # an API key variable unset) is one error now, before the socket is bound, not a
    # server answering 503 "starting" for ever (or, with workers, each worker's)
    Chain(config, quiet=True).check()
    sock = bind(host, port)
    if workers > 1:
        try:
            Store.open(db).close()  # a bad log is one error here, not one per worker
        except BaseException:
            sock.close()
            raise

        def one(slot: WorkerSlot) -> None:
            made = observer_factory() if observer_factory is not None else []
            try:
                _serve_one(config, db, sock, token=token, model_id=model_id, observers=made,
                           max_body_bytes=max_body_bytes, seed_windows=seed_windows,
                           keepalive=(chat_keepalive_s, v1_keepalive_s),
                           announce=False, fleet=slot, identity=identity,
                           faces=(background, conversation_header), web=web)  # fmt: skip
            finally:
                for obs in made:  # flush an exporter before the worker exits
                    stop = getattr(obs, "shutdown", None)
                    if callable(stop):
                        stop()

        shown = shown_url(db) if isinstance(db, str) else str(db)
        print(f"chainrun serve: {_address(sock)} with {workers} worker processes (parent "
              f"pid {os.getpid()}, log {shown})", file=sys.stderr, flush=True)  # fmt: skip
        _say_identity(identity)
        try:
            supervisor = Supervisor(sock, workers, one, recover=_lost_turns_said(db))
            failed = supervisor.run_until_stopped()
        finally:
            sock.close()
        if failed:
            raise WorkersFailed(failed, workers)
        return
    _serve_one(config, db, sock, token=token, model_id=model_id, observers=observers,
               max_body_bytes=max_body_bytes, seed_windows=seed_windows,
               keepalive=(chat_keepalive_s, v1_keepalive_s), identity=identity,
               faces=(background, conversation_header), web=web)  # fmt: skip


def _serve_one(
    config: ChainConfig,
    db: str | Path,
    sock: socket.socket,
    *,
    token: str | None,
    model_id: str,
    observers: list[TurnObserver] | None,
    max_body_bytes: int,
    seed_windows: SeedWindows | None = None,
    announce: bool = True,
    keepalive: tuple[float | None, float | None] = (CHAT_KEEPALIVE_S, None),
    fleet: WorkerSlot | None = None,
    identity: IdentitySource | None = None,
    faces: tuple[BackgroundRequests | None, str] = (None, CONVERSATION_HEADER),
    web: tuple[tuple[str, ...] | None, tuple[str, ...], bool] = (None, (), False),
) -> None:
    """One serving process on the bound ``sock`` until SIGINT/SIGTERM (see :class:`_Server`;
    ``announce``: say on stderr what a stop signal does; a worker leaves that to its
    parent; ``keepalive``: the keep-alive intervals of ``/chat`` and ``/v1`` in s;
    ``fleet``: a worker's slot on its parent's board, for ``/readyz``; ``faces``: the
    OpenAI face's background requests and conversation header; ``web``: the ``Host``
    names answered (None: any) and the CORS origins, :mod:`chainrun.serve.browsers`, and
    whether every ``/chat`` stream carries the operator's events).

    Raises:
        ConfigError: opening the chain met a config that cannot start (the server
            stopped on it).
        LogFileGone: at the stop, when the log's SQLite file had been deleted or replaced
            while serving (said in a warning line when found): the run's turns went with it.
    """
    try:
        store = Store.open(db)
    except BaseException:
        sock.close()
        raise
    state = ServeState(
        lambda: Chain(config, store=store, kind="live", quiet=True, seed_windows=seed_windows),
        observers=observers or [],
        model_id=model_id,
        freeze_gc=True,  # a long-running process: start-up objects out of every GC pass
        shutdown_grace_s=SHUTDOWN_GRACE_S,
        chat_keepalive_s=keepalive[0],
        v1_keepalive_s=keepalive[1],
        fleet=fleet,
        background=faces[0],
        conversation_header=faces[1],
        step_events=web[2],
    )
    app = create_app(state, token=token, max_body_bytes=max_body_bytes, identity=identity,
                     allowed_hosts=web[0], cors_origins=web[1])
    server = _Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            loop=uvicorn_loop(),  # uvloop when installed (chainrun.runtime.event_loop)
            timeout_keep_alive=30,
            # the last resort: ServeState cancels the turns at SHUTDOWN_GRACE_S, which
            # ends their streams; then whatever still runs is cancelled
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S + 2,
            backlog=2048,
            http=HeadLimitedProtocol,  # a head over MAX_HEAD_BYTES: 431 as it arrives
        ),
        state,
        announce=announce,
    )
    state.on_fatal = lambda: setattr(server, "should_exit", True)  # said below, once stopped
    print(f"chainrun serve: {_address(sock)} (pid {os.getpid()}, log {store.name})",
          file=sys.stderr, flush=True)  # fmt: skip
    if announce:  # a worker leaves it to its parent
        _say_identity(identity)
    try:
        with _stop_signals_return():
            server.run(sockets=[sock])
    finally:
        store.close()
    if state.fatal is not None:  # the chain could not start (checks at open past check())
        raise state.fatal
    if state.log_gone is not None:  # served on, but every turn of the run went with the file
        raise state.log_gone


def _say_identity(identity: IdentitySource | None) -> None:
    """The identity mode serve runs in, in one line on stderr (after the address line)."""
    if identity is not None:
        print(f"chainrun serve: {identity.describe()}", file=sys.stderr, flush=True)


class _Server(uvicorn.Server):
    """uvicorn's server with the stop signals of ``chainrun serve``, each said in one line:

    1. the first SIGINT/SIGTERM stops accepting connections; the connections and turns
       in flight get :data:`SHUTDOWN_GRACE_S` to finish, then are cancelled (each turn
       logged ``cancelled``), the chain is closed and its run ended;
    2. a second one cancels the turns in flight at once, and the run still ends cleanly;
    3. a third is uvicorn's own forced exit (the run is left for the next open to mark
       ``interrupted``).

    uvicorn alone says nothing at ``log_level = "warning"`` and makes the second signal
    a forced exit that skips the app's shutdown; and a turn whose answer was sent but
    whose checks still ran was waited for however long they took, so the first Ctrl-C
    looked ignored.
    """

    def __init__(self, config: uvicorn.Config, state: ServeState, *, announce: bool) -> None:
        super().__init__(config)
        self.state = state
        self.announce = announce
        self.stop_signals = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stop_signals += 1
        if self.stop_signals == 1:
            super().handle_exit(sig, frame)
            n = self.state.turns_in_flight()
            self._say(f"stopping: {_turns(n)} in flight, up to {SHUTDOWN_GRACE_S} s to "
                      "finish, then cancelled; Ctrl-C again to cancel now" if n else
                      "stopping (no turn in flight)")  # fmt: skip
            self.state.request_stop()
        elif self.stop_signals == 2:
            self._say(f"cancelling {_turns(self.state.turns_in_flight())} in flight now "
                      "(logged cancelled; one already answered stays ok)")  # fmt: skip
            self.state.request_stop(now=True)
        else:
            super().handle_exit(sig, frame)

    def _say(self, line: str) -> None:
        if self.announce:
            print(f"chainrun serve: {line}", file=sys.stderr, flush=True)


def _turns(n: int) -> str:
    return "1 turn" if n == 1 else f"{n} turns"


def _address(sock: socket.socket) -> str:
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if sock.family == socket.AF_INET6 else bound[0]
    return f"http://{shown}:{bound[1]}/"


class WorkersFailed(ChainrunError):
    """Worker processes of ``chainrun serve --workers N`` exited with an error (each said
    its own on stderr as it ended: a chainrun error in one line, anything else with its
    traceback).

    Args:
        codes: the failed workers' exit codes by pid (as
            :func:`os.waitstatus_to_exitcode` gives them: negative for a signal).
        workers: how many workers there were.

    Attributes:
        exit_code: what the parent exits with: 2 when any worker said a chainrun error
            (it exited 2, as the CLI does), else the worst of them (a worker killed by
            signal N counts as 128 + N, as a shell reports it).
    """

    def __init__(self, codes: dict[int, int], workers: int) -> None:
        self.codes = dict(codes)
        shell = [128 - c if c < 0 else c for c in self.codes.values()]
        self.exit_code = 2 if 2 in shell else max(shell)
        each = ", ".join(
            f"worker {pid} {f'killed by signal {-c}' if c < 0 else f'exited {c}'}"
            for pid, c in self.codes.items()
        )
        n = len(self.codes)
        super().__init__(f"{n} of {workers} worker processes ended with an error ({each}); "
                         "see each one's line above")  # fmt: skip


def _lost_turns_said(db: str | Path) -> Callable[[int], str]:
    """What the parent does for a worker that died: open the log (which marks the
    worker's run ``interrupted`` and logs the turns it had in flight ``lost``:
    :func:`chainrun.log.lifecycle.mark_interrupted_runs`), and name those turns."""
    since = utc_now()

    def recover(pid: int) -> str:
        with Store.open(db, create=False) as store:
            lost = lost_turns_of_process(store.log, pid, since)
        if not lost:
            return "no turn of it was in flight"
        each = ", ".join(f"{cid} turn {index}" for cid, index in lost)
        n = len(lost)
        return f"{_turns(n)} it had in flight logged lost ({each})"

    return recover


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
