"""Smoke test of ``benchmarks/retrieval_early_exit.py``: one tiny round, the hash embedder.

Run as the user runs it (a subprocess), writing to a temporary file so that the recorded
``benchmarks/results/retrieval_early_exit.json`` stays untouched. Not a timing test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_retrieval_early_exit_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "ree.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/retrieval_early_exit.py", "--rounds", "1",
         "--embedder", "hash", "--json", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert json.loads(out.read_text(encoding="utf-8")) == doc
    assert doc["benchmark"] == "retrieval_early_exit"
    assert doc["command"].startswith("python benchmarks/retrieval_early_exit.py")
    assert {"platform", "cpu_count"} <= doc["machine"].keys() and doc["date"]
    assert doc["parameters"]["embedder"] == "hash-256"
    res = doc["results"]
    early, every = res["arms"]["early_exit"], res["arms"]["every_search"]
    assert early["time"]["n"] == every["time"]["n"] == res["n_queries"]
    assert every["mean_searches_run"] == 3 and early["mean_searches_run"] < 3
    assert every["share_stopped_early"] == 0 and early["share_stopped_early"] > 0
    assert 0 <= early["recall_at_8"] <= every["recall_at_8"] <= 1
    assert res["recall_cost"] >= 0
