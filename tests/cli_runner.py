"""Run chainrun commands in-process for tests (typer's CliRunner: the same code path as
the console script, without a Python start-up per command)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from chainrun.cli import app

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"


@dataclass
class Result:
    """What a user sees of one command: exit code, stdout, stderr, and both streams as
    a terminal shows them, in the order they were written (``output``)."""

    returncode: int
    stdout: str
    stderr: str
    output: str = ""


def chainrun(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run one chainrun command; ``.returncode``, ``.stdout``, ``.stderr`` and ``.output``
    as a user sees them."""
    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    return Result(result.exit_code, result.stdout, result.stderr, result.output)


def short_replay(tmp_path: Path, n: int = 3) -> Path:
    """The first ``n`` requests of the shipped replay set (a faster run of the same kind)."""
    p = tmp_path / f"replay-{n}.jsonl"
    p.write_text("".join(REPLAY.read_text().splitlines(keepends=True)[:n]))
    return p
