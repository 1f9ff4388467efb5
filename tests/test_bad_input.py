"""Bad input, property-based (hypothesis): every malformed config file, replay set, eval
set or catalogue file gives one line naming the file (and line or field), exit 2 from
the CLI, and writes nothing. Usage errors are one line too."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from chainrun.cli import app
from chainrun.config import load_config
from chainrun.errors import UserInputError
from chainrun.evals.cases import load_cases
from chainrun.replay.run import load_requests
from chainrun.retrieval.catalog import read_catalog

SETTINGS = settings(
    max_examples=40, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False),
    st.text(max_size=20),
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _records(fields: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with some of ``fields`` (each with a right or a wrong value) and extras."""
    return st.dictionaries(
        st.sampled_from([*fields, "extra", "Message", ""]),
        st.one_of(json_values, *(st.just(v) for v in fields.values())),
        max_size=len(fields) + 1,
    )


def _broken(text: str) -> st.SearchStrategy[str]:
    """``text`` cut short or with a character replaced: rarely valid JSON."""
    return st.one_of(
        st.integers(0, max(0, len(text) - 1)).map(lambda i: text[:i]),
        st.tuples(st.integers(0, max(0, len(text) - 1)), st.sampled_from('{}[]",:x\\'))
        .map(lambda t: text[: t[0]] + t[1] + text[t[0] + 1 :]),
    )  # fmt: skip


def jsonl_lines(fields: dict[str, Any]) -> st.SearchStrategy[list[str]]:
    good = json.dumps(fields)
    line = st.one_of(
        _records(fields).map(json.dumps),
        json_values.map(json.dumps),
        _broken(good),
        st.text(alphabet=string.printable, max_size=30).map(lambda s: s.replace("\n", " ")),
        st.just(""),
        st.just("\ufeff" + good),  # a BOM where none belongs (not on line 1)
    )
    return st.lists(line, min_size=1, max_size=6)


def _write(tmp: Path, name: str, data: str | bytes) -> Path:
    p = tmp / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data, encoding="utf-8")
    return p


def one_line(err: BaseException, path: Path) -> None:
    text = str(err)
    assert "\n" not in text and text.startswith(str(path)), text
    assert "Traceback" not in text


# -- the loaders: either valid or one clear line ----------------------------------------


@SETTINGS
@given(lines=jsonl_lines({"id": "a1", "message": "a rain jacket?", "original_ms": 812.5}))
def test_replay_sets(tmp_path: Path, lines: list[str]) -> None:
    p = _write(tmp_path, "replay.jsonl", "\n".join(lines))
    try:
        requests = load_requests(p)
    except UserInputError as e:
        one_line(e, p)
    else:
        assert requests and all(r.message.strip() for r in requests)


@SETTINGS
@given(lines=jsonl_lines({"id": "c1", "message": "hi",
                          "assert": [{"type": "contains", "value": "x"}]}))  # fmt: skip
def test_eval_sets(tmp_path: Path, lines: list[str]) -> None:
    p = _write(tmp_path, "cases.jsonl", "\n".join(lines))
    try:
        cases = load_cases(p)
    except UserInputError as e:
        one_line(e, p)
    else:
        assert cases


@SETTINGS
@given(lines=jsonl_lines({"id": "JKT-001", "title": "Storm shell", "category": "jackets",
                          "price": 89.0, "sizes": {"M": 2}}))  # fmt: skip
def test_catalogue_files(tmp_path: Path, lines: list[str]) -> None:
    p = _write(tmp_path, "catalog.jsonl", "\n".join(lines))
    try:
        products = read_catalog(p)
    except UserInputError as e:
        one_line(e, p)
    else:
        assert products


toml_values = st.one_of(
    st.integers(-5, 10**6).map(str), st.floats(-1, 1e6, allow_nan=False).map(repr),
    st.sampled_from(['"x"', '"p95"', "true", "[]", '["local"]', '"closed"', "{}", "-1", '"']),
)  # fmt: skip
toml_keys = st.sampled_from([
    "order", "answer_step", "providers.local.base_url", "providers.local.api_key_env",
    "steps.compose.deadline_s", "steps.compose.provider", "steps.compose.on_failure",
    "steps.compose.max_output_tokens", "steps.compose.prompt", "steps.compose.json_schema",
    "steps.classify.hedge.delay", "steps.classify.hedge.max_attempts",
    "steps.compose.first_token_timeout_s", "log.redact", "steps.compse.model", "bogus",
])  # fmt: skip


