"""The one JSON module (answers and their schema) and the one JSONL reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import reply_by_step

from chainrun.answer_json import (
    answer_problem,
    check_schema,
    parse_json_object,
    parse_json_output,
    schema_errors,
)
from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError, InputFileError
from chainrun.evals.cases import load_cases
from chainrun.input_files import MAX_LINE_BYTES, read_jsonl
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.replay.run import load_requests
from chainrun.retrieval.catalog import read_catalog
from chainrun.retrieval.evaluate import load_queries

VALIDATE = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["ok", "reason"],
}


# -- parse_json_output / schema ---------------------------------------------------------


def test_strict_and_embedded_parsing() -> None:
    assert parse_json_output('```json\n{"a": 1}\n```') == (True, {"a": 1})
    assert parse_json_output("  [1, 2] ") == (True, [1, 2])
    assert parse_json_output('Sure: {"a": 1}') == (False, None)
    assert parse_json_output('Sure: {"a": 1}', embedded=True) == (True, {"a": 1})
    assert parse_json_output(None) == (False, None)
    # two objects in prose: the greedy {.*} regex this replaces found none
    assert parse_json_object('first {"ok": true} then {"ok": false}') == {"ok": True}
    assert parse_json_object("[" * 100_000) is None  # deep nesting never raises


def test_schema_errors_are_draft_2020_12_with_formats() -> None:
    assert schema_errors({"ok": "yes", "reason": 5}, VALIDATE) == [
        "$.ok: 'yes' is not of type 'boolean'",
        "$.reason: 5 is not of type 'string'",
    ]
    email = {"type": "string", "format": "email"}
    assert schema_errors("a@b.example", email) == []
    assert schema_errors("not an email", email) != []  # format checking is on
    one_of = {"oneOf": [{"type": "integer"}, {"type": "string"}]}  # the old subset ignored it
    assert schema_errors(1.5, one_of) != []
    ref = {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}}
    assert schema_errors({"x": "1"}, ref) == ["$.x: '1' is not of type 'integer'"]


def test_bad_schema_is_refused_in_config() -> None:
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        check_schema({"type": "objekt"})
    with pytest.raises(ConfigError, match=r"steps\.validate\.json_schema"):
        config_from_dict({"steps": {"validate": {"json_schema": {"type": 5}}}})


def test_answer_problem() -> None:
    assert answer_problem('{"ok": true, "reason": "x"}', VALIDATE) is None
    assert answer_problem("nope", VALIDATE) == "the answer is not a JSON object"
    problem = answer_problem('{"ok": "yes", "reason": 5}', VALIDATE)
    assert problem is not None and problem.startswith("the answer breaks its JSON Schema: $.ok")


async def test_answer_breaking_its_schema_fails_as_invalid_answer(store) -> None:
    """the server answered {"ok": "yes", "reason": 5} to a schema requiring
    {"ok": boolean, "reason": string}; it was logged ok with that verdict."""
    cfg = config_from_dict({"steps": {"validate": {"json_schema": VALIDATE}}})
    fake = FakeProvider(name="local", script=reply_by_step({
        "validate": FakeReply('{"ok": "yes", "reason": 5}', ttft_s=0.001),
    }))  # fmt: skip
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("a rain jacket?")
    step = next(s for s in store.steps(done.run_id) if s.step == "validate")
    assert step.status == "failed_open"
    assert step.error_type == "invalid_answer"
    # the broken verdict is not taken as one: it is a missing verdict, with its reason
    assert done.verdicts["validate"]["ok"] is None
    assert done.verdicts["validate"]["missing"] == "unparseable"
    call = next(c for c in store.calls(done.run_id) if c.step == "validate")
    assert call.output == '{"ok": "yes", "reason": 5}'


# -- read_jsonl ----------------------------------------------------------------------------


def _file(tmp_path: Path, data: bytes, name: str = "f.jsonl") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_read_jsonl_bom_blank_lines_and_numbers(tmp_path: Path) -> None:
    p = _file(tmp_path, b'\xef\xbb\xbf{"a": 1}\n\n  \r\n{"a": 2}\r\n')
    assert list(read_jsonl(p)) == [(1, {"a": 1}), (4, {"a": 2})]


@pytest.mark.parametrize(
    ("data", "line", "fragment"),
    [
        (b'{"a": 1}\n{"a": \n', 2, "not valid JSON (Expecting value, column 7)"),
        (b'{"a": 1}\n[1]\n', 2, "expected a JSON object, got an array"),
        (b'{"a": 1}\n{"a": "\xff"}\n', 2, "not UTF-8 text"),
        (b'{"a": 1}\n' + b"[" * 100_000 + b"\n", 2, "not valid JSON"),
        (b'{"a": 1}\n\xef\xbb\xbf{"a": 2}\n', 2, "not valid JSON"),  # a BOM mid-file is wrong
    ],
    ids=["bad-json", "not-object", "not-utf8", "deep", "bom-mid-file"],
)
def test_read_jsonl_errors_name_file_and_line(
    tmp_path: Path, data: bytes, line: int, fragment: str
) -> None:
    p = _file(tmp_path, data)
    with pytest.raises(InputFileError) as err:
        list(read_jsonl(p, "replay set"))
    assert err.value.line == line and fragment in err.value.problem
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{p}:{line}: ")


def test_read_jsonl_limits(tmp_path: Path) -> None:
    huge_line = b'{"message": "' + b"x" * (10 * 1024 * 1024) + b'"}\n'
    p = _file(tmp_path, b'{"a": 1}\n' + huge_line)
    with pytest.raises(InputFileError, match=r":2: line longer than 1\.0 MiB"):
        list(read_jsonl(p))
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:  # a sparse 1 GiB file: refused before any byte is read
        f.truncate(1 << 30)
    with pytest.raises(InputFileError, match=r"replay set is 1\.0 GiB; the limit is 100\.0 MiB"):
        list(read_jsonl(big, "replay set"))
    ok = _file(tmp_path, b'{"m": "' + b"y" * (MAX_LINE_BYTES - 20) + b'"}\n', "ok.jsonl")
    assert len(list(read_jsonl(ok))) == 1
    with pytest.raises(InputFileError, match="cannot read query file"):
        list(read_jsonl(tmp_path / "absent.jsonl", "query file"))


def test_every_jsonl_user_shares_the_error_style(tmp_path: Path) -> None:
    """Replay sets, eval sets, catalogues and labelled queries: same reader, same line."""
    bad = _file(tmp_path, b"\xef\xbb\xbf\n{oops\n")
    for load in (load_requests, load_cases, read_catalog, load_queries):
        with pytest.raises(InputFileError) as err:
            load(bad)
        assert str(err.value) == (
            f"{bad}:2: not valid JSON (Expecting property name enclosed in double quotes, "
            "column 2)"
        ), load
    good = _file(tmp_path, b'\xef\xbb\xbf{"id": "a", "message": "hi"}\n', "r.jsonl")
    assert [r.id for r in load_requests(good)] == ["a"]
    q = _file(tmp_path, b'\xef\xbb\xbf{"query": "q", "expected": ["A"]}\n', "q.jsonl")
    assert load_queries(q)[0].expected == ("A",)
