"""A one-value option given twice is a usage error; runs reads every --db given."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import chainrun, short_replay

ROOT = Path(__file__).resolve().parents[1]


REPLAY = ROOT / "replays" / "commerce-12.jsonl"







# -- 2. a repeated --db (or any one-value option) is never dropped silently ---------------


def test_runs_lists_the_runs_of_every_db_given(lab_config: Path, tmp_path: Path) -> None:
    replay = short_replay(tmp_path, 1)
    a, b = tmp_path / "shop-a.db", tmp_path / "shop-b.db"
    for db, n in ((a, 1), (b, 2)):
        for _ in range(n):
            proc = chainrun("replay", str(replay), "--config", str(lab_config), "--db", str(db))
            assert proc.returncode == 0, proc.stderr
    doc = json.loads(chainrun("runs", "--db", str(a), "--db", str(b), "--json").stdout)
    assert [(r["log"], r["selector"]) for r in doc["runs"]] == [
        (str(a), "1@shop-a"), (str(b), "2@shop-b"), (str(b), "1@shop-b")]  # fmt: skip
    text = chainrun("runs", "--db", str(a), "--db", str(b)).stdout
    assert f"runs in {a}" in text and f"runs in {b}" in text and "2@shop-b" in text
    # one log: as before
    doc = json.loads(chainrun("runs", "--db", str(b), "--json").stdout)
    assert [r["id"] for r in doc["runs"]] == [2, 1] and "log" not in doc["runs"][0]
    same = chainrun("runs", "--db", str(a), "--db", str(tmp_path / "x" / "shop-a.db"))
    assert same.returncode == 2 and "two logs named 'shop-a'" in same.stderr


def test_a_one_value_option_given_twice_is_an_error_not_the_last_one(tmp_path: Path) -> None:
    """Every command with a single --db (and any other one-value option) refuses a repeat
    with one line and exit 2, instead of silently keeping the last value."""
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    for args in (["show", "1", "--db", a, "--db", b],
                 ["hedge-stats", "--db", a, "--db", b],
                 ["replay", str(REPLAY), "--db", a, "--db", b],
                 ["audit", "--db", a, "--db", b],
                 ["advise", "--run", "1", "--step", "x", "--db", a, "--db", b],
                 ["catalog", "load", "x.jsonl", "--db", a, "--db", b],
                 ["lab", "serve", "--port", "1", "--port", "2"]):  # fmt: skip
        proc = chainrun(*args)
        assert proc.returncode == 2, args
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "given more than once" in lines[0], (args, proc.stderr)
    assert not (tmp_path / "a.db").exists() and not (tmp_path / "b.db").exists()
    # an option meant to repeat still repeats, and flags may repeat
    proc = chainrun("compare", "1@a", "1@b", "--db", a, "--db", b)
    assert "given more than once" not in proc.stderr
    assert "given more than once" not in chainrun("runs", "--json", "--json", "--db", a).stderr
