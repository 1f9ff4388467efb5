"""``--help`` at 80 columns wraps every word instead of cutting it with "…".

Before: ``COLUMNS=80 chainrun serve --help`` squeezed each option's help into some 17
columns and cut the words longer than that: ``CHAINRUN_SERVE_T…``,
``postgresql://USE…``, ``OTEL_EXPORTER_OT…`` (the environment variables one needs were
lost), ``--no-seed-windo…``. The CLI's own help, for every command and group.
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from chainrun.cli import app


def _command_paths() -> list[list[str]]:
    """Every command and group of the CLI, as the words that name it."""
    paths: list[list[str]] = []

    def walk(cmd: object, path: list[str]) -> None:
        paths.append(path)
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def _help(path: list[str], columns: int) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def _flat(text: str) -> str:
    """The text without the panels' borders and without whitespace: a word folded over
    two lines reads whole again."""
    return re.sub(r"[\s│╭╮╰╯─]", "", text)


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "chainrun")
def test_help_at_80_columns_cuts_nothing(path: list[str]) -> None:
    text = _help(path, 80)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_serve_help_at_80_columns_keeps_its_environment_variables() -> None:
    flat = _flat(_help(["serve"], 80))
    for word in ("CHAINRUN_SERVE_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT",
                 "postgresql://USER@HOST/DB"):  # fmt: skip
        assert word in flat, word