@SETTINGS
@given(pairs=st.lists(st.tuples(toml_keys, toml_values), min_size=1, max_size=4),
       junk=st.sampled_from(["", "[[", "= 1", "[steps.compose]\nmodel =", "\x00"]))  # fmt: skip
def test_config_files(tmp_path: Path, pairs: list[tuple[str, str]], junk: str) -> None:
    text = "\n".join(f"{k} = {v}" for k, v in pairs) + "\n" + junk
    p = _write(tmp_path, "chainrun.toml", text)
    try:
        load_config(p)
    except UserInputError as e:
        one_line(e, p)


# -- the CLI: exit 2, one line, nothing written ------------------------------------------

runner = CliRunner()


def _cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


def _error_lines(result: Any) -> list[str]:
    return [ln for ln in result.output.splitlines() if ln.strip()]


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.binary(max_size=200))
def test_cli_replay_with_any_bytes_exits_2_and_writes_nothing(
    tmp_path: Path, data: bytes
) -> None:
    p = _write(tmp_path, "r.jsonl", data)
    db = tmp_path / "never.db"
    try:
        load_requests(p)
    except UserInputError:
        result = _cli("replay", str(p), "--db", str(db))
        assert result.exit_code == 2, result.output
        lines = _error_lines(result)
        assert len(lines) == 1 and str(p) in lines[0] and "error" in lines[0], lines
        assert not db.exists()
    else:
        pytest.skip("valid by chance")  # pragma: no cover


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["eval", "{file}", "--db", "{db}"], "cases.jsonl"),
        (["catalog", "load", "{file}", "--db", "{db}"], "catalog.jsonl"),
        (["replay", "{file}", "--db", "{db}"], "r.jsonl"),
        (["replay", "{ok}", "--config", "{file}", "--db", "{db}"], "chainrun.toml"),
    ],
)
def test_cli_bad_files_exit_2_and_write_nothing(
    tmp_path: Path, args: list[str], name: str
) -> None:
    bad = _write(tmp_path, name, '{"id": 1,\n' if name.endswith("jsonl") else "order = [\n")
    ok = _write(tmp_path, "ok.jsonl", '{"id": "a", "message": "hi"}\n')
    db = tmp_path / "never.db"
    argv = [a.format(file=bad, db=db, ok=ok) for a in args]
    result = _cli(*argv)
    assert result.exit_code == 2, result.output
    lines = _error_lines(result)
    assert len(lines) == 1 and str(bad) in lines[0], lines
    assert not db.exists()


@pytest.mark.parametrize(
    ("key", "said"),
    [("extra", "unknown field 'extra'; expected id, message, conversation_id, turn, "
      "history, original_ms, expect, user"),
     ("conversationId", "unknown field 'conversationId' (did you mean 'conversation_id'?); "
      "expected id, message, conversation_id, turn, history, original_ms, expect, user")],
)  # fmt: skip
def test_cli_replay_refuses_an_unknown_field_naming_it(
    tmp_path: Path, key: str, said: str
) -> None:
    """A replay line's unknown key used to be dropped: the run went ahead without it (a
    misspelled conversation id ran the turn alone, exit 0)."""
    p = _write(tmp_path, "r.jsonl", '{"id": "a", "message": "hi"}\n'
               f'{{"id": "b", "message": "hi", "{key}": 1}}\n')  # fmt: skip
    db = tmp_path / "never.db"
    result = _cli("replay", str(p), "--db", str(db))
    assert result.exit_code == 2, result.output
    assert _error_lines(result) == [f"chainrun: error: {p}:2: {said}"]
    assert not db.exists()


@pytest.mark.parametrize("value", ["-3", "NaN", '"812"', "true"])
def test_cli_replay_refuses_an_original_latency_that_is_no_duration(
    tmp_path: Path, value: str
) -> None:
    p = _write(tmp_path, "r.jsonl", f'{{"id": "a", "message": "hi", "original_ms": {value}}}\n')
    db = tmp_path / "never.db"
    result = _cli("replay", str(p), "--db", str(db))
    assert result.exit_code == 2, result.output
    (line,) = _error_lines(result)
    assert line.startswith(f"chainrun: error: {p}:1: field 'original_ms' must be a number of ms")
    assert not db.exists()


_PRODUCT = '"title": "Rain shell", "category": "rainwear"'


