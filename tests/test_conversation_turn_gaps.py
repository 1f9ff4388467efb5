"""A conversation's turn whose earlier turn is neither in the file nor given as its
``history`` is refused, in one line naming the file, the line and the conversation.

Before: a replay file whose only line was turn 2 ran that turn with no history at all,
without a word, and reported it under turn 2 (``compare`` by turn index mixed it with
real second turns). A warning would scroll away above the summary; the file is cheap to
fix (add turn 1, give the line its ``history``, or number it turn 1), so it is an error,
before any run or log exists, as every other bad line of these files is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import chainrun

from chainrun.replay.run import load_requests


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("command", ["replay", "eval"])
def test_a_lone_turn_2_is_refused_naming_file_line_and_conversation(
    tmp_path: Path, lab_config: Path, command: str
) -> None:
    # eval needs checks; a replay line refuses any field of an eval case
    checks = {"assert": [{"type": "contains", "value": "x"}]} if command == "eval" else {}
    path = _write(tmp_path / "set.jsonl", [
        {"id": "solo", "message": "Do you have rain jackets?", **checks},
        {"id": "rain-2", "conversation_id": "rain", "turn": 2, "message": "Which is cheapest?",
         **checks},
    ])  # fmt: skip
    db = tmp_path / "log.db"
    res = chainrun(command, str(path), "--config", str(lab_config), "--db", str(db))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"chainrun: error: {path}:2: conversation 'rain': turn 2 has no turn 1 in the file "
        "and no 'history', so it would run without turn 1; add turn 1, give this line a "
        "'history' (the turns before it, oldest first), or number it turn 1"
    ]
    assert not db.exists()  # refused before any run or log


def test_a_gap_inside_a_conversation_names_the_turn_after_it(
    tmp_path: Path, lab_config: Path
) -> None:
    path = _write(tmp_path / "set.jsonl", [
        {"id": "c3", "conversation_id": "c", "turn": 3, "message": "and in blue?"},
        {"id": "c1", "conversation_id": "c", "turn": 1, "message": "a wool coat?"},
    ])  # fmt: skip
    res = chainrun("replay", str(path), "--config", str(lab_config), "--db",
                   str(tmp_path / "log.db"), "--json")  # fmt: skip
    assert res.returncode == 2
    error = json.loads(res.stdout)["error"]
    assert error["file"] == str(path) and error["line"] == 1
    assert "conversation 'c': turn 3 has no turn 2 in the file" in error["message"]
    assert error["message"].endswith("or number it turn 2")


def test_a_turn_with_its_history_or_its_earlier_turns_is_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path / "set.jsonl", [
        {"id": "f2", "conversation_id": "f", "turn": 2, "message": "cheapest?",
         "history": [{"message": "rain jackets?", "answer": "We have three."}]},
        {"id": "f3", "conversation_id": "f", "turn": 3, "message": "in blue?"},
        {"id": "g2", "conversation_id": "g", "turn": 2, "message": "cheapest?"},
        {"id": "g1", "conversation_id": "g", "turn": 1, "message": "boots?"},
    ])  # fmt: skip
    assert [r.id for r in load_requests(path)] == ["f2", "f3", "g2", "g1"]
