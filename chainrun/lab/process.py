"""Run the latency lab in a subprocess, for tests and benchmark scripts.

A separate process keeps the lab's event loop apart from the client's: latency
the client measures is then not distorted by the server sharing its loop.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from chainrun.errors import ProviderUnavailable
from chainrun.lab.scenarios import Scenario, load_scenario, with_overrides

# urllib must not send loopback traffic through an HTTP proxy set in the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LabServer:
    """The lab in a subprocess on a free loopback port (a sync context manager).

    ::

        with LabServer("lognormal", median_ms=300) as lab:
            client = AsyncOpenAI(base_url=lab.base_url, api_key="x")
            ...
            records = lab.requests()

    Args:
        scenario: a Scenario, a built-in name or a TOML path (see :func:`load_scenario`).
        startup_timeout_s: how long to wait for ``/health``, in s.
        overrides: scenario overrides, as for :func:`load_scenario`.

    Raises (from :meth:`start` / entering):
        ProviderUnavailable: the subprocess exited or did not answer in time; the
            message carries the end of its stderr.
        UserInputError: a bad scenario name, file or override.
    """

    def __init__(
        self,
        scenario: Scenario | str | Path = "fast",
        *,
        startup_timeout_s: float = 20.0,
        **overrides: Any,
    ) -> None:
        if isinstance(scenario, Scenario):
            self.scenario = with_overrides(scenario, **overrides)
        else:
            self.scenario = load_scenario(scenario, **overrides)
        self.startup_timeout_s = startup_timeout_s
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None
        self._log: IO[bytes] | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self, port: int = 0) -> LabServer:
        """Start the subprocess on ``port`` (0: a free one) and wait until ``/health``
        answers. Returns self."""
        if self._proc is not None:
            return self
        self._tmp = Path(tempfile.mkdtemp(prefix="chainrun-lab-"))
        port_file = self._tmp / "port"
        self._log = (self._tmp / "stderr.log").open("wb")
        env = os.environ.copy()
        # the child must import this very chainrun, installed or not
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable, "-m", "chainrun.lab", "serve",
            "--scenario-json", self.scenario.model_dump_json(),
            "--host", "127.0.0.1", "--port", str(port), "--port-file", str(port_file),
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, env=env
        )
        try:
            self._wait_ready(port_file)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, port_file: Path) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ProviderUnavailable(
                    f"lab server exited with code {self._proc.returncode}: {self._stderr_tail()}"
                )
            if self.port is None and port_file.exists():
                self.port = int(port_file.read_text(encoding="utf-8"))
            if self.port is not None:
                try:
                    self._get("/health", timeout=1.0)
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        raise ProviderUnavailable(
            f"lab server did not answer /health within {self.startup_timeout_s:g} s: "
            f"{self._stderr_tail()}"
        )

    def _stderr_tail(self) -> str:
        if self._tmp is None:
            return ""
        try:
            text = (self._tmp / "stderr.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return text.strip()[-2000:] or "(no output)"

    def stop(self) -> None:
        """Stop the subprocess (SIGTERM, then SIGKILL after 5 s) and remove its files."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        self.port = None

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ access

    @property
    def url(self) -> str:
        """The server root, e.g. ``http://127.0.0.1:PORT``."""
        if self.port is None:
            raise RuntimeError("LabServer is not running: use it as a context manager or start()")
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int:
        """The lab subprocess's process id.

        Raises:
            RuntimeError: the lab is not running.
        """
        if self._proc is None:
            raise RuntimeError("LabServer is not running: use it as a context manager or start()")
        return self._proc.pid

    def cpu_s(self) -> float | None:
        """CPU time (user + system, in s) the lab process has used so far, from
        ``/proc/PID/stat`` (fields 14 and 15, in clock ticks; proc(5)); None where
        ``/proc`` is not available. The difference of two readings is the lab's CPU
        over that interval (benchmarks report it per turn: the lab shares the cores).
        """
        try:
            text = Path(f"/proc/{self.pid}/stat").read_text(encoding="ascii")
        except OSError:
            return None
        # the command name (field 2) is in parentheses and may hold spaces
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def requests(self) -> list[dict[str, Any]]:
        """The per-request records (fields of :class:`~chainrun.lab.server.RequestRecord`)."""
        data = self._get("/admin/requests")
        assert isinstance(data, list)
        return data

    def reset(self) -> None:
        """Forget the records and restart the scenario's RNG from its seed."""
        self._post("/admin/reset")

    def set_scenario(self, scenario: Scenario) -> None:
        """Serve ``scenario`` from now on (records forgotten, RNG from its seed)."""
        self._post("/admin/scenario", body=scenario.model_dump_json().encode())
        self.scenario = scenario

    def _get(self, path: str, timeout: float = 10.0) -> Any:
        with _OPENER.open(self.url + path, timeout=timeout) as r:
            return json.loads(r.read())

    def _post(self, path: str, timeout: float = 10.0, body: bytes = b"{}") -> Any:
        req = urllib.request.Request(self.url + path, data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        with _OPENER.open(req, timeout=timeout) as r:
            return json.loads(r.read())
