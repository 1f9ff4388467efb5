"""Every summary counts only completed turns; compare names what decided its verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_runner import chainrun

from chainrun.cli.commands_eval import _verdict
from chainrun.log.store import Store


def _cases(path: Path, *cases: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


RUBRIC_ONLY = (
    {"id": "r1", "message": "Do your slim jeans run small?",
     "assert": [{"type": "llm-rubric", "value": "Answers the sizing question."}]},
    {"id": "r2", "message": "Where is my parcel?",
     "assert": [{"type": "llm-rubric", "value": "Does not invent order details."}]},
)  # fmt: skip

# -- summaries of interrupted runs: one rule -----------------------------------------


def _interrupted_run(db: Path) -> int:
    """A replay interrupted by Ctrl-C: 6 completed turns, 2 cancelled after 156 and 104 ms
    (partial durations), 1 refused and 1 errored turn."""
    from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow

    with Store.open(db) as store:
        run = store.create_run("replay", "{}")
        statuses = ["ok"] * 6 + ["cancelled", "cancelled", "refused", "error"]
        durations = [1000.0, 1100.0, 1200.0, 1300.0, 1400.0, 1500.0, 156.0, 104.0, 900.0, 50.0]
        for i, (status, ms) in enumerate(zip(statuses, durations, strict=True)):
            turn = TurnLog(TurnRow(input=f"m{i}", status=status, duration_ms=ms))  # type: ignore[arg-type]
            step_status = "cancelled" if status == "cancelled" else "ok"
            turn.steps = [StepRow(step="compose", status=step_status, duration_ms=ms - 10)]  # type: ignore[arg-type]
            turn.calls = [CallRow(step="compose", ttft_ms=ms / 4, output_tokens=20)]
            store.log_turn(run, turn)
        store.finish_run(run, "interrupted")
    return run


def test_every_summary_counts_only_completed_turns(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    run = _interrupted_run(db)
    counts = {"n_completed": 6, "n_cut": 0, "n_cancelled": 2, "n_refused": 1,
              "n_replaced": 0, "n_errored": 1}
    shown = json.loads(chainrun("show", str(run), "--db", str(db), "--json").stdout)["summary"]
    assert shown["turn"]["n"] == 6 and shown["turns"] == counts
    assert shown["turn"]["p50_ms"] == 1200.0  # not pulled down by 156 ms and 104 ms
    assert shown["steps"]["compose"]["n"] == 6
    compared = json.loads(chainrun("compare", str(run), str(run), "--db", str(db),
                                   "--json").stdout)  # fmt: skip
    assert compared["turn"]["a"]["n"] == 6 and compared["a"]["turns"] == counts
    assert compared["steps"]["compose"]["a"]["n"] == 6
    hedging = json.loads(chainrun("hedge-stats", str(run), "--db", str(db), "--json").stdout)
    assert hedging["n_turns"] == 6 and hedging["turns"] == counts
    assert hedging["steps"]["compose"]["n"] == 6
    text = chainrun("show", str(run), "--db", str(db)).stdout
    assert "over 6 completed turns" in text and "2 cancelled, 1 refused, 1 errored" in text
    text = chainrun("compare", str(run), str(run), "--db", str(db)).stdout
    assert "A: over 6 completed turns" in text
    # the audit: the same rule, the same n, the others counted beside
    proc = chainrun("audit", "--run", str(run), "--db", str(db), "--format", "json", "--out", "-")
    assert proc.returncode == 0, proc.stderr
    items = {i["id"]: i for i in json.loads(proc.stdout)["items"]}
    live_vs_replay = items[7]["figures"]
    assert live_vs_replay["metrics"]["turn"][f"replay run {run}"]["n"] == 6
    assert live_vs_replay["metrics"]["turn"][f"replay run {run}"]["p50_ms"] == 1200.0
    assert live_vs_replay["metrics"]["compose"][f"replay run {run}"]["n"] == 6
    assert live_vs_replay["turns"][f"replay run {run}"] == counts
    assert "(2 cancelled, 1 refused, 1 errored left out)" in items[7]["evidence"]
    assert items[5]["figures"]["steps"]["compose"]["?"]["n"] == 6  # winning calls


def test_compare_says_which_difference_decided_its_verdict(tmp_path: Path) -> None:
    from chainrun.log.rows import TurnLog, TurnRow

    db = tmp_path / "log.db"
    with Store.open(db) as store:
        runs = []
        for shift in (0.0, 500.0):  # B: its slowest 25% are 500 ms slower, the median is not
            run = store.create_run("replay", "{}")
            for i in range(200):
                ms = 1000.0 + i + (shift if i >= 150 else 0.0)
                store.log_turn(run, TurnLog(TurnRow(input=f"m{i}", duration_ms=ms)))
            store.finish_run(run, "complete")
            runs.append(run)
    doc = json.loads(chainrun("compare", str(runs[0]), str(runs[1]), "--db", str(db),
                              "--json").stdout)  # fmt: skip
    turn = doc["turn"]
    assert turn["verdict"] == "worse" and turn["decided_by"] in ("p90", "p99")
    assert turn["diff"]["p50_ci"][0] <= 0  # the p50 alone would not say worse
    # the table's verdict cell names the deciding difference and its interval
    cell = _verdict(turn)
    lo, hi = turn["diff"][f"{turn['decided_by']}_ci"]
    assert cell.startswith(f"worse ({turn['decided_by']} +") and f"[{lo:.0f}, {hi:.0f}])" in cell


def _near_constant_runs(db: Path) -> tuple[int, int]:
    """Two runs of 200 turns with near-constant latency (1000-1006 ms); B is 2% slower
    per turn and 1% slower in its one step: a real difference, but a tiny one."""
    from chainrun.log.rows import StepRow, TurnLog, TurnRow

    with Store.open(db) as store:
        runs = []
        for factor, step_factor in ((1.0, 1.0), (1.02, 1.01)):
            run = store.create_run("replay", "{}")
            for i in range(200):
                ms = 1000.0 + i % 7
                turn = TurnLog(TurnRow(input=f"m{i}", duration_ms=ms * factor))
                turn.steps = [StepRow(step="compose", duration_ms=(ms - 100) * step_factor)]
                store.log_turn(run, turn)
            store.finish_run(run, "complete")
            runs.append(run)
    return runs[0], runs[1]


def test_compare_min_effect_calls_a_tiny_real_difference_same(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    a, b = (str(r) for r in _near_constant_runs(db))

    def compared(*extra: str) -> dict[str, Any]:
        proc = chainrun("compare", a, b, "--db", str(db), "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    strict = compared("--min-effect", "0")  # the intervals alone: B is slower, for real
    assert strict["turn"]["verdict"] == "worse" and strict["steps"]["compose"]["verdict"] == "worse"
    assert strict["regressions"] == ["turn", "compose"]
    assert 0 < strict["turn"]["diff"]["p50_ci"][0] and strict["turn"]["diff"]["p50_ms"] < 25
    doc = compared("--min-effect", "5%", "--fail-on-regression", "any")
    assert doc["min_effect"] == {"text": "5%", "value": 5.0, "unit": "%"}
    assert doc["turn"]["verdict"] == "same" and doc["steps"]["compose"]["verdict"] == "same"
    assert doc["turn"]["decided_by"] == "p50" and doc["regressions"] == []
    assert doc["turn"]["diff"]["tolerance_ms"]["p50"] == pytest.approx(50.15)
    assert doc["regression"] is False
    assert compared()["min_effect"]["text"] == "5%"  # the default
    ms = compared("--min-effect", "10ms")  # 20 ms slower is beyond a 10 ms tolerance
    assert ms["min_effect"]["unit"] == "ms" and ms["turn"]["verdict"] == "worse"
    # compose is 9 ms slower: under 10 ms, but its interval reaches past it
    compose = ms["steps"]["compose"]
    assert compose["diff"]["p50_ms"] < 10 < compose["diff"]["p50_ci"][1]
    assert compose["verdict"] == "inconclusive"
    text = chainrun("compare", a, b, "--db", str(db), "--min-effect", "5%").stdout
    assert "min effect 5%: a difference shown to lie within it is 'same'" in text
    assert _verdict(doc["turn"]) == "same (p50 +20 [18, 22] within ±50)"  # the table's cell
    for bad in ("5", "five%", "-3%", "20s"):
        proc = chainrun("compare", a, b, "--db", str(db), "--min-effect", bad)
        assert proc.returncode == 2 and f"--min-effect {bad!r}" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_compare_counts_and_names_skipped_eval_verdicts(lab_config: Path, tmp_path: Path) -> None:
    # each case: one checkable assertion and one llm-rubric the lab's replies cannot grade
    cases = _cases(
        tmp_path / "mixed.jsonl",
        *(
            {**c, "assert": [*c["assert"], {"type": "not-contains", "value": "XYZZY"}]}
            for c in RUBRIC_ONLY
        ),
    )
    db = tmp_path / "log.db"
    runs = []
    for _ in range(2):
        proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db), "--json")
        assert proc.returncode == 0, proc.stderr
        runs.append(str(json.loads(proc.stdout)["run_id"]))
    proc = chainrun("compare", *runs, "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    ev = json.loads(proc.stdout)["evals"]
    assert ev["n_pairs"] == 2 and ev["a"]["passed"] == 2  # the not-contains verdicts
    for side in ("a", "b"):
        sk = ev["skipped"][side]
        assert sk["n"] == 2 and sk["cases"] == 2
        assert sk["by_type"]["llm-rubric"]["n"] == 2
        assert "gave no pass/fail" in sk["by_type"]["llm-rubric"]["reason"]
    assert set(ev["by_type"]) == {"not-contains"}  # no verdict, no pass rate
    text = chainrun("compare", *runs, "--db", str(db)).stdout
    lines = [line for line in text.splitlines() if "skipped" in line]
    assert [line.split(" (")[0] for line in lines] == [
        "A: skipped 2 llm-rubric", "B: skipped 2 llm-rubric"]  # fmt: skip
    assert all("in no pass rate" in line and "[grader]" in line for line in lines)
    assert "evals (paired on 2 cases): A 2/2 = 1.00" in text
    proc = chainrun("compare", *runs, "--db", str(db), "--fail-on-skipped")
    assert proc.returncode == 1
