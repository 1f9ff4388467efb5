"""At 80 and 120 columns no number is cut: ``show``, ``hedge-stats`` and ``compare``
wrap, or leave columns out in their stated order and say so, but never print ``227…``.

The logs are synthetic (written through the real Store) with the long numbers a slow
local model produces: turns of minutes, percentiles with five-digit intervals.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from audit_logs import add_run, hedge_config, hedged, llm, turn

from chainrun.log.rows import TurnLog
from chainrun.log.store import Store


def chainrun(*args: str, columns: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": str(columns)},
    )  # fmt: skip


def _slow_turns(rng: random.Random, n: int) -> list[TurnLog]:
    turns = []
    for i in range(n):
        ms = rng.uniform(3_000.0, 250_000.0)
        rec, calls = hedged("classify", delay=1_234.5, settle=ms, fired=i % 3 == 0,
                            won=i % 6 == 0, saved=812.25)  # fmt: skip
        compose = llm("compose", ttft=rng.uniform(2_000, 40_000), dur=ms, tokens=117)
        t = turn([*calls, compose])
        t.steps[:1] = [rec]
        turns.append(t)
    return turns


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("narrow") / "log.db"
    rng = random.Random(7)
    with Store.open(db) as store:
        for _ in range(2):
            add_run(store, "replay", _slow_turns(rng, 40), config=hedge_config("classify"))
    return db


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize(
    "command", [("show", "1"), ("hedge-stats", "1"), ("compare", "1", "2")]
)
def test_no_number_is_cut(log: Path, columns: int, command: tuple[str, ...]) -> None:
    proc = chainrun(*command, "--db", str(log), columns=columns)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "…" not in text, "\n".join(ln for ln in text.splitlines() if "…" in ln)
    # a table's rows fit (plain text lines are left to the terminal to wrap)
    rows = [ln for ln in text.splitlines() if ln[:1] in "│┃┏┡└"]
    assert rows and max(len(ln) for ln in rows) <= columns
    # every percentile of the run's summary is printed whole
    if command[0] in ("show", "compare"):
        doc = json.loads(chainrun(*command, "--db", str(log), "--json", columns=200).stdout)
        turn = doc["summary"]["turn"] if command[0] == "show" else doc["turn"]["a"]
        p50 = f"{turn['p50_ms']:.0f}"
        assert re.search(rf"(?<![\d.]){p50}(?![\d.])", text), p50
