"""``chainrun eval`` as a build gate: a broken retrieval on an 11-case set fails it (a
must-pass case, or the pass rate under ``--fail-under``), the text output lists the
failed cases and assertions, ``catalog-ids`` does not pass when nothing was retrieved,
and ``compare --fail-on-regression evals`` fails the build too. The lab is the model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w
from cli_runner import chainrun
from counted_tools import ORDER, RUNS

from chainrun.evals.assertions import TurnView, parse_assertion
from chainrun.lab import LabServer
from chainrun.lab.scenarios import Scenario
from chainrun.log.rows import ToolCallRow

MESSAGES = [
    "I need a waterproof rain jacket under 100 euros.",
    "Show me white leather sneakers for men.",
    "Do you have linen shirts for summer?",
    "A warm wool jumper for winter?",
    "Jeans in a slim fit, size 32?",
    "A summer dress for a wedding?",
    "Any leather boots for autumn?",
    "A packable down jacket?",
    "Something in navy, a shirt maybe?",
    "Trainers for running?",
    "A beanie for the cold?",
]


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=6) as server:
        yield server


def _files(tmp: Path, lab: LabServer) -> tuple[Path, Path, Path]:
    cases = tmp / "cases.jsonl"
    cases.write_text("".join(json.dumps({
        "id": f"c{i:02d}", "message": m, "must_pass": i < 2,
        "assert": [{"type": "catalog-ids", "within": "retrieved"}],
    }) + "\n" for i, m in enumerate(MESSAGES)))  # fmt: skip
    # the label routes product questions to retrieve; the classify is the keyword one
    good = {"providers": {"local": {"base_url": lab.base_url}},
            "steps": {"classify": {"method": "keywords"},
                      "retrieve": {"when": {}, "retrieval": {"searches": ["keyword", "filter"]}}}}
    broken = {**good, "steps": {**good["steps"], "retrieve": {"when": {"label": ["never"]}}}}
    paths = []
    for name, cfg in (("good.toml", good), ("broken.toml", broken)):
        p = tmp / name
        p.write_text(tomli_w.dumps(cfg))
        paths.append(p)
    return cases, paths[0], paths[1]


def test_a_broken_retrieval_fails_the_build_and_says_which_cases(
    lab: LabServer, tmp_path: Path
) -> None:
    cases, good, broken = _files(tmp_path, lab)
    db = str(tmp_path / "log.db")
    ok = chainrun("eval", str(cases), "--config", str(good), "--db", db, "--fail-under", "0.9")
    assert ok.returncode == 0, ok.output
    assert "failed cases" not in ok.stdout
    bad = chainrun("eval", str(cases), "--config", str(broken), "--db", db)
    assert bad.returncode == 1, bad.output  # the must-pass cases failed: no floor needed
    assert "failed cases (11 of 11):" in bad.stdout
    assert "c00 (must pass)" in bad.stdout and "c10" in bad.stdout
    assert "catalog-ids: nothing was retrieved" in bad.stdout
    assert "gate failed: must-pass case c00 failed" in bad.stdout
    # without must-pass cases the floor alone fails it
    plain = tmp_path / "plain.jsonl"
    plain.write_text(cases.read_text().replace('"must_pass": true', '"must_pass": false'))
    floor = chainrun("eval", str(plain), "--config", str(broken), "--db", db,
                     "--fail-under", "0.5", "--json")  # fmt: skip
    assert floor.returncode == 1
    doc = json.loads(floor.stdout)
    assert doc["gate"]["failed"] == ["case pass rate 0.000 is under --fail-under 0.5"]
    assert [c["case_id"] for c in doc["failed_cases"]] == [f"c{i:02d}" for i in range(11)]
    # compare: the broken run against the good one is a regression of the evals
    res = chainrun("compare", "1", "2", "--db", db, "--fail-on-regression", "evals")
    assert res.returncode == 1, res.output


def test_tool_called_reads_the_turn_s_tool_calls() -> None:
    calls = (ToolCallRow(step="compose", call_id="c1", tool="order_status",
                         arguments='{"order_id": 1042}', status="ok"),)  # fmt: skip
    view = TurnView(message="where is 1042", answer="shipped", tool_calls=calls)
    yes = parse_assertion({"type": "tool-called", "tool": "order_status",
                           "arguments": {"order_id": 1042}})  # fmt: skip
    assert yes.check(view).passed is True
    other = parse_assertion({"type": "tool-called", "tool": "order_status",
                             "arguments": {"order_id": 2077}})  # fmt: skip
    verdict = other.check(view)
    assert verdict.passed is False and "called 0 time(s)" in verdict.detail
    never = parse_assertion({"type": "tool-called", "tool": "add_to_cart", "max_times": 0,
                             "min_times": 0})  # fmt: skip
    assert never.check(view).passed is True


def test_tool_called_through_an_eval_run(lab: LabServer, tmp_path: Path) -> None:
    lab.set_scenario(Scenario(name="tools", n_tokens=6, tool_calls={"rounds": 1}))
    cfg = tmp_path / "tools.toml"
    cfg.write_text(tomli_w.dumps({
        "order": ["compose"], "answer_step": "compose",
        "providers": {"local": {"base_url": lab.base_url}},
        "steps": {"compose": {"prompt": "{message}", "tools": ["order_status"]}},
        "tools": {"order_status": ORDER},
    }))  # fmt: skip
    cases = tmp_path / "tools.jsonl"
    cases.write_text(json.dumps({"id": "t1", "message": "where is order 1042?", "assert": [
        {"type": "tool-called", "tool": "order_status", "arguments": {"order_id": 1042}},
        {"type": "tool-called", "tool": "order_status", "min_times": 2}]}) + "\n")  # fmt: skip
    RUNS.clear()
    res = chainrun("eval", str(cases), "--config", str(cfg), "--db", str(tmp_path / "t.db"),
                   "--json")  # fmt: skip
    doc = json.loads(res.stdout)
    passed = [v["passed"] for v in doc["verdicts"]]
    assert passed == [True, False] and RUNS == [1042]
