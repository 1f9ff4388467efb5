"""A command that needs an extra that is not installed says so in one line with the
install command, and exits 2 (never a traceback). The extra's modules are hidden from a
fresh interpreter (``sys.modules[name] = None`` makes their import fail, as when the
extra is absent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OTEL = ["opentelemetry", "opentelemetry.sdk", "opentelemetry.exporter",
        "opentelemetry.exporter.otlp", "opentelemetry.exporter.otlp.proto.http"]  # fmt: skip


@pytest.mark.parametrize(
    ("hidden", "args", "install"),
    [
        (["psycopg", "psycopg_pool"], ["runs", "--db", "postgresql://u@127.0.0.1:9/db"],
         "pip install 'chainrun[postgres]'"),
        (["psycopg", "psycopg_pool"], ["serve", "--port", "0", "--db",
                                       "postgresql://u@127.0.0.1:9/db"],
         "pip install 'chainrun[postgres]'"),
        (OTEL, ["serve", "--port", "0", "--otel", "--db", "log.db"],
         "pip install 'chainrun[otel]'"),
        (["matplotlib"], ["simulate", "--plot", "p99.png"], "pip install 'chainrun[plot]'"),
    ],
    ids=["runs on PostgreSQL", "serve on PostgreSQL", "serve --otel", "simulate --plot"],
)  # fmt: skip
def test_a_missing_extra_is_one_line_naming_its_install(
    tmp_path: Path, hidden: list[str], args: list[str], install: str
) -> None:
    code = ("import sys\n"
            f"for name in {hidden!r}:\n    sys.modules[name] = None\n"
            "from chainrun.cli import main\n"
            f"sys.argv = ['chainrun', *{args!r}]\nmain()\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          timeout=120)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].endswith(install), lines
