"""``compare``: latency percentiles with honest intervals, the LLM split, paired evals."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from log_backends import BACKENDS, open_log

from chainrun.analysis.compare import (
    MinEffect,
    compare,
    parse_live_window,
    parse_min_effect,
    regression,
)
from chainrun.errors import UserInputError
from chainrun.evals import eval_request_id, parse_case, score_run
from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow
from chainrun.log.store import Store


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """These tests run on both log backends (SQLite in memory, a PostgreSQL schema)."""
    with open_log(request.param) as s:
        yield s


#: per turn i: (TTFT ms, completion tokens or None, ms between chunks)
Profile = Callable[[int], tuple[float, int | None, float]]


def base(i: int) -> tuple[float, int | None, float]:
    return 200.0 + (i * 37) % 50, 45 + i % 11, 15.0 + (i % 5) * 0.5


def more_tokens(i: int) -> tuple[float, int | None, float]:
    ttft, tokens, gap = base(i)
    assert tokens is not None
    return ttft, tokens + 20, gap  # median 50 -> 70: +40%


def served_slower(i: int) -> tuple[float, int | None, float]:
    ttft, tokens, gap = base(i)
    return ttft + 400.0, tokens, gap


def make_run(
    store: Store,
    n: int,
    profile: Profile = base,
    *,
    kind: str = "eval",
    started_at: Callable[[int], str] | None = None,
    original_ms: Callable[[int], float] | None = None,
    answers: Callable[[int], str] | None = None,
    request_ids: Callable[[int], str] | None = None,
) -> int:
    """A run of ``n`` turns: classify (LLM), retrieve, compose (LLM, streamed)."""
    run = store.create_run(kind, "{}", label=f"{n} turns")  # type: ignore[arg-type]
    for i in range(n):
        ttft, tokens, gap = profile(i)
        compose_ms = ttft + (tokens or 50) * gap
        classify_ms = 80.0 + (i * 13) % 40
        turn = TurnLog(
            TurnRow(
                input=f"message {i}",
                output=answers(i) if answers else "Try the Storm Shell.",
                request_id=request_ids(i) if request_ids else None,
                label="product_search",
                started_at=started_at(i) if started_at else None,
                duration_ms=classify_ms + 5.0 + compose_ms,
                original_ms=original_ms(i) if original_ms else None,
            )
        )
        turn.steps = [
            StepRow(step="classify", duration_ms=classify_ms, output="product_search"),
            StepRow(step="retrieve", kind="retrieve", duration_ms=5.0, output="[]"),
            StepRow(step="compose", duration_ms=compose_ms, output=turn.turn.output),
        ]
        turn.calls = [
            CallRow(step="classify", ttft_ms=classify_ms, output_tokens=2),
            CallRow(
                step="compose",
                attempt=1,
                outcome="cancelled",  # a loser: must never count
                ttft_ms=9999.0,
                output_tokens=999,
                chunk_gaps_ms=[999.0],
            ),
            CallRow(
                step="compose",
                attempt=2,
                outcome="duplicate",
                stream=True,
                ttft_ms=ttft,
                output_tokens=tokens,
                # the text chunks' gaps, then the usage chunk's: only the first are time
                # between tokens, as the timer logs it
                chunk_gaps_ms=[gap] * (tokens or 50) + [500.0],
                time_between_tokens_ms=gap,
            ),
        ]
        store.log_turn(run, turn)
    store.finish_run(run, "complete")
    return run


def test_12_turns_against_400_reports_n_and_null_intervals(store: Store) -> None:
    a, b = make_run(store, 12), make_run(store, 400)
    result = compare(store, str(a), str(b))
    assert result["a"]["n_turns"] == 12 and result["b"]["n_turns"] == 400
    assert list(result["metrics"]) == ["turn", "classify", "retrieve", "compose"]
    for name, m in result["metrics"].items():
        assert m["a"]["n"] == 12 and m["b"]["n"] == 400, name
        assert m["diff"]["n_a"] == 12 and m["diff"]["n_b"] == 400
        # 12 values bound the median but neither the p90 nor the p99
        assert m["a"]["p50_ci"] is not None
        assert m["a"]["p90_ci"] is None and m["a"]["p99_ci"] is None
        assert m["b"]["p90_ci"] is not None and m["b"]["p99_ci"] is not None  # n >= 368
        assert m["diff"]["p90_ci"] is None and m["diff"]["p99_ci"] is None
        assert m["diff"]["p90_ms"] is not None  # the estimate is still given
        assert m["verdict"] in ("better", "worse", "same", "inconclusive")
    split = result["metrics"]["compose"]["llm"]
    assert split["a"]["n_calls"] == 12 and split["b"]["n_calls"] == 400
    assert split["a"]["ttft"]["n"] == 12 and split["a"]["completion_tokens"]["n"] == 12
    assert "llm" not in result["metrics"]["retrieve"]


def test_a_against_itself_is_same_or_inconclusive(store: Store) -> None:
    run = make_run(store, 150)
    result = compare(store, str(run), str(run))  # the default tolerance, 5%
    assert result["regressions"] == [] and result["min_effect"]["text"] == "5%"
    for m in result["metrics"].values():
        assert all(m["diff"][f"p{p}_ms"] == 0 for p in (50, 90, 99))
    verdicts = {k: (m["verdict"], m["decided_by"]) for k, m in result["metrics"].items()}
    # classify (80-120 ms) is too spread for 150 turns to bound it within ±5 ms
    assert verdicts == {"turn": ("same", "p50"), "classify": ("inconclusive", None),
                        "retrieve": ("same", "p50"), "compose": ("same", "p50")}  # fmt: skip
    compose = result["metrics"]["compose"]
    assert compose["llm"]["explanation"].startswith("within the tolerance")
    assert compose["llm"]["cause"] is None
    assert not regression(result)
    # without a tolerance nothing is shown to be equal, except the constant retrieve step
    strict = compare(store, str(run), str(run), min_effect=MinEffect(0, "%"))
    assert {k: m["verdict"] for k, m in strict["metrics"].items()} == {
        "turn": "inconclusive", "classify": "inconclusive", "retrieve": "same",
        "compose": "inconclusive"}  # fmt: skip
    assert strict["metrics"]["compose"]["llm"]["explanation"].startswith("no clear change")


@given(st.lists(st.floats(min_value=1.0, max_value=30_000.0), min_size=1, max_size=80))
@settings(max_examples=15, deadline=None)
def test_a_a_property_never_a_regression(durations: list[float]) -> None:
    with Store.open(":memory:") as s:
        run = make_run(s, len(durations), lambda i: (durations[i], 10 + i % 3, 5.0))
        for tolerance in (MinEffect(0, "%"), MinEffect(5, "%"), MinEffect(20, "ms")):
            result = compare(s, str(run), str(run), min_effect=tolerance)
            assert not regression(result)
            assert {m["verdict"] for m in result["metrics"].values()} <= {"same", "inconclusive"}


def test_slower_because_more_tokens(store: Store) -> None:
    a, b = make_run(store, 120), make_run(store, 120, more_tokens)
    result = compare(store, str(a), str(b))
    compose = result["metrics"]["compose"]
    assert compose["verdict"] == "worse"
    assert compose["diff"]["p50_ci"][0] > 0
    llm = compose["llm"]
    assert llm["cause"] == "more_tokens"
    assert llm["explanation"].startswith("slower: +40% completion tokens")
    assert "TTFT unchanged" in llm["explanation"]
    assert "time between tokens unchanged" in llm["explanation"]
    assert result["metrics"]["classify"]["verdict"] == "inconclusive"
    assert "compose" in result["regressions"] and "classify" not in result["regressions"]
    assert (
        regression(result, "compose") and regression(result) and not regression(result, "classify")
    )


def test_slower_because_served_slower(store: Store) -> None:
    a, b = make_run(store, 120), make_run(store, 120, served_slower)
    llm = compare(store, str(a), str(b))["metrics"]["compose"]["llm"]
    assert llm["cause"] == "served_slower"
    assert llm["explanation"].startswith("slower: +")
    assert "% TTFT" in llm["explanation"] and "completion tokens unchanged" in llm["explanation"]
    faster = compare(store, str(b), str(a))["metrics"]["compose"]
    assert faster["verdict"] == "better" and faster["llm"]["cause"] == "served_faster"


def test_unknown_token_counts_are_excluded_and_counted(store: Store) -> None:
    def some_unknown(i: int) -> tuple[float, int | None, float]:
        ttft, tokens, gap = base(i)
        return ttft, None if i % 4 == 0 else tokens, gap

    a = make_run(store, 40, some_unknown)
    split = compare(store, str(a), str(a), metric="compose")["metrics"]["compose"]["llm"]["a"]
    assert split["n_calls"] == 40
    assert split["unknown"]["completion_tokens"] == 10
    assert split["completion_tokens"]["n"] == 30
    assert split["time_between_tokens"]["n"] == 40


def test_metric_selection_and_errors(store: Store) -> None:
    a = make_run(store, 10)
    only = compare(store, str(a), str(a), metric="compose")
    assert list(only["metrics"]) == ["compose"]
    assert list(compare(store, str(a), str(a), metric="turn")["metrics"]) == ["turn"]
    with pytest.raises(UserInputError, match="unknown metric"):
        compare(store, str(a), str(a), metric="nope")
    with pytest.raises(UserInputError, match="unknown metric"):
        regression(only, "turn")
    with pytest.raises(UserInputError, match="no such run"):
        compare(store, str(a), "999")
    with pytest.raises(UserInputError, match="run id or live"):
        compare(store, "latest", str(a))


def _at(day: int, hour: int) -> str:
    return f"2025-05-{day:02d}T{hour:02d}:00:00.000+00:00"


def test_live_windows(store: Store) -> None:
    make_run(store, 24, kind="live", started_at=lambda i: _at(1, i))  # May 1st, hourly
    make_run(store, 10, kind="live", started_at=lambda i: _at(2, i))  # May 2nd 00:00-09:00
    make_run(store, 5, kind="eval", started_at=lambda i: _at(1, i))  # not live: never selected
    assert compare(store, "live", "live")["a"]["n_turns"] == 34
    # a date-only end includes that whole day: May 1st alone is ..2025-05-01
    day1 = compare(store, "live:2025-05-01..2025-05-01", "live:2025-05-02T00:00..")
    assert day1["a"]["n_turns"] == 24 and day1["b"]["n_turns"] == 10
    assert day1["a"]["kind"] == "live" and day1["a"]["window"]["to"].startswith("2025-05-02")
    both_days = compare(store, "live:2025-05-01..2025-05-02", "live")
    assert both_days["a"]["n_turns"] == 34
    assert day1["metrics"]["turn"]["a"]["n"] == 24
    morning = compare(store, "live:..2025-05-01T06:00", "live:2025-05-02T05:00+00:00..")
    assert morning["a"]["n_turns"] == 6 and morning["b"]["n_turns"] == 5
    with pytest.raises(UserInputError, match="no turns"):
        compare(store, "live:2026-01-01..", "live")
    with pytest.raises(UserInputError, match="ISO-8601"):
        compare(store, "live:yesterday..", "live")
    with pytest.raises(UserInputError, match=r"live:FROM\.\.TO"):
        compare(store, "live:2025-05-01", "live")
    with pytest.raises(UserInputError, match="ends before"):
        parse_live_window("live:2025-05-02..2025-05-01")


def test_replayed_turns_report_original_and_replay_wall_time(store: Store) -> None:
    live = make_run(store, 20)
    replay = make_run(store, 20, kind="replay", original_ms=lambda i: 5000.0 + i)
    turn = compare(store, str(live), str(replay))["metrics"]["turn"]
    assert turn["replayed"]["a"] is None
    rep = turn["replayed"]["b"]
    assert rep["n"] == 20
    assert "original live" in rep["original_live"]["label"]
    assert "replay" in rep["replay_wall"]["label"]
    assert rep["original_live"]["p50_ms"] == 5009.0
    assert rep["replay_wall"]["p50_ms"] == turn["b"]["p50_ms"]  # the replay's own wall time


async def test_evals_are_compared_paired(store: Store) -> None:
    cases = [
        parse_case(
            {
                "id": f"c{i}",
                "message": f"message {i}",
                "assert": [{"type": "icontains", "value": "storm"}],
            }
        )
        for i in range(20)
    ]
    ids = lambda i: eval_request_id(f"c{i}", 0)  # noqa: E731
    a = make_run(store, 20, request_ids=ids)
    b = make_run(
        store, 20, request_ids=ids, answers=lambda i: "No idea." if i < 12 else "Storm Shell"
    )
    await score_run(store, a, cases)
    await score_run(store, b, cases)
    result = compare(store, str(a), str(b))
    evals = result["evals"]
    assert evals["n_pairs"] == 20
    assert evals["a"]["pass_rate"] == 1.0 and evals["b"]["pass_rate"] == 0.4
    assert (evals["a_only_passed"], evals["b_only_passed"]) == (12, 0)
    assert evals["verdict"] == "worse"
    assert evals["by_type"]["icontains"]["verdict"] == "worse"
    assert result["metrics"]["turn"]["verdict"] == "inconclusive"  # same latency profile
    assert regression(result, "evals") and not regression(result, "turn")
    assert result["regressions"] == ["evals"]
    aa = compare(store, str(b), str(b))
    assert aa["evals"]["verdict"] == "inconclusive" and not regression(aa, "evals")
    unscored = make_run(store, 5)
    assert compare(store, str(unscored), str(unscored))["evals"] is None


def test_answer_blocks_are_shaped_like_turn(store: Store) -> None:
    """compare --json gives answer_ttft and answer_done blocks shaped like turn;
    turns logged without them (before migration 003) count as unknown, not 0."""
    a = make_run(store, 40, lambda i: (200.0, 50, 10.0))
    b = make_run(store, 40, lambda i: (200.0, 50, 10.0))
    with store.transaction():
        store.log.execute("update turns set answer_ttft_ms = 100 + id % 7, answer_done_ms = 900 "
                         "where run_id = ?", [b])  # fmt: skip
    res = compare(store, str(a), str(b))
    for key in ("answer_ttft", "answer_done"):
        block = res[key]
        assert set(block) == set(res["metrics"]["turn"]) - {"replayed"}
        assert block["a"]["n"] == 0 and block["b"]["n"] == 40  # A's are unknown
        assert block["verdict"] == "inconclusive"
    same = compare(store, str(b), str(b))
    assert same["answer_ttft"]["verdict"] == "same"  # 100-106 ms: within ±5%
    assert same["answer_ttft"]["a"]["n"] == 40 and same["answer_ttft"]["a"]["p50_ms"] is not None


def test_min_effect_parses_shares_and_times() -> None:
    assert parse_min_effect("5%") == MinEffect(5.0, "%")
    assert parse_min_effect(" 2.5 % ") == MinEffect(2.5, "%")
    assert parse_min_effect("20ms") == parse_min_effect("20 ms") == MinEffect(20.0, "ms")
    assert parse_min_effect("0") == MinEffect(0.0, "%")
    assert MinEffect(5, "%").tolerance_ms(1200.0) == 60.0
    assert MinEffect(20, "ms").tolerance_ms(1200.0) == 20.0
    assert str(MinEffect(20, "ms")) == "20ms" and str(MinEffect(2.5, "%")) == "2.5%"
    for bad in ("5", "", "5s", "x%", "-1%"):
        with pytest.raises(UserInputError, match="--min-effect"):
            parse_min_effect(bad)


def test_time_between_tokens_is_the_logged_gap_between_text_chunks(store: Store) -> None:
    """compare's time between tokens is calls.time_between_tokens_ms (the gaps between
    the chunks that carried text), not the mean of every chunk gap: each call here ends
    with a 500 ms gap to its usage chunk, which would lift a mean of all gaps by ~10 ms."""
    a = make_run(store, 40, lambda i: (100.0 + i, 50, 20.0))
    split = compare(store, str(a), str(a), metric="compose")["metrics"]["compose"]["llm"]["a"]
    tbt = split["time_between_tokens"]
    assert tbt["n"] == 40 and tbt["p50_ms"] == 20.0


def test_calls_logged_without_a_time_between_tokens_count_as_unknown(store: Store) -> None:
    """A call logged before the column existed (NULL) is unknown, never a mean of its
    chunk gaps under another definition."""
    run = store.create_run("eval", "{}")
    for i in range(5):
        store.log_turn(run, TurnLog(TurnRow(input=f"m{i}", output="ok"),
                                    steps=[StepRow(step="compose", duration_ms=100.0)],
                                    calls=[CallRow(step="compose", stream=True, ttft_ms=50.0,
                                                   output_tokens=4,
                                                   chunk_gaps_ms=[10.0, 10.0, 10.0])]))  # fmt: skip
    store.finish_run(run, "complete")
    split = compare(store, str(run), str(run), metric="compose")["metrics"]["compose"]["llm"]["a"]
    assert split["unknown"]["time_between_tokens"] == 5
    assert split["time_between_tokens"]["n"] == 0


def _ttft_run(store: Store, n: int, ttft: Callable[[int], float],
              answers: Callable[[int], str]) -> int:  # fmt: skip
    run = store.create_run("eval", "{}", label=f"{n} turns")
    for i in range(n):
        turn = TurnLog(TurnRow(input=f"message {i}", output=answers(i), duration_ms=900.0,
                               request_id=eval_request_id(f"c{i}", 0),
                               answer_ttft_ms=ttft(i)))  # fmt: skip
        turn.steps = [StepRow(step="compose", duration_ms=900.0, output=answers(i))]
        store.log_turn(run, turn)
    store.finish_run(run, "complete")
    return run


async def test_compare_gives_confidence_sequences_valid_at_every_look(store: Store) -> None:
    """B answers every shared request first and fails every other eval case: both
    decided, each with its method named; B against itself decides nothing."""
    n = 60
    cases = [parse_case({"id": f"c{i}", "message": f"message {i}",
                         "assert": [{"type": "icontains", "value": "storm"}]})
             for i in range(n)]  # fmt: skip
    a = _ttft_run(store, n, lambda i: 800.0 + i, lambda i: "Storm Shell")
    b = _ttft_run(store, n, lambda i: 400.0 + i,
                  lambda i: "No idea." if i % 2 else "Storm Shell")  # fmt: skip
    await score_run(store, a, cases)
    await score_run(store, b, cases)
    seq = compare(store, str(a), str(b))["sequences"]
    assert seq["alpha"] == 0.05
    ttft = seq["answer_ttft"]
    assert ttft["method"] == "betting-eb" and ttft["null"] == 0.5 and ttft["n"] == n
    assert ttft["verdict"] == "decided_higher" and ttft["lower"] > 0.5
    assert ttft["decided_at"] is not None and ttft["decided_at"] <= n
    passes = seq["pass_rate"]
    assert passes["n"] == n and passes["verdict"] == "decided_lower" and passes["upper"] < 0
    assert passes["estimate"] == pytest.approx(-0.5, abs=0.1)
    same = compare(store, str(b), str(b))["sequences"]
    assert same["answer_ttft"]["verdict"] == "not_yet" and same["pass_rate"]["verdict"] == "not_yet"
