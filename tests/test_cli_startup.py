"""The CLI starts without loading what the command does not use: ``--help`` and ``runs``
import no model client, no HTTP server, no statistics or plots, no chain. (How long
start-up takes is a benchmark, ``benchmarks/cli_startup.py``, not a test.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chainrun.lab.names import BUILTIN_SCENARIO_NAMES
from chainrun.lab.scenarios import BUILTIN_SCENARIOS

#: what a command that neither runs the chain nor analyses a run must not import (NumPy
#: included: sqlite-utils imports it when it is installed, and the console script keeps
#: it out of that import)
HEAVY = ("numpy", "pandas", "chainrun.chain", "chainrun.steps", "chainrun.providers",
         "chainrun.analysis", "chainrun.audit", "chainrun.serve.app", "chainrun.lab.server",
         "chainrun.retrieval",
         "chainrun.config", "chainrun.config.capabilities", "chainrun.hedging.engine",
         "chainrun.hedging.advisor", "chainrun.hedging.window", "openai", "httpx", "scipy",
         "matplotlib", "starlette", "uvicorn")  # fmt: skip

_MODULES_AFTER = """
import runpy, sys
sys.argv = ["chainrun", *sys.argv[1:]]
try:
    runpy.run_module("chainrun", run_name="__main__")
except SystemExit:
    pass
sys.stderr.write("\\n".join(sorted(sys.modules)))
"""


def _modules_after(*args: str, cwd: Path) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", _MODULES_AFTER, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    return set(proc.stderr.splitlines())


@pytest.mark.parametrize(
    "args",
    [("--help",), ("runs", "--db", "empty.db"), ("serve", "--help"), ("lab", "serve", "--help")],
)
def test_start_up_imports_only_what_the_command_needs(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "empty.db").close()
    loaded = _modules_after(*args, cwd=tmp_path)
    assert "chainrun.cli" in loaded  # the command ran
    heavy = sorted(m for m in loaded if m.startswith(HEAVY))
    assert heavy == [], f"chainrun {' '.join(args)} imported {heavy[:8]}"
    if args[0] != "runs":  # help text reads no log: neither the store nor a database driver
        log = sorted(m for m in loaded if m.startswith(("chainrun.log.store", "psycopg")))
        assert log == [], f"chainrun {' '.join(args)} imported {log[:8]}"


def test_scenario_names_for_help_are_the_built_in_scenarios() -> None:
    assert BUILTIN_SCENARIO_NAMES == tuple(BUILTIN_SCENARIOS)


#: what ``chainrun run`` and ``chainrun replay`` import before their first turn
_BEFORE_FIRST_TURN = ("chainrun.cli.commands_core", "chainrun.chain", "chainrun.cli.tables",
                      "chainrun.config", "chainrun.log.store", "chainrun.analysis.summary",
                      "chainrun.replay.run", "chainrun.analysis.simulate")  # fmt: skip


def test_run_and_replay_import_no_scipy_before_a_percentile_interval() -> None:
    """scipy.stats takes seconds to import at load: a run's summary never needs it (the
    interval of up to 1,000 values is summed exactly without it)."""
    code = (
        f"import {', '.join(_BEFORE_FIRST_TURN)}, sys\n"
        "assert not [m for m in sys.modules if m.startswith('scipy')], "
        "sorted(m for m in sys.modules if m.startswith('scipy'))[:5]\n"
        "from chainrun.statistics.intervals import quantile_ci\n"
        "assert quantile_ci(list(range(40)), 50) == (13.0, 26.0)\n"
        "assert 'scipy.stats' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_sqlite_utils_still_imports_numpy_by_itself() -> None:
    """The upstream behaviour the console script's import finder
    (``chainrun.cli._NoNumpyForSqliteUtils``) works around: sqlite-utils imports NumPy at
    the top of ``sqlite_utils/db.py`` whenever NumPy is installed, whatever is imported
    from it (measured: ``chainrun runs`` 990 ms with it, 741 ms without,
    ``benchmarks/README.md``, "CLI start-up"). When this fails, sqlite-utils stopped
    doing so: remove the finder."""
    code = "import sys, sqlite_utils; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert out.stdout.strip() == "True", out.stderr
