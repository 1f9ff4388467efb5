"""Smoke test of ``benchmarks/serve_load.py``: it runs end to end at a tiny size and its
document has the recorded keys; it asserts nothing about speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_serve_load_runs_and_checks_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "serve_load.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/serve_load.py", "--levels", "2,4", "--duration-s", "1.5",
         "--drain-s", "20", "--median-ms", "5", "--json", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["benchmark"] == "serve_load" and doc["date"].endswith("+00:00")
    levels = doc["results"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [2, 4]
    for lv in levels:
        assert lv["turns_completed"] >= lv["concurrency"] and lv["errors"] == {}
        assert lv["every_turn_logged_exactly_once"] is True
        assert lv["logged_turns"] == lv["turns_completed"] and lv["logged_kinds"] == ["live"]
        assert lv["client_turn_ms"]["n"] == lv["logged_turn_ms"]["n"] == lv["turns_completed"]
        assert lv["turns_per_s"] > 0 and lv["server_exit_code"] == 0
        # the client waits for the server's log: it can only see more time, never less
        assert lv["client_turn_ms"]["p50_ms"] >= lv["logged_turn_ms"]["p50_ms"]
