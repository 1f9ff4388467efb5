"""Eval assertions (each type passes and fails), case files, scoring into eval_results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from chainrun.classify.base import DEFAULT_LABELS
from chainrun.config import STEP_NAMES_DEFAULT
from chainrun.errors import InputFileError, UserInputError
from chainrun.evals import (
    ASSERTION_TYPES,
    EvalCase,
    GraderConfig,
    TurnView,
    eval_request_id,
    flip_rate,
    load_cases,
    load_results,
    parse_assertion,
    parse_case,
    score_run,
    score_turn,
    turn_view,
)
from chainrun.evals.assertions import LABEL, PROSE, evaluate, schema_errors
from chainrun.log.rows import CallRow, EvalResultRow, StepRow, TurnLog, TurnRow
from chainrun.log.store import Store

REPO = Path(__file__).resolve().parents[1]

VIEW = TurnView(
    message="A rain jacket under 100 euros?",
    answer="Try the Storm Shell (JKT-0142) at 89 euros: light and waterproof.",
    label="product_search",
    outputs={
        "classify": "product_search\n",
        "retrieve": '["JKT-0142", "JKT-0077"]',
        "compose": "Try the Storm Shell (JKT-0142) at 89 euros: light and waterproof.",
        "validate": '```json\n{"ok": true, "reason": "polite"}\n```',
        "critique": "Mention the colours.",
    },
    step_ms={"classify": 120.0, "compose": 2400.0, "validate": 300.0},
    turn_ms=3100.0,
    output_tokens={"classify": 2, "compose": 40, "validate": 12},
    catalog_ids=frozenset({"JKT-0142", "JKT-0077", "DRS-0001"}),
    grounding={"claims": 2, "ungrounded": []},
)

OK_SCHEMA = {
    "type": "object",
    "required": ["ok", "reason"],
    "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string"}},
}

# (assertion, passes on VIEW)
CASES: list[tuple[dict[str, Any], bool]] = [
    ({"type": "equals", "step": "label", "value": "product_search"}, True),
    ({"type": "equals", "step": "label", "value": "sizing"}, False),
    ({"type": "equals", "step": "classify", "value": "product_search"}, True),  # strip
    ({"type": "equals", "step": "classify", "value": "PRODUCT_SEARCH", "ignore_case": True}, True),
    ({"type": "equals", "step": "classify", "value": "PRODUCT_SEARCH"}, False),
    ({"type": "contains", "value": "Storm Shell"}, True),
    ({"type": "contains", "value": "storm shell"}, False),
    ({"type": "icontains", "value": "storm shell"}, True),
    ({"type": "icontains", "value": "parka"}, False),
    ({"type": "not-contains", "value": "parka"}, True),
    ({"type": "not-contains", "value": "Storm"}, False),
    ({"type": "not-icontains", "value": "PARKA"}, True),
    ({"type": "not-icontains", "value": "STORM"}, False),
    ({"type": "regex", "value": r"\b\d+ euros\b"}, True),
    ({"type": "regex", "value": r"^try", "flags": "i"}, True),
    ({"type": "regex", "value": r"^try"}, False),
    ({"type": "is-json", "step": "validate"}, True),  # one code fence allowed
    ({"type": "is-json", "step": "validate", "value": OK_SCHEMA}, True),
    ({"type": "is-json"}, False),
    ({"type": "is-json", "step": "validate", "value": {"required": ["score"]}}, False),
    ({"type": "contains-json", "step": "validate"}, True),
    ({"type": "contains-json", "step": "validate", "value": {"required": ["ok"]}}, True),
    ({"type": "contains-json", "step": "critique"}, False),
    ({"type": "contains-json", "step": "validate", "value": {"required": ["nope"]}}, False),
    ({"type": "json-schema", "step": "validate", "value": OK_SCHEMA}, True),
    (
        {
            "type": "json-schema",
            "step": "validate",
            "value": {"type": "object", "properties": {"ok": {"const": False}}},
        },
        False,
    ),
    ({"type": "json-schema", "step": "critique", "value": OK_SCHEMA}, False),
    ({"type": "catalog-ids"}, True),
    ({"type": "catalog-ids", "ids": ["DRS-0001"]}, False),
    ({"type": "catalog-ids", "within": "retrieved", "min_ids": 1}, True),
    ({"type": "catalog-ids", "min_ids": 2}, False),
    ({"type": "grounded"}, True),  # its failing case: tests/test_grounding.py
    ({"type": "latency", "threshold": 5000}, True),
    ({"type": "latency", "threshold": 3000}, False),
    ({"type": "latency", "step": "classify", "threshold": 200}, True),
    ({"type": "latency", "step": "compose", "threshold": 2000}, False),
    ({"type": "max-tokens", "step": "compose", "threshold": 40}, True),
    ({"type": "max-tokens", "step": "compose", "threshold": 39}, False),
    ({"type": "max-tokens", "threshold": 54}, True),  # whole turn: 2 + 40 + 12
    ({"type": "max-tokens", "threshold": 53}, False),
]


@pytest.mark.parametrize(("data", "passes"), CASES, ids=[f"{c['type']}-{p}" for c, p in CASES])
def test_assertion_pass_and_fail(data: dict[str, Any], passes: bool) -> None:
    a = parse_assertion(data)
    v = a.check(VIEW)
    assert v.passed is passes, v.detail
    assert v.type == data["type"] and v.step == data.get("step")
    assert v.detail


def test_every_type_is_covered_pass_and_fail() -> None:
    seen = {(c["type"], p) for c, p in CASES} | {("llm-rubric", True), ("llm-rubric", False)}
    seen |= {("grounded", False)}  # tests/test_grounding.py: an ungrounded price fails it
    # tests/test_eval_gate.py: tool-called on a turn's tool calls, passing and failing
    seen |= {("tool-called", True), ("tool-called", False)}
    # tests/test_answer_facts.py: the marks of a usable answer, passing and failing
    seen |= {(t, p) for t in ("names-product", "no-repeat", "whole-sentences")
             for p in (True, False)}
    assert seen == {(t, p) for t in ASSERTION_TYPES for p in (True, False)}


def test_catalog_ids_finds_invented_products() -> None:
    view = TurnView(message="m", answer="Try ZZZ-99999 or JKT-0142.", catalog_ids=VIEW.catalog_ids)
    v = parse_assertion({"type": "catalog-ids"}).check(view)
    assert not v.passed and "ZZZ-99999" in v.detail
    order = TurnView(
        message="m", answer="Order FS-10293 ships JKT-0142.", catalog_ids=VIEW.catalog_ids
    )
    assert parse_assertion({"type": "catalog-ids"}).check(order).passed  # an order id is no product
    no_catalogue = parse_assertion({"type": "catalog-ids"}).check(TurnView(message="m", answer="x"))
    assert not no_catalogue.passed and "catalogue" in no_catalogue.detail


def test_missing_step_output_and_unknown_usage_fail() -> None:
    view = TurnView(message="m", answer=None, output_tokens={"compose": None})
    assert not parse_assertion({"type": "contains", "value": "x"}).check(view).passed
    v = parse_assertion({"type": "max-tokens", "step": "compose", "threshold": 9}).check(view)
    assert not v.passed and "unknown" in v.detail
    v = parse_assertion({"type": "latency", "step": "compose", "threshold": 9}).check(view)
    assert not v.passed and "no duration" in v.detail


@pytest.mark.parametrize(
    "data",
    [
        {"type": "nope", "value": "x"},
        {"type": "contains"},
        {"type": "contains", "value": "x", "extra": 1},
        {"type": "regex", "value": "("},
        {"type": "regex", "value": "x", "flags": "q"},
        {"type": "json-schema", "value": {"type": "object", "properties": 5}},
        {"type": "json-schema", "value": {"type": "thing"}},
        {"type": "latency", "threshold": 0},
    ],
)
def test_bad_assertions_are_rejected(data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse_assertion(data)


def test_schema_errors_name_the_json_path() -> None:
    schema = {
        "type": "object",
        "required": ["ok"],
        "additionalProperties": False,
        "properties": {
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
            "n": {"type": "integer", "minimum": 1},
            "kind": {"enum": ["a", "b"]},
            "any": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    }
    assert (
        schema_errors({"ok": True, "tags": ["ab"], "n": 2, "kind": "a", "any": None}, schema) == []
    )
    errs = schema_errors({"ok": 1, "tags": ["abcd", "x", "y"], "n": 0, "z": 1}, schema)
    assert any("$.ok" in e for e in errs)
    assert any("$.tags[0]" in e for e in errs)
    assert any("is too long" in e and e.startswith("$.tags:") for e in errs)  # maxItems
    assert any("less than the minimum of 1" in e for e in errs)
    assert any("'z' was unexpected" in e for e in errs)
    assert schema_errors(True, {"type": "integer"}) != []  # a boolean is no integer


# -- llm-rubric -------------------------------------------------------------------------


async def test_llm_rubric_with_injected_grader() -> None:
    prompts: list[str] = []

    def grader_replying(reply: str) -> Any:
        async def grade(prompt: str) -> str:
            prompts.append(prompt)
            return reply

        return grade

    a = parse_assertion({"type": "llm-rubric", "value": "Recommends a jacket under budget."})
    config = GraderConfig(model="gemma-3-270m", seed=7)
    ok = await evaluate(a, VIEW, grader_replying('{"pass": true, "reason": "fits"}'), config)
    assert ok is not None and ok.passed and ok.detail == "fits"
    assert ok.grader == {**config.model_dump(), "temperature": 0.0}
    assert "Recommends a jacket under budget." in prompts[0] and VIEW.answer in prompts[0]
    bad = await evaluate(a, VIEW, grader_replying('Sure! {"pass": false, "reason": "no price"}'))
    assert bad is not None and not bad.passed and bad.detail == "no price"
    word = await evaluate(a, VIEW, grader_replying("Yes, it does."))
    assert word is not None and word.passed
    # the grader failed, not the answer: skipped (no verdict), saying why and how to fix it
    garbage = await evaluate(a, VIEW, grader_replying("the sky is blue"))
    assert garbage.skipped and garbage.passed is None
    assert "gave no pass/fail" in garbage.detail and "[grader]" in garbage.detail
    none = await evaluate(a, VIEW, None)
    assert none.skipped and "no grader configured" in none.detail and "[grader]" in none.detail
    with pytest.raises(TypeError):
        a.check(VIEW)
    with pytest.raises(ValidationError):
        GraderConfig(temperature=0.7)


# -- case files ----------------------------------------------------------------------------


def test_regression_file_loads_and_fits_the_default_chain() -> None:
    cases = load_cases(REPO / "evals" / "regression.jsonl")
    assert 45 <= len(cases) <= 70
    assert len({c.id for c in cases}) == len(cases)
    targets = {*STEP_NAMES_DEFAULT, LABEL, PROSE, None}
    types = set()
    for case in cases:
        for a in case.asserts:
            types.add(a.type)
            assert a.step in targets, (case.id, a.step)
            if a.type == "equals" and a.step == LABEL:
                assert a.value in DEFAULT_LABELS, case.id  # type: ignore[union-attr]
    assert {"equals", "regex", "catalog-ids", "json-schema", "latency", "max-tokens"} <= types
    assert any("injection" in c.tags for c in cases)
    # every case with an answer to read says what a usable one holds: the marks of the
    # answer (a product, a policy fact, the prose's subject) and never a repeated sentence
    # or a check's text mid-sentence
    usable = [c for c in cases if "usable" in c.tags]
    assert len(usable) >= 40
    for case in usable:
        kinds = {(a.type, a.step) for a in case.asserts}
        assert {("no-repeat", PROSE), ("whole-sentences", None)} <= kinds, case.id
        assert kinds & {("names-product", None), ("regex", None), ("regex", PROSE)}, case.id


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "cases.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


GOOD = json.dumps({"id": "a", "message": "hi", "assert": [{"type": "contains", "value": "x"}]})


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"id": "b", "message": "hi", "assert": [', "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"id": "b", "message": "hi"}', "assert"),
        ('{"id": "b", "message": "hi", "assert": []}', "assert"),
        ('{"id": "b", "message": "hi", "assert": [{"type": "contain", "value": "x"}]}', "assert"),
        ('{"id": "b", "message": "hi", "asert": [{"type": "contains", "value": "x"}]}', "asert"),
        (GOOD, "duplicate case id 'a' (first on line 1)"),
    ],
)
def test_bad_eval_line_names_the_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    path = _write(tmp_path, [GOOD, "", bad_line])
    with pytest.raises(InputFileError) as err:
        load_cases(path)
    assert err.value.line == 3
    assert problem in err.value.problem
    assert f"{path}:3:" in str(err.value)


def test_missing_and_empty_eval_files(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot read"):
        load_cases(tmp_path / "nope.jsonl")
    with pytest.raises(InputFileError, match="no eval cases"):
        load_cases(_write(tmp_path, ["", "  "]))


def test_case_context_is_parsed() -> None:
    case = parse_case(
        {
            "id": "o1",
            "message": "where is my order?",
            "context": {"filters": {"max_price": 100}, "order_state": {"status": "shipped"}},
            "assert": [{"type": "equals", "step": "label", "value": "order_status"}],
        }
    )
    assert case.context is not None and case.context.order_state == {"status": "shipped"}


# -- scoring -------------------------------------------------------------------------------


def _case(case_id: str, message: str, *asserts: dict[str, Any]) -> EvalCase:
    return parse_case({"id": case_id, "message": message, "assert": list(asserts)})


def _turn(case_id: str, repeat: int, answer: str, tokens: int | None = 30) -> TurnLog:
    t = TurnLog(
        TurnRow(
            input=f"message of {case_id}",
            request_id=eval_request_id(case_id, repeat),
            output=answer,
            label="sizing",
            duration_ms=1000.0,
        )
    )
    t.steps = [
        StepRow(step="classify", duration_ms=100.0, output="sizing"),
        StepRow(step="compose", duration_ms=800.0, output=answer),
        StepRow(step="critique", status="skipped"),
    ]
    t.calls = [
        CallRow(step="compose", attempt=1, outcome="cancelled", output_tokens=99),
        CallRow(step="compose", attempt=2, outcome="duplicate", output_tokens=tokens),
    ]
    return t


def test_turn_view_uses_the_winning_attempt_and_ignores_skipped_steps() -> None:
    with Store.open(":memory:") as s:
        run = s.create_run("eval", "{}")
        s.log_turn(run, _turn("c1", 0, "hello"))
        view = turn_view(s.turns(run)[0], s.steps(run), s.calls(run))
    assert view.output_tokens == {"compose": 30}
    assert view.step_ms["critique"] is None and view.step_ms["compose"] == 800.0
    assert view.label == "sizing" and view.answer == "hello"


async def test_score_turn_from_rows() -> None:
    case = _case(
        "c1",
        "m",
        {"type": "equals", "step": "label", "value": "sizing"},
        {"type": "max-tokens", "step": "compose", "threshold": 20},
        {"type": "llm-rubric", "value": "polite"},
    )
    with Store.open(":memory:") as s:
        run = s.create_run("eval", "{}")
        s.log_turn(run, _turn("c1", 0, "hello"))
        verdicts = await score_turn(s.turns(run)[0], s.steps(run), s.calls(run), case)
    assert [(v.type, v.passed) for v in verdicts] == [
        ("equals", True), ("max-tokens", False), ("llm-rubric", None),
    ]  # fmt: skip


async def test_score_run_stores_verdicts_and_summarises() -> None:
    cases = [
        _case("c1", "message of c1", {"type": "icontains", "value": "size"},
              {"type": "max-tokens", "step": "compose", "threshold": 50}),
        _case("c2", "message of c2", {"type": "icontains", "value": "size"},
              {"type": "llm-rubric", "value": "helpful"}),
    ]  # fmt: skip
    with Store.open(":memory:") as s:
        run = s.create_run("eval", "{}")
        for rep in range(3):
            s.log_turn(run, _turn("c1", rep, "Take a size M."))
            s.log_turn(run, _turn("c2", rep, "Size up." if rep != 1 else "No idea."))
        s.log_turn(run, TurnLog(TurnRow(input="stray", request_id="not-a-case#0")))
        result = await score_run(s, run, cases)
        assert result["n_turns"] == 7 and result["unmatched_turns"] == 1
        assert result["skipped"] == {
            "llm-rubric": {"n": 3, "reason": result["skipped"]["llm-rubric"]["reason"]}
        }
        assert "no grader configured" in result["skipped"]["llm-rubric"]["reason"]
        assert result["n_verdicts"] == 9  # skipped verdicts count in no rate
        assert result["by_type"]["icontains"] == {
            "n": 6, "passed": 5, "pass_rate": 0.8333,
            "pass_rate_ci": result["by_type"]["icontains"]["pass_rate_ci"],
        }  # fmt: skip
        assert result["by_step"]["compose"]["n"] == 3 and result["by_step"]["turn"]["n"] == 6
        assert result["cases"]["n"] == 2 and result["cases"]["passed"] == 2  # c2: 2 of 3 repeats
        assert result["flip"] == {
            "n_cases": 2, "flipped": 1, "flip_rate": 0.5, "cases": ["c2"],
            "assertions": {"n": 3, "flipped": 1, "flip_rate": 0.3333,
                           "flipped_assertions": ["c2: icontains on turn"]},
        }  # fmt: skip
        rows = load_results(s, [run])  # skipped verdicts are stored, passed NULL
        assert len(rows) == 12 and {r.repeat for r in rows} == {0, 1, 2}
        assert all(r.grader is None for r in rows)
        assert [r.passed for r in rows if r.type == "llm-rubric"] == [None] * 3

        async def grade(prompt: str) -> str:
            return '{"pass": false, "reason": "meh"}'

        again = await score_run(s, run, cases, grade)  # re-scoring replaces the rows
        assert again["n_verdicts"] == 12 and again["skipped"] == {}
        rows = load_results(s, [run])
        assert len(rows) == 12
        rubric = [r for r in rows if r.type == "llm-rubric"]
        assert rubric and json.loads(rubric[0].grader or "{}")["temperature"] == 0.0
        assert again["cases"]["passed"] == 1


async def test_score_run_unknown_run_and_migration() -> None:
    with Store.open(":memory:") as s:
        assert "eval_results" in s.db.table_names()
        names = {r["name"] for r in s.db["_migrations"].rows}
        assert "020_eval_results" in names
        with pytest.raises(UserInputError, match="no such run"):
            await score_run(s, 99, [])


async def test_turns_without_request_id_match_by_message() -> None:
    cases = [_case("c1", "hello there", {"type": "icontains", "value": "hi"})]
    with Store.open(":memory:") as s:
        run = s.create_run("eval", "{}")
        s.log_turn(run, TurnLog(TurnRow(input="hello there", output="hi!")))
        s.log_turn(run, TurnLog(TurnRow(input="hello there", output="bye")))
        result = await score_run(s, run, cases)
        assert result["flip"]["flipped"] == 1
        assert {r.repeat for r in load_results(s, [run])} == {0, 1}


def test_flip_rate_needs_repeats() -> None:
    rows = [EvalResultRow(case_id="a", repeat=0, type="equals", passed=True)]
    assert flip_rate(rows) == {
        "n_cases": 0, "flipped": 0, "flip_rate": None, "cases": [],
        "assertions": {"n": 0, "flipped": 0, "flip_rate": None, "flipped_assertions": []},
    }  # fmt: skip


def test_flips_per_assertion() -> None:
    def row(turn: int, rep: int, type_: str, passed: int | None) -> EvalResultRow:
        return EvalResultRow(turn_id=turn, case_id="a", repeat=rep, type=type_, step=None,
                             passed=None if passed is None else bool(passed))  # fmt: skip

    # case a, 3 repeats, 3 assertions (two regexes on the answer): the case fails in each
    # repeat (no case flip) but the 2nd regex flips; a skipped verdict flips nothing
    rows = [
        row(1, 0, "regex", 0), row(1, 0, "regex", 1), row(1, 0, "llm-rubric", None),
        row(2, 1, "regex", 0), row(2, 1, "regex", 0), row(2, 1, "llm-rubric", 1),
        row(3, 2, "regex", 0), row(3, 2, "regex", 1), row(3, 2, "llm-rubric", 1),
    ]  # fmt: skip
    flips = flip_rate(rows)
    assert flips["flipped"] == 0 and flips["n_cases"] == 1
    assert flips["assertions"] == {
        "n": 3, "flipped": 1, "flip_rate": 0.3333, "flipped_assertions": ["a: regex on turn #2"],
    }  # fmt: skip


async def test_scoring_the_wrong_run_fails_before_the_grader_starts() -> None:
    """New user: ``eval --run N`` with an llm-rubric case started the grader (the local
    model, or a dead provider's error) before finding that no turn of run N matched."""
    from chainrun.config import config_from_dict
    from chainrun.evals.runner import score_existing

    cfg = config_from_dict({"providers": {"local": {"base_url": "http://127.0.0.1:9/v1"}}})
    cases = [_case("c1", "a rain jacket", {"type": "llm-rubric", "value": "Helpful."})]
    with Store.open(":memory:") as s:
        run = s.create_run("replay", "{}")
        s.log_turn(run, TurnLog(TurnRow(input="something else", output="hi")))
        with pytest.raises(UserInputError, match="none of its 1 turns matches a case"):
            await score_existing(s, run, cases, cfg, quiet=True)
