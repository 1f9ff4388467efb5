"""The worker processes of ``chainrun serve --workers N``: forked onto one listening
socket, watched by the parent, replaced when one dies.

The parent forks ``N`` workers and then only watches them: each worker's pidfd
(``pidfd_open(2)``) wakes it the moment that worker ends, so a worker killed with
SIGKILL is noticed at once, not at shutdown. The parent reaps it (no zombie), says so in
one line, logs the turns it had in flight as ``lost`` (the log's own record: the turn
indexes its run had claimed and never logged, see
:func:`chainrun.log.lifecycle.mark_interrupted_runs`) and forks a new worker in its
slot. A worker that keeps dying soon after its start is started again after a back-off
that doubles each time (:data:`BACKOFF_FIRST_S` up to :data:`BACKOFF_MAX_S`; a worker
that served :data:`STEADY_S` resets it).

How many workers serve is in a :class:`WorkerBoard`: one byte per worker slot in an
anonymous shared memory map made before the first fork, so the parent and every
worker read the same bytes. A worker sets its byte once its chain is open and clears
it when it starts stopping; the parent clears the byte of a worker that died. Any
worker's ``/readyz`` then says ``"workers": {"serving": k, "workers": N}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from chainrun.errors import ChainrunError
from chainrun.serve.settings import SHUTDOWN_GRACE_S

__all__ = [
    "BACKOFF_FIRST_S",
    "BACKOFF_MAX_S",
    "STEADY_S",
    "Supervisor",
    "WorkerBoard",
    "WorkerSlot",
]

#: s before a worker that died soon after its start is started again (then doubled)
BACKOFF_FIRST_S = 1.0
#: s of back-off at most
BACKOFF_MAX_S = 30.0
#: s a worker must have lived for its death to start no back-off (and to reset it)
STEADY_S = 10.0


class WorkerBoard:
    """Which worker slots are serving: ``n`` bytes in an anonymous ``MAP_SHARED``
    memory map (``mmap.mmap(-1, n)``), shared by every process forked after it is made.
    A byte is written whole, so a reader never sees half a write.

    Args:
        n: worker slots (at least 1).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._map = mmap.mmap(-1, n)

    def set(self, slot: int, serving: bool) -> None:
        """Mark worker slot ``slot`` (0-based) serving or not."""
        self._map[slot] = 1 if serving else 0

    def serving(self) -> int:
        """How many slots are marked serving now."""
        return sum(self._map[:self.n])

    def slot(self, slot: int) -> WorkerSlot:
        """The handle a worker in ``slot`` marks itself with."""
        return WorkerSlot(self, slot)


@dataclass(frozen=True)
class WorkerSlot:
    """One worker's place on its :class:`WorkerBoard` (what ``ServeState`` is given)."""

    board: WorkerBoard
    index: int

    def mark(self, serving: bool) -> None:
        """This worker is serving (its chain is open) or is not (stopping)."""
        self.board.set(self.index, serving)

    def counts(self) -> dict[str, int]:
        """``{"serving": k, "workers": n}`` for ``/readyz``."""
        return {"serving": self.board.serving(), "workers": self.board.n}


