"""chainrun eval from the command line: skipped assertions, the grader, unknown steps, --run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_runner import chainrun, short_replay

ROOT = Path(__file__).resolve().parents[1]


REPLAY = ROOT / "replays" / "commerce-12.jsonl"


# -- evals -----------------------------------------------------------------------------


def _cases(path: Path, *cases: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


RUBRIC_ONLY = (
    {"id": "r1", "message": "Do your slim jeans run small?",
     "assert": [{"type": "llm-rubric", "value": "Answers the sizing question."}]},
    {"id": "r2", "message": "Where is my parcel?",
     "assert": [{"type": "llm-rubric", "value": "Does not invent order details."}]},
)  # fmt: skip


def test_eval_says_why_llm_rubric_was_skipped_and_can_fail_on_it(
    lab_config: Path, tmp_path: Path
) -> None:
    # the grader is the chain's local provider (here the lab), whose replies are no pass/fail
    cases = _cases(tmp_path / "rubric.jsonl", *RUBRIC_ONLY)
    db = tmp_path / "log.db"
    proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 1 and "skipped 2 llm-rubric" in skipped[0]
    assert "gave no pass/fail" in skipped[0] and "[grader]" in skipped[0]
    proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db), "--json",
                    "--fail-on-skipped")  # fmt: skip
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["skipped"]["llm-rubric"]["n"] == 2 and doc["cases"]["n"] == 0
    assert all(v["passed"] is None for v in doc["verdicts"]) and len(doc["verdicts"]) == 2


def test_eval_grader_is_configured_in_chainrun_toml(lab_config: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "grader.toml"
    cfg.write_text(lab_config.read_text() + '[grader]\nprovider = "nowhere"\n')
    cases = _cases(tmp_path / "rubric.jsonl", *RUBRIC_ONLY)
    proc = chainrun("eval", str(cases), "--config", str(cfg), "--db", str(tmp_path / "l.db"))
    assert proc.returncode == 2 and "grader.provider: unknown provider 'nowhere'" in proc.stderr


def test_eval_assertion_naming_a_missing_step_is_caught_at_load(
    lab_config: Path, tmp_path: Path
) -> None:
    def case(case_id: str, step: str) -> dict[str, Any]:
        return {"id": case_id, "message": "hi",
                "assert": [{"type": "equals", "step": step, "value": "a"}]}  # fmt: skip

    cases = _cases(tmp_path / "typo.jsonl", case("ok", "label"), case("t", "clasify"))
    db = tmp_path / "log.db"
    proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db))
    assert proc.returncode == 2
    assert f"{cases}:2" in proc.stderr and "did you mean 'classify'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not db.exists()


def test_eval_run_refuses_new_run_options_and_exits_2_without_a_match(
    lab_config: Path, tmp_path: Path
) -> None:
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(short_replay(tmp_path)), "--config", str(lab_config),
                    "--db", str(db), "--json")  # fmt: skip
    run_id = json.loads(proc.stdout)["run_id"]
    cases = _cases(tmp_path / "c.jsonl", {"id": "x", "message": "not in the replay",
                                          "assert": [{"type": "contains", "value": "a"}]})
    proc = chainrun("eval", str(cases), "--run", str(run_id), "--config", str(lab_config),
                    "--db", str(db), "--repeat", "2", "--concurrency", "4",
                    "--label", "x")  # fmt: skip
    assert proc.returncode == 2 and "existing run" in proc.stderr
    assert "--repeat, --concurrency, --label: only for a new eval run" in proc.stderr
    proc = chainrun("eval", str(cases), "--run", str(run_id), "--config", str(lab_config),
                    "--db", str(db), "--repeat", "1")  # fmt: skip
    assert proc.returncode == 2 and "--repeat: only for a new eval run" in proc.stderr
    proc = chainrun("eval", str(cases), "--run", str(run_id), "--config", str(lab_config),
                    "--db", str(db))  # fmt: skip
    assert proc.returncode == 2
    assert f"run {run_id}: none of its 3 turns matches a case" in proc.stderr