@pytest.mark.parametrize(
    ("fields", "said"),
    [('"price": true', "price: expected a number, got true"),
     # a string price is read as the shop writes it (its catalogue's locale): "10" is 10
     ('"price": "ten"', "price: expected an amount such as 1299.00, got 'ten'"),
     ('"price": 10, "stock": true', "stock: expected a whole number, got true"),
     ('"price": 10, "sizes": {"S": true}', "sizes.S: expected a whole number, got true"),
     ('"price": 10, "stock": "3"', 'stock: expected a whole number, got "3"')],
)  # fmt: skip
def test_cli_catalog_jsonl_refuses_a_value_of_the_wrong_type(
    tmp_path: Path, fields: str, said: str
) -> None:
    """JSON booleans used to load as 1 (price EUR 1.00, stock 1); a string price that is
    no amount is refused; the catalogue already loaded stays as it was."""
    db = tmp_path / "shop.db"
    good = _write(tmp_path, "good.csv", "id,title,category,price\nSC-1,Wool scarf,scarves,30\n")
    assert _cli("catalog", "load", str(good), "--db", str(db)).exit_code == 0
    bad = _write(tmp_path, "c.jsonl", f'{{"id": "RW-1", {_PRODUCT}, "price": 5}}\n'
                 f'{{"id": "RW-2", {_PRODUCT}, {fields}}}\n')  # fmt: skip
    result = _cli("catalog", "load", str(bad), "--db", str(db))
    assert result.exit_code == 2, result.output
    assert _error_lines(result) == [f"chainrun: error: {bad}:2: {said}"]
    conn = sqlite_utils.Database(db)
    try:
        assert [r["id"] for r in conn.query("select id from products")] == ["SC-1"]
    finally:
        conn.close()


def test_cli_catalog_csv_cells_are_text_and_parsed(tmp_path: Path) -> None:
    """The same values as CSV text load: a CSV cell has no type of its own."""
    db = tmp_path / "shop.db"
    csv = _write(tmp_path, "c.csv", "id,title,category,price,stock,sizes\n"
                 "RW-9,Rain shell,rainwear,10,3,S:1;M:2\n")  # fmt: skip
    assert _cli("catalog", "load", str(csv), "--db", str(db)).exit_code == 0
    conn = sqlite_utils.Database(db)
    try:
        row = next(iter(conn.query("select price, stock, sizes from products")))
    finally:
        conn.close()
    assert row["price"] == 10.0 and row["stock"] == 3
    assert json.loads(row["sizes"]) == {"S": 1, "M": 2}


@pytest.mark.parametrize(
    "argv",
    [["replay"], ["show"], ["replay", "x.jsonl", "--concurrency", "0"], ["runs", "--bogus"],
     ["compare", "1"]],
)
def test_usage_errors_are_one_line_not_a_box(argv: list[str]) -> None:
    result = _cli(*argv)
    assert result.exit_code == 2
    lines = _error_lines(result)
    assert len(lines) == 1, lines
    assert lines[0].startswith("chainrun") and "error" in lines[0]
    assert not any(ch in result.output for ch in "╭│╰")


def test_oversized_inputs_hit_documented_limits(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:
        f.truncate(1 << 30)  # a 1 GiB replay file (sparse)
    result = _cli("replay", str(big), "--db", str(tmp_path / "x.db"))
    assert result.exit_code == 2
    assert "replay set is 1.0 GiB; the limit is 100.0 MiB" in result.output
    huge = _write(tmp_path, "huge.jsonl",
                  json.dumps({"id": "a", "message": "x" * (10 * 1024 * 1024)}) + "\n")
    result = _cli("replay", str(huge), "--db", str(tmp_path / "x.db"))
    assert result.exit_code == 2 and f"{huge}:1: line longer than 1.0 MiB" in result.output
    assert not (tmp_path / "x.db").exists()


def test_a_control_character_in_an_assertion_type_keeps_the_error_one_line() -> None:
    """Hypothesis found it: an assertion type "conta\\ns" (a newline inside the quoted
    value) made pydantic's message two lines."""
    from chainrun.evals.cases import parse_case

    case = {"id": "c1", "message": "hi", "assert": [{"type": "conta\ns", "value": "x"}]}
    with pytest.raises(UserInputError) as e:
        parse_case(case, "cases.jsonl", 1)
    assert "\n" not in str(e.value) and "conta\\ns" in str(e.value)
