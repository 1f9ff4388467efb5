"""The audit passes an item only on evidence: a fit over calls of 2-3 tokens is no
evidence of what a token costs, and zero pairs of eval runs compare no effort
(``chainrun audit --json``, on synthetic logs written through the real Store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from audit_logs import add_run, llm, turn
from typer.testing import CliRunner

from chainrun.cli import app
from chainrun.log.store import Store


def _items(db: Path) -> dict[int, dict[str, Any]]:
    res = CliRunner().invoke(app, ["audit", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    return {i["id"]: i for i in json.loads(res.stdout)["items"]}


def test_item5_a_fit_over_two_token_counts_is_no_evidence(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as store:
        # 2-3-token classify calls whose durations are noise: any line fits them, here
        # one of about 9,600 ms per token with a fixed cost of about -13,400 ms
        calls = [(2 + i % 2, (5_785.0 if i % 2 == 0 else 15_390.0) + 7.0 * i) for i in range(14)]
        add_run(store, "replay", [turn([llm("classify", ttft=40.0, dur=d, tokens=t)])
                                  for t, d in calls])  # fmt: skip
    item5 = _items(db)[5]
    assert item5["verdict"] == "not_enough_data"
    fig = item5["figures"]["steps"]["classify"]["local"]
    assert fig["fit"]["slope_ms_per_token"] > 1000 and fig["fit_problem"]
    assert "2 distinct values" in item5["evidence"]


def test_item5_a_spread_of_token_counts_still_passes(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as store:
        add_run(store, "replay", [turn([llm("compose", ttft=100.0, dur=100.0 + 10.0 * t,
                                            tokens=t)]) for t in range(20, 40)])  # fmt: skip
    item5 = _items(db)[5]
    assert item5["verdict"] == "pass"
    assert item5["figures"]["steps"]["compose"]["local"]["fit_problem"] is None


def test_item2_zero_pairs_compared_is_not_a_pass(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as store:
        add_run(store, "replay", [turn([llm("compose", reasoning_tokens=0)]) for _ in range(12)])
    item2 = _items(db)[2]
    assert item2["verdict"] == "not_enough_data"
    assert "0 pairs" in item2["evidence"]
    assert any("reasoning_effort" in m for m in item2["missing"])


def test_item2_reports_label_accuracy_of_eval_runs(tmp_path: Path) -> None:
    from audit_logs import add_eval_results

    db = tmp_path / "log.db"
    with Store.open(db) as store:
        run = add_run(store, "eval", [turn([llm("classify", tokens=2)]) for _ in range(10)],
                      source="evals/regression.jsonl")  # fmt: skip
        turns = [t.id for t in store.turns(run)]
        add_eval_results(store, run, [
            {"case_id": f"c{i}", "type": "equals", "step": "label", "passed": i < 7,
             "turn_id": tid} for i, tid in enumerate(turns)])  # fmt: skip
    acc = _items(db)[2]["figures"]["label_accuracy"][str(run)]
    assert (acc["correct"], acc["n"]) == (7, 10)
    lo, hi = acc["ci95"]
    assert lo < 0.7 < hi
    assert any("label accuracy" in n for n in _items(db)[2]["notes"])
