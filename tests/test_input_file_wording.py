"""Input files say what they got, where, in one wording: a catalogue CSV that is not UTF-8
names its line and byte (as replay JSONL does); a replay line's text fields follow one
rule (a non-empty string) and say what they got; an unknown field reads the same in a
replay set, an eval set and a catalogue.

Before: the CSV said only the codec's message (``can't decode byte 0xff in position
52``); ``"message": 5`` said "expected field 'message'" without what was there; ``"id":
7`` was accepted while ``"id": ""`` was refused; eval said ``extra: unknown field`` where
replay said ``unknown field 'extra'; expected ...``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_runner import chainrun

from chainrun.errors import InputFileError
from chainrun.evals.cases import load_cases
from chainrun.replay.run import load_requests
from chainrun.retrieval.catalog import read_catalog

HEADER = "id,title,category,price\n"


def test_a_csv_catalogue_that_is_not_utf8_names_its_line_and_byte(tmp_path: Path) -> None:
    p = tmp_path / "c.csv"
    p.write_bytes(HEADER.encode() + b"A-1,Rain jacket,jackets,10\nA-2,Sc\xffarf,scarves,5\n")
    with pytest.raises(InputFileError) as e:
        read_catalog(p)
    assert str(e.value) == f"{p}:3: not UTF-8 text (byte 7); expected UTF-8 CSV"
    # a byte-order mark is no character of the first line
    p.write_bytes(b"\xef\xbb\xbf" + HEADER.encode() + b"A-\x801,Rain jacket,jackets,10\n")
    with pytest.raises(InputFileError, match=r"c\.csv:2: not UTF-8 text \(byte 3\)"):
        read_catalog(p)
    res = chainrun("catalog", "load", str(p), "--db", str(tmp_path / "shop.db"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "c.csv:2: not UTF-8 text (byte 3); expected UTF-8 CSV" in res.stderr


def _replay_error(tmp_path: Path, line: dict) -> str:
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(line) + "\n")
    with pytest.raises(InputFileError) as e:
        load_requests(p)
    return str(e.value).removeprefix(f"{p}:1: ")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ({"id": "a", "message": 5}, "field 'message': expected a non-empty string, got 5"),
        ({"id": "a", "message": "  "}, "field 'message': expected a non-empty string, got \"  \""),
        ({"id": "a"}, "missing field 'message' (a non-empty string)"),
        ({"id": "a", "mesage": "hi"},
         "unknown field 'mesage' (did you mean 'message'?); expected id, message, "
         "conversation_id, turn, history, original_ms, expect, user"),
        ({"id": 7, "message": "hi"}, "field 'id': expected a non-empty string, got 7"),
        ({"id": "", "message": "hi"}, "field 'id': expected a non-empty string, got \"\""),
        ({"id": True, "message": "hi"}, "field 'id': expected a non-empty string, got true"),
        ({"id": "a", "message": "hi", "conversation_id": ""},
         "field 'conversation_id': expected a non-empty string, got \"\""),
        ({"id": "a", "message": "hi", "conversation_id": 3},
         "field 'conversation_id': expected a non-empty string, got 3"),
        ({"id": "a", "message": ["a" * 60]},
         "field 'message': expected a non-empty string, got [\"" + "a" * 35 + "..."),
    ],
)  # fmt: skip
def test_a_replay_lines_text_fields_follow_one_rule_and_say_what_they_got(
    tmp_path: Path, line: dict, said: str
) -> None:
    assert _replay_error(tmp_path, line) == said


def test_an_unknown_field_reads_the_same_in_replay_eval_and_catalogue(tmp_path: Path) -> None:
    replay = tmp_path / "r.jsonl"
    replay.write_text('{"id": "a", "message": "hi", "extra": 1}\n')
    cases = tmp_path / "e.jsonl"
    cases.write_text('{"id": "a", "message": "hi", "assert": [{"type": "latency", '
                     '"threshold": 5}], "extra": 1}\n')  # fmt: skip
    catalogue = tmp_path / "c.jsonl"
    catalogue.write_text('{"id": "A-1", "title": "t", "category": "c", "price": 1, '
                         '"extra": 1}\n')  # fmt: skip
    said = []
    for path, load in ((replay, load_requests), (cases, load_cases), (catalogue, read_catalog)):
        with pytest.raises(InputFileError) as e:
            load(path)
        said.append(str(e.value).removeprefix(f"{path}:1: "))
    shape = re.compile(r"unknown field 'extra'; expected id, message, .+|"
                       r"unknown field 'extra'; expected id, title, .+")  # fmt: skip
    assert all(shape.fullmatch(s) for s in said), said
    # a misspelt key, at the top or inside an assertion, gets its did-you-mean in eval too
    cases.write_text('{"id": "a", "message": "hi", "assert": [{"type": "equals", '
                     '"step": "label", "valu": "x"}]}\n')  # fmt: skip
    with pytest.raises(InputFileError) as e:
        load_cases(cases)
    assert str(e.value) == (f"{cases}:1: assert[0]: unknown field 'valu' (did you mean "
                            "'value'?); expected type, step, value, ignore_case")  # fmt: skip
    cases.write_text('{"id": "a", "message": "hi", "asert": []}\n')
    with pytest.raises(InputFileError, match=r":1: unknown field 'asert' \(did you mean "
                                             r"'assert'\?\); expected id, message, "):
        load_cases(cases)
    cases.write_text('{"id": "a", "message": "hi", "assert": [{"type": "equls", '
                     '"step": "label", "value": "x"}]}\n')  # fmt: skip
    with pytest.raises(InputFileError, match=r":1: assert\[0\]\.type: unknown assertion type "
                                             r"'equls' \(did you mean 'equals'\?\)"):
        load_cases(cases)