#: prctl(2)'s option that asks the kernel for a signal when the parent dies
PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> None:
    """Ask the kernel to send this process SIGTERM when its parent dies (Linux's
    ``prctl(PR_SET_PDEATHSIG)``, prctl(2)): a worker whose supervisor was killed, even
    with ``kill -9``, stops as on ``serve``'s own SIGTERM instead of serving on
    unsupervised. A parent already gone before the call (the signal would never come)
    ends the worker at once.

    Raises:
        OSError: the kernel refused the request.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent:
        os._exit(0)


def describe_exit(code: int) -> str:
    """``killed by signal 9`` / ``exited with 2`` from :func:`os.waitstatus_to_exitcode`."""
    return f"killed by signal {-code}" if code < 0 else f"exited with {code}"


#: ``recover(pid) -> what to add to the death line`` (the lost turns logged for it)
Recover = Callable[[int], str]


@dataclass
class _Worker:
    slot: int
    pid: int
    pidfd: int
    started: float


@dataclass
class Supervisor:
    """Forks ``n`` workers that each ``run(slot)`` on the shared ``sock`` and keeps ``n``
    running until a stop signal (see the module text).

    Args:
        sock: the bound listening socket (kept open in the parent, for the workers it
            forks later).
        n: workers.
        run: a worker's body, given its :class:`WorkerSlot`; a chainrun error it raises
            is said in one line (exit 2), anything else with its traceback (exit 1).
        recover: called in the parent after a worker died unasked, with its pid: logs
            its turns in flight as lost, returns words for the death line (it must not
            leave threads running: the parent forks again).
        say: writes one line (default: stderr).
        backoff_first_s: s before a slot's worker is started again after its second
            death in a row within ``steady_s`` of its start (the first is replaced at
            once); doubled at each further one, up to ``backoff_max_s``.
        steady_s: s a worker must live for its death to count as no quick death.
    """

    sock: socket.socket
    n: int
    run: Callable[[WorkerSlot], None]
    recover: Recover | None = None
    say: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr,
                                                                  flush=True))  # fmt: skip
    backoff_first_s: float = BACKOFF_FIRST_S
    backoff_max_s: float = BACKOFF_MAX_S
    steady_s: float = STEADY_S
    board: WorkerBoard = field(init=False)
    _workers: dict[int, _Worker] = field(init=False, default_factory=dict)
    #: slot -> the monotonic time its next worker may start (a back-off)
    _waiting: dict[int, float] = field(init=False, default_factory=dict)
    #: slot -> its workers' deaths in a row soon after their start
    _quick_deaths: dict[int, int] = field(init=False, default_factory=dict)
    _stops: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.board = WorkerBoard(self.n)

    # -- the workers -----------------------------------------------------------------
    def _spawn(self, slot: int) -> _Worker:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                os.setpgid(0, 0)
                end_with_parent(parent)
                # not the parent's handlers (the worker's server sets its own)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                for other in self._workers.values():
                    os.close(other.pidfd)
                self.run(self.board.slot(slot))
            except ChainrunError as e:  # one line (its log file deleted under it, say)
                print(f"chainrun: error: worker {os.getpid()}: {e}", file=sys.stderr,
                      flush=True)  # fmt: skip
                code = 2
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        worker = _Worker(slot, pid, os.pidfd_open(pid), time.monotonic())
        self._workers[pid] = worker
        return worker

    def _reap(self, worker: _Worker) -> int:
        _, status = os.waitpid(worker.pid, 0)
        os.close(worker.pidfd)
        del self._workers[worker.pid]
        self.board.set(worker.slot, False)
        return os.waitstatus_to_exitcode(status)

    def _died(self, worker: _Worker, code: int) -> None:
        """A worker ended while no stop was asked: schedule its slot, log its lost turns,
        say one line."""
        lived = time.monotonic() - worker.started
        quick = self._quick_deaths.get(worker.slot, 0) + 1 if lived < self.steady_s else 0
        self._quick_deaths[worker.slot] = quick
        delay = (0.0 if quick <= 1 else
                 min(self.backoff_first_s * 2 ** (quick - 2), self.backoff_max_s))  # fmt: skip
        replaced = ""
        if delay == 0.0:
            replaced = f"worker {self._spawn(worker.slot).pid} started in its place"
        else:
            self._waiting[worker.slot] = time.monotonic() + delay
            replaced = (f"a new worker in {delay:g} s (its slot's workers ended {quick} "
                        f"times in a row within {self.steady_s:g} s of their start)")  # fmt: skip
        lost = ""
        if self.recover is not None:
            try:
                lost = self.recover(worker.pid)
            except Exception as e:  # the log away: its next open marks the run
                lost = (f"its turns in flight could not be logged lost ({type(e).__name__}: "
                        f"{str(e).strip().splitlines()[0] if str(e).strip() else e!r}); "
                        "the next open of the log does it")  # fmt: skip
        parts = [f"worker {worker.pid} {describe_exit(code)}", *([lost] if lost else []),
                 replaced]  # fmt: skip
        self.say("chainrun serve: " + "; ".join(parts))

    def workers(self) -> dict[int, int]:
        """The workers running now: their slot by pid (safe from another thread)."""
        return {pid: w.slot for pid, w in list(self._workers.items())}

    # -- the stop signals ------------------------------------------------------------
    def _stop(self, signum: int, frame: object) -> None:
        self._stops += 1
        if self._stops == 1:
            self.say(f"chainrun serve: stopping {len(self._workers)} workers: their turns in "
                     f"flight, up to {SHUTDOWN_GRACE_S} s to finish, then cancelled; Ctrl-C "
                     "again to cancel now")  # fmt: skip
        elif self._stops == 2:
            self.say("chainrun serve: cancelling the workers' turns in flight now (logged "
                     "cancelled; one already answered stays ok)")  # fmt: skip
        self._waiting.clear()  # no new worker once stopping
        for pid in list(self._workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def run_until_stopped(self) -> dict[int, int]:
        """Fork the workers, keep them running until SIGINT/SIGTERM, then wait for them
        all. Returns the exit codes of the workers that failed as they stopped, by pid
        (those that died before and were replaced were said at the time)."""
        failed: dict[int, int] = {}
        old = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for slot in range(self.n):
                self._spawn(slot)
            while self._workers or (self._waiting and not self._stops):
                timeout = None
                if self._waiting:
                    timeout = max(0.0, min(self._waiting.values()) - time.monotonic())
                by_fd = {w.pidfd: w for w in self._workers.values()}
                ready, _, _ = select.select(list(by_fd), [], [], timeout)
                for fd in ready:
                    worker = by_fd[fd]
                    code = self._reap(worker)
                    if self._stops:
                        if code != 0:
                            failed[worker.pid] = code
                            self.say(f"chainrun serve: worker {worker.pid} exited with {code}")
                    else:
                        self._died(worker, code)
                now = time.monotonic()
                for slot, at in list(self._waiting.items()):
                    if at <= now and not self._stops:
                        del self._waiting[slot]
                        pid = self._spawn(slot).pid
                        self.say(f"chainrun serve: worker {pid} started (after its back-off)")
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            for w in list(self._workers.values()):  # an error in the parent: leave none
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGTERM)
                self._reap(w)
        return failed

