"""What the CLI says must be what happened: no tick beside a missing verdict, no help
text eaten as markup, no "beyond the deadline ms", no recommendation missing from the
rows shown."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.cli import app
from chainrun.config import ChainConfig
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply


def chainrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )  # fmt: skip


async def _run_with_verdicts(db: Path, config: ChainConfig, validate: FakeReply) -> int:
    fake = FakeProvider(name="local", script=reply_by_step({"validate": validate}))
    store = Store.open(db)
    try:
        async with Chain(config, store=store, providers={"local": fake}, quiet=True) as chain:
            await chain.run_turn("a rain jacket?")
            assert chain.run_id is not None
            return chain.run_id
    finally:
        store.close()


@pytest.mark.parametrize(
    ("validate", "mark", "shown"),
    [
        (FakeReply("not json at all", ttft_s=0.001), "?", "validate: ok=null"),
        (FakeReply('{"ok": false, "reason": "rude"}', ttft_s=0.001), "✗", "validate: ok=false"),
        (FakeReply('{"ok": true, "reason": "fine"}', ttft_s=0.001), "✓", "validate: ok=true"),
    ],
)
async def test_show_marks_a_verdict_by_what_it_says(
    tmp_path: Path, config: ChainConfig, validate: FakeReply, mark: str, shown: str
) -> None:
    db = tmp_path / "log.db"
    run_id = await _run_with_verdicts(db, config, validate)
    proc = chainrun("show", str(run_id), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "validate: ok=" in ln]
    assert line.strip().startswith(f"{mark} {shown}"), line
    # the critique's advice judges nothing: no tick either
    (critique,) = [ln for ln in proc.stdout.splitlines() if "critique: " in ln]
    assert "✓" not in critique


def _help_texts() -> list[tuple[list[str], str]]:
    """(command path, every help string of it) for every command of the CLI."""
    group = typer.main.get_command(app)
    found: list[tuple[list[str], str]] = []

    def walk(cmd: object, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, [*path, name])
            return
        texts = [getattr(cmd, "help", None) or ""]
        texts += [getattr(p, "help", None) or "" for p in getattr(cmd, "params", [])]
        found.append((path, "\n".join(texts)))

    walk(group, [])
    return found


def test_help_text_in_brackets_is_shown_not_eaten() -> None:
    # a bracket escaped for rich ("\\[otel]") is shown without its backslash
    bracketed = [(path, m.lstrip("\\")) for path, text in _help_texts()
                 for m in re.findall(r"\\?\[[a-z][^\]\[]*\]", text)]  # fmt: skip
    assert (["serve"], "[otel]") in bracketed
    for path, token in bracketed:
        proc = chainrun(*path, "--help", env={"COLUMNS": "200"})
        assert proc.returncode == 0, proc.stderr
        flat = " ".join(proc.stdout.split())
        assert token in flat, f"chainrun {' '.join(path)} --help lost {token!r}"


def test_advise_shows_the_row_it_recommends(tmp_path: Path) -> None:
    from test_advise import log_bimodal_guard

    db = tmp_path / "log.db"
    with Store.open(db) as store:
        run = log_bimodal_guard(store, n=200)
    args = ["advise", "--run", str(run), "--step", "guard", "--db", str(db),
            "--simulations", "2000", "--seed", "1", "--max-extra-calls", "1.05"]  # fmt: skip
    doc = json.loads(chainrun(*args, "--json").stdout)
    rec = doc["recommendation"]
    assert rec["hedge"]
    text = chainrun(*args, env={"COLUMNS": "160"}).stdout
    (picked,) = [ln for ln in text.splitlines() if "← recommended" in ln]
    cells = picked.replace("│", " ").split()
    assert float(cells[0]) == pytest.approx(rec["delay_ms"], abs=0.5)
    assert int(cells[1]) == rec["attempts"]


def test_advise_says_a_p99_beyond_the_deadline_once_and_without_a_unit() -> None:
    from chainrun.analysis.advise import _pick

    beyond = {"in_time": 0.5, "p99_ms": None, "extra_calls_per_turn": 0.0, "attempts": 1,
              "delay_ms": 0.0}  # fmt: skip
    worse = {**beyond, "in_time": 0.5, "attempts": 2, "delay_ms": 500.0,
             "extra_calls_per_turn": 0.1}  # fmt: skip
    reason = _pick(beyond, [worse])["reason"]
    assert "beyond the deadline ms" not in reason
    assert "p99 beyond the deadline either way" in reason
