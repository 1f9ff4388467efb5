"""benchmarks/replicas.py's reading of a log: which compose calls went to a warm replica
(one an earlier turn of the conversation used) and which copies won, on a log written
here by hand (the benchmark itself needs the embedded model)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _log(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("create table turns (id integer primary key, conversation_id text, "
                "turn_index int, status text, answer_ttft_ms real)")
    con.execute("create table calls (id integer primary key, turn_id int, step text, "
                "attempt int, outcome text, server_address text, ttft_ms real, "
                "input_tokens int, cached_input_tokens int, round int, "
                "started_offset_ms real)")
    con.executemany("insert into turns values (?, ?, ?, ?, ?)", [
        (1, "a", 1, "ok", 1000.0), (2, "a", 2, "ok", 300.0), (3, "a", 3, "ok", 500.0),
    ])
    con.executemany("insert into calls values (null, ?, 'compose', ?, ?, ?, ?, ?, ?, 1, 0)", [
        # turn 1 on A, its copy on B lost (cancelled before any token)
        (1, 1, "primary", "A", 900.0, 100, 0), (1, 2, "cancelled", "B", None, None, None),
        # turn 2 on A (warm), a copy on B: B had no token in turn 1, so cold, and lost
        (2, 1, "primary", "A", 250.0, 200, 150), (2, 2, "cancelled", "B", 400.0, 200, 0),
        # turn 3: primary on A warm and slow; the copy on B (warm since turn 2) won
        (3, 1, "cancelled", "A", 900.0, 300, 250), (3, 2, "duplicate", "B", 450.0, 300, 200),
    ])
    con.commit()
    con.close()


def test_warm_and_cold_targets_and_copy_wins(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from replicas import analyse
    finally:
        sys.path.pop(0)
    _log(tmp_path / "log.db")
    got = analyse(tmp_path / "log.db")
    assert got["hedge_copies_by_target"]["cold"] == {"sent": 2, "won": 0, "win_rate": 0.0}
    assert got["hedge_copies_by_target"]["warm"] == {"sent": 1, "won": 1, "win_rate": 1.0}
    assert got["compose_calls_by_target"]["warm"]["calls"] == 3
    assert got["compose_calls_by_target"]["cold"]["calls"] == 3
    # winners of turns >= 2: (200, 150) and (300, 200)
    assert got["later_cached_share"] == round(350 / 500, 3)
    assert got["ttft_ratio_later_to_first"] == 0.3  # nearest-rank p50 of (300, 500) / 1000
    assert got["compose_calls_by_replica"] == {"A": 3, "B": 3}
