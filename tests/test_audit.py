"""``chainrun audit``: every verdict path of every item on small synthetic logs (no model),
the renderers (escaping, JSON shape), the atomic write and the CLI's exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from audit_logs import (
    add_eval_results,
    add_run,
    hedge_config,
    hedged_turn,
    llm,
    retrieve_step,
    turn,
)
from typer.testing import CliRunner

from chainrun.audit import audit, render, write_report
from chainrun.audit.items import needed_n
from chainrun.cli import app
from chainrun.errors import UserInputError
from chainrun.log.rows import CallRow, StepRow
from chainrun.log.store import Store


def item(store: Store, n: int, **kw):  # type: ignore[no-untyped-def]
    return audit(store, **kw).items[n - 1]


# ------------------------------------------------------------------------- empty / CLI


def test_empty_log_gives_not_enough_data_everywhere_with_what_is_missing(store) -> None:
    report = audit(store)
    assert [i.verdict for i in report.items] == ["not_enough_data"] * 8
    assert all(i.missing for i in report.items)


def test_cli_empty_log_exit_0_and_unknown_run_exit_2(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    Store.open(db).close()
    runner = CliRunner()
    res = runner.invoke(app, ["audit", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [i["id"] for i in doc["items"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert {i["verdict"] for i in doc["items"]} == {"not_enough_data"}
    assert set(doc["items"][0]) >= {"id", "title", "verdict", "evidence", "figures"}
    assert "scope" in doc
    res = runner.invoke(app, ["audit", "--db", str(db), "--run", "42"])
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "run 42" in res.stderr


def test_cli_writes_each_format_and_fail_on(tmp_path: Path, monkeypatch) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as s:
        add_run(s, "replay", [turn([llm("compose", tokens=None)]) for _ in range(12)])
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for fmt, marker in (
        ("html", "<!DOCTYPE html>"),
        ("md", "# chainrun audit"),
        ("json", '"items"'),
    ):
        out = tmp_path / f"r.{fmt}"
        res = runner.invoke(app, ["audit", "--db", str(db), "--format", fmt, "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert marker in out.read_text()
    res = runner.invoke(app, ["audit", "--db", str(db)])
    assert res.exit_code == 0 and list(tmp_path.glob("audit-*.html"))
    # item 1 fails (tokens never logged): --fail-on fail exits 1, no --fail-on exits 0
    res = runner.invoke(
        app, ["audit", "--db", str(db), "--fail-on", "fail", "--out", "-", "--format", "json"]
    )
    assert res.exit_code == 1
    assert json.loads(res.stdout)["items"][0]["verdict"] == "fail"
    res = runner.invoke(app, ["audit", "--db", str(db), "--format", "pdf"])
    assert res.exit_code == 2


def test_a_report_gets_the_mode_of_any_new_file(tmp_path: Path) -> None:
    """New user: reports were written 0600 (mkstemp's mode), unreadable to a web server."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        path = write_report("ok", tmp_path / "r.md")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_write_report_never_leaves_a_half_written_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "audit.html"
    write_report("good", path)

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise RuntimeError("crash while writing")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(RuntimeError):
        write_report("half", path)
    assert path.read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.html"]
    monkeypatch.undo()
    (tmp_path / "dir").mkdir()
    with pytest.raises(UserInputError, match="cannot write the report"):
        write_report("x", tmp_path / "dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.html", "dir"]


# ------------------------------------------------------------------------- 1. timed


def test_item1_pass_when_every_call_is_timed_and_counted(store) -> None:
    turns = [turn([llm("classify"), llm("compose")]) for _ in range(5)]
    # a stream cut by the step deadline never delivers usage: excluded, not a logging gap
    turns.append(turn([llm("classify"), llm("compose", tokens=None, truncated=True)]))
    add_run(store, "replay", turns)
    it = item(store, 1)
    assert it.verdict == "pass"
    assert it.figures["n_calls"] == 11 and it.figures["share_fully_logged"] == 1.0
    assert it.figures["n_streams_cut_short"] == 1


def test_item1_warn_on_a_few_unknown_counts(store) -> None:
    turns = [turn([llm("compose")]) for _ in range(19)]
    turns.append(turn([llm("compose", tokens=None)]))  # text came back, usage did not
    add_run(store, "replay", turns)
    it = item(store, 1)
    assert it.verdict == "warn"
    g = it.figures["by_step_provider"][0]
    assert g["unknown_output_tokens"] == 1 and g["text_without_usage"] == 1
    assert any("usage" in m for m in it.missing)


def test_item1_fail_when_a_step_never_logged_tokens(store) -> None:
    add_run(
        store, "replay", [turn([llm("classify"), llm("compose", tokens=None)]) for _ in range(5)]
    )
    it = item(store, 1)
    assert it.verdict == "fail" and "compose on local never logged output tokens" in it.evidence


# ------------------------------------------------------------------------- 2. effort


def _effort_config(effort: str | None) -> dict:
    return {
        "steps": {
            "compose": {"kind": "llm", "reasoning_effort": effort},
            "classify": {"kind": "llm", "reasoning_effort": "none"},
        }
    }


def _eval_run(store: Store, effort: str | None, passed: list[bool], ms: float) -> int:
    turns = [
        turn(
            [
                llm("classify", tokens=2, reasoning_tokens=0),
                llm(
                    "compose",
                    dur=ms,
                    reasoning_tokens=40 if effort == "high" else 0,
                    reasoning_effort=effort,
                ),
            ],
            request_id=f"c{i}#0",
        )
        for i in range(len(passed))
    ]
    rid = add_run(store, "eval", turns, config=_effort_config(effort), source="evals/r.jsonl")
    tids = [t.id for t in store.turns(rid)]
    add_eval_results(
        store,
        rid,
        [
            {"turn_id": t, "case_id": f"c{i}", "type": "regex", "passed": int(p)}
            for i, (t, p) in enumerate(zip(tids, passed, strict=True))
        ],
    )
    return rid


def test_item2_not_enough_data_without_effort_tokens_or_evals(store) -> None:
    add_run(store, "replay", [turn([llm("compose")])])
    it = item(store, 2)
    assert it.verdict == "not_enough_data" and any("chainrun eval" in m for m in it.missing)


def test_item2_warn_when_a_reasoning_step_was_never_evaluated_without_it(store) -> None:
    add_run(
        store,
        "replay",
        [turn([llm("compose", reasoning_tokens=50)])],
        config=_effort_config("high"),
    )
    it = item(store, 2)
    assert it.verdict == "warn"
    assert "never been evaluated without it" in it.evidence
    assert any("reasoning_effort" in m for m in it.missing)


def test_item2_warn_turn_down_when_the_eval_pair_shows_no_loss(store) -> None:
    b = _eval_run(store, "none", [True] * 10, ms=300.0)
    a = _eval_run(store, "high", [True] * 10, ms=900.0)  # newest: the config in use
    it = item(store, 2)
    assert it.verdict == "warn"
    cmp = it.figures["steps"]["compose"]["comparison"]
    assert (cmp["a"]["run_id"], cmp["b"]["run_id"]) == (a, b)
    assert cmp["pass_rate"]["verdict"] == "inconclusive"
    assert cmp["step_p50_ms"]["diff_b_minus_a"] == pytest.approx(-600.0)
    assert cmp["reasoning_tokens_mean"] == {"a": 40.0, "b": 0.0, "n_a": 10, "n_b": 10}
    assert "turn compose down to none" in " ".join(it.notes)


def test_item2_pass_when_the_step_needs_its_effort(store) -> None:
    _eval_run(store, "none", [False] * 10, ms=300.0)
    _eval_run(store, "high", [True] * 10, ms=900.0)  # newest: the config in use
    it = item(store, 2)
    assert it.verdict == "pass"
    pr = it.figures["steps"]["compose"]["comparison"]["pass_rate"]
    assert pr["verdict"] == "worse" and pr["p_value"] < 0.05


def test_item2_skipped_verdicts_are_no_failures_and_are_named(store) -> None:
    b = _eval_run(store, "none", [True] * 10, ms=300.0)
    a = _eval_run(store, "high", [True] * 10, ms=900.0)
    # run b's llm-rubric verdicts were skipped (no grader): passed NULL, not a failure
    add_eval_results(
        store,
        b,
        [
            {"turn_id": t.id, "case_id": f"c{i}", "type": "llm-rubric", "passed": None,
             "detail": "no grader configured: set [grader] in chainrun.toml"}
            for i, t in enumerate(store.turns(b))
        ],
    )  # fmt: skip
    it = item(store, 2)
    pr = it.figures["steps"]["compose"]["comparison"]["pass_rate"]
    assert pr["verdict"] == "inconclusive" and pr["b"]["passed"] == 10  # not 0 of 10
    assert pr["skipped"]["a"] == {}
    assert pr["skipped"]["b"]["llm-rubric"]["n"] == 10
    assert it.verdict == "warn"  # no loss measured at none: turn it down
    note = next(n for n in it.notes if n.startswith("compose:"))
    assert f"10 llm-rubric verdicts of run {b} skipped: no grader configured" in note
    assert a != b


# ------------------------------------------------------------------------- 3. delay vs p95


def _hedge_run(
    store: Store,
    n: int,
    delay: float,
    *,
    base_url: str = "http://a/v1",
    settle=lambda i: 100.0 + i % 100,
    **kw,
) -> int:  # type: ignore[no-untyped-def]
    turns = [hedged_turn("guard", delay=delay, settle=settle(i), **kw) for i in range(n)]
    return add_run(store, "replay", turns, config=hedge_config(base_url=base_url))


def test_item3_not_enough_data_without_hedged_steps_or_samples(store) -> None:
    add_run(store, "replay", [turn([llm("compose")])])
    assert item(store, 3).verdict == "not_enough_data"
    _hedge_run(store, 20, delay=195.0)
    it = item(store, 3)
    assert it.verdict == "not_enough_data" and "at least 72" in it.evidence


def test_item3_pass_inside_and_warn_outside_the_p95_interval(store) -> None:
    _hedge_run(store, 200, delay=195.0)  # settle 100..199 ms: p95 = 194
    it = item(store, 3)
    assert it.verdict == "pass", it.notes
    f = it.figures["steps"]["guard"]
    assert f["n"] == 200 and f["p95_ci"][0] <= 195.0 <= f["p95_ci"][1]
    assert f["configured_delay"] == "p95"
    _hedge_run(store, 200, delay=60.0)
    it = item(store, 3)
    assert it.verdict == "warn" and "outside" in it.evidence


def test_item3_fail_on_attempts_without_outcome(store) -> None:
    rid = _hedge_run(store, 100, delay=195.0)
    store.db.execute("update calls set outcome = null where run_id = ? and id % 10 = 0", [rid])
    store.db.conn.commit()
    it = item(store, 3)
    assert it.verdict == "fail" and "no outcome" in it.evidence


# ------------------------------------------------------------------------- 4. win rate


def _fires(
    store: Store, n_fired: int, n_won: int, *, n_quiet: int = 100, base_url: str = "http://a/v1"
) -> int:  # type: ignore[no-untyped-def]
    turns = [hedged_turn("guard", delay=500.0, settle=200.0, tokens=30) for _ in range(n_quiet)]
    for i in range(n_fired):
        won = i < n_won
        turns.append(
            hedged_turn(
                "guard",
                delay=500.0,
                settle=900.0,
                fired=True,
                won=won,
                tokens=180,
                saved=300.0 if won else None,
            )
        )
    return add_run(store, "replay", turns, config=hedge_config(base_url=base_url))


def test_item4_not_enough_data_under_30_fires(store) -> None:
    _fires(store, 10, 0)
    it = item(store, 4)
    assert it.verdict == "not_enough_data" and "at least 30 fires" in it.evidence


def test_item4_fails_a_hedge_that_fires_on_work_with_the_w_plus_n_explanation(store) -> None:
    _fires(store, 40, 1)
    it = item(store, 4)
    assert it.verdict == "fail"
    f = it.figures["steps"]["guard"]
    assert (f["n_fired"], f["n_won"], f["win_rate"]) == (40, 1, 0.025)
    assert f["diagnosis"] == "work" and f["output_tokens"]["share_fired_above_median"] == 1.0
    assert f["extra_calls_per_1000_turns"] == pytest.approx(40 / 140 * 1000, abs=1)
    text = " ".join(it.notes)
    assert "N1 − N2 > d" in text and "Raise the delay" in text and "per 1,000 turns" in text


def test_item4_pass_when_copies_win(store) -> None:
    _fires(store, 40, 10)
    it = item(store, 4)
    assert it.verdict == "pass"
    f = it.figures["steps"]["guard"]
    assert f["time_saved_per_win_ms"] == {"median": 300.0, "mean": 300.0, "n": 10}


def test_item4_fires_whose_copy_was_never_sent_are_not_called_work(store) -> None:
    """A dead backup (breaker open): each fire's copy was suppressed, never sent. The
    audit says so, and does not blame long answers (W + N) for the lost races."""
    turns = [hedged_turn("guard", delay=500.0, settle=200.0, tokens=30) for _ in range(100)]
    for _ in range(40):
        primary = llm("guard", 20.0, 900.0, 180, outcome="primary")
        copy = CallRow(step="guard", attempt=2, target="backup", outcome="suppressed",
                       error_type="circuit_open", started_offset_ms=None)  # fmt: skip
        rec = StepRow(step="guard", duration_ms=900.0, n_attempts=2, hedge_delay_ms=500.0,
                      hedge_fired=True, hedge_won=False)  # fmt: skip
        turns.append(turn([primary, copy], steps=[rec]))
    add_run(store, "replay", turns, config=hedge_config())
    it = item(store, 4)
    f = it.figures["steps"]["guard"]
    assert it.verdict == "fail" and f["fire_rate"] == pytest.approx(40 / 140, abs=1e-3)
    assert f["copies_sent"] == 0 and f["copies_sent_per_call"] == 0.0
    assert f["n_fired_no_copy_sent"] == 40
    assert f["unsent"] == {"budget_exhausted": 0, "circuit_open": 40, "loop_lag": 0,
                           "rate_limited": 0}
    text = " ".join(it.notes)
    assert "40 of those fires sent no copy (breaker open 40)" in it.evidence
    assert "N1 − N2 > d" not in text and "Raise the delay" not in text


def test_item4_warn_when_the_serving_path_changed_and_was_not_rechecked(store) -> None:
    r1 = _fires(store, 40, 10)
    r2 = _fires(store, 5, 1, base_url="http://b/v1")
    it = item(store, 4, runs=[r1, r2])
    assert it.verdict == "warn" and "serving path changed" in it.evidence
    assert [p["label"] for p in it.figures["steps"]["guard"]["over_time"]] == [
        f"run {r1}",
        f"run {r2}",
    ]


# ------------------------------------------------------------------------- 5. tokens


def test_item5_not_enough_data_and_fail_on_unknown_tokens(store) -> None:
    add_run(store, "replay", [turn([llm("compose")]) for _ in range(3)])
    assert item(store, 5).verdict == "not_enough_data"
    add_run(store, "replay", [turn([llm("compose", tokens=None)]) for _ in range(12)])
    it = item(store, 5)
    assert it.verdict == "fail" and "cannot be paired" in it.evidence


def _provider_run(store: Store, ttft_b: float, per_tok_b: float, tokens_b: int) -> None:
    calls = []
    for i in range(20):
        ta, tb = 20 + i, tokens_b + i
        calls.append(
            [
                llm("compose", ttft=100.0, dur=100.0 + 10.0 * ta, tokens=ta, provider="local"),
                llm(
                    "critique",
                    ttft=ttft_b,
                    dur=ttft_b + per_tok_b * tb,
                    tokens=tb,
                    provider="cloud",
                ),
            ]
        )
    # one step served by both providers: alternate which provider serves compose
    turns = []
    for i, (a, b) in enumerate(calls):
        b = llm(
            "compose", ttft=b.ttft_ms, dur=b.duration_ms, tokens=b.output_tokens, provider="cloud"
        )
        turns.append(turn([a]) if i % 2 else turn([b]))
        turns.append(turn([b]) if i % 2 else turn([a]))
    add_run(store, "replay", turns)


def test_item5_pass_and_work_diagnosis(store) -> None:
    _provider_run(store, ttft_b=100.0, per_tok_b=10.0, tokens_b=60)  # same speed, more tokens
    it = item(store, 5)
    assert it.verdict == "pass"
    fits = it.figures["steps"]["compose"]
    assert fits["local"]["fit"]["slope_ms_per_token"] == pytest.approx(10.0)
    assert fits["_comparison"]["slower"] == "cloud"
    assert "the difference is work" in fits["_comparison"]["diagnosis"]


def test_item5_serving_diagnosis(store) -> None:
    _provider_run(store, ttft_b=600.0, per_tok_b=25.0, tokens_b=20)  # same tokens, slower
    diag = item(store, 5).figures["steps"]["compose"]["_comparison"]["diagnosis"]
    assert "served slower" in diag and "TTFT" in diag and "per output token" in diag


# ------------------------------------------------------------------------- 6. retrieval

_SEARCHES_EARLY = [("keyword", 2.0, ["A", "B", "C", "D"])]
_SEARCHES_ALL = [
    ("keyword", 2.0, ["A"]),
    ("hybrid", 30.0, ["B", "C", "D", "E"]),
    ("filter", 3.0, ["F"]),
]


def _retr_turn(stopped: str | None, searches, results, message="a rain jacket?"):  # type: ignore[no-untyped-def]
    return turn(
        [llm("compose")], extra_steps=[retrieve_step(stopped, searches, results)], message=message
    )


def test_item6_not_enough_data_without_retrieval(store) -> None:
    add_run(store, "replay", [turn([llm("compose")])])
    assert item(store, 6).verdict == "not_enough_data"


def test_item6_warn_when_no_eval_case_covers_early_exit(store) -> None:
    add_run(store, "replay", [_retr_turn("keyword", _SEARCHES_EARLY, list("ABCD"))] * 3)
    it = item(store, 6)
    assert it.verdict == "warn"
    assert it.figures["early_exit_rate"] == 1.0 and it.figures["stopped_after"] == {"keyword": 3}
    assert any("catalog-ids" in m for m in it.missing)


def _covered_evals(store: Store) -> None:
    turns = [
        _retr_turn("keyword", _SEARCHES_EARLY, list("ABCD")),
        _retr_turn("hybrid", _SEARCHES_ALL[:2], list("ABCDE")),
    ]
    rid = add_run(store, "eval", turns)
    tids = [t.id for t in store.turns(rid)]
    add_eval_results(
        store,
        rid,
        [
            {"turn_id": tids[0], "case_id": "a", "type": "catalog-ids", "passed": 1},
            {"turn_id": tids[1], "case_id": "b", "type": "catalog-ids", "passed": 1},
        ],
    )


def test_item6_pass_when_threshold_and_order_are_covered(store) -> None:
    add_run(store, "replay", [_retr_turn("keyword", _SEARCHES_EARLY, list("ABCD"))] * 3)
    _covered_evals(store)
    it = item(store, 6)
    assert it.verdict == "pass", it.missing
    assert it.figures["threshold_covered"] and it.figures["order_covered"]
    assert it.figures["search_ms"]["keyword"]["n"] == 3


def test_item6_fail_when_stopping_early_costs_recall(store) -> None:
    # every search ran (early_exit = false); stopping at min_results 4 would keep A..D
    full = list("ABCDEF")
    add_run(store, "replay", [_retr_turn(None, _SEARCHES_ALL, full, message="rain jacket")] * 4)
    _covered_evals(store)
    it = item(store, 6, queries={"rain jacket": ("E", "F")})
    assert it.verdict == "fail"
    # stopping after hybrid keeps A..E (5 >= 4): E found, F lost: recall@8 1.0 -> 0.5
    assert it.figures["recall_cost"] == {"mean": 0.5, "n": 4, "k": 8}


def test_latency_items_follow_the_one_rule_of_every_summary(store) -> None:
    """An interrupted hedged run: 80 completed turns, then 6 cancelled (Ctrl-C) whose
    hedged step had fired with a partial 5 ms, and 2 errored turns. The audit's latency
    figures use the completed turns only, as show and hedge-stats do."""
    from chainrun.analysis.summary import hedge_stats, latency_summary

    turns = [hedged_turn("guard", delay=190.0, settle=100.0 + i, fired=i % 4 == 0,
                         won=i % 8 == 0, saved=30.0) for i in range(80)]  # fmt: skip
    for i in range(8):
        t = hedged_turn("guard", delay=190.0, settle=5.0, fired=True, won=False)
        t.turn.status = "cancelled" if i < 6 else "error"
        turns.append(t)
    rid = add_run(store, "replay", turns, config=hedge_config())
    report = audit(store, runs=[rid])
    shown, hedging = latency_summary(store, rid), hedge_stats(store, rid)
    counts = {"n_completed": 80, "n_cut": 0, "n_cancelled": 6, "n_refused": 0,
              "n_replaced": 0, "n_errored": 2}
    assert shown["turns"] == hedging["turns"] == counts
    assert report.scope["samples"][0]["turns"] == counts
    i3, i4, i5, i7 = (report.items[k - 1].figures for k in (3, 4, 5, 7))
    assert i3["steps"]["guard"]["n"] == 80 and i3["steps"]["guard"]["n_armed"] == 80
    g4, g = i4["steps"]["guard"], hedging["steps"]["guard"]
    assert (g4["n_armed"], g4["n_fired"], g4["n_won"]) == (g["n_armed"], g["n_fired"], g["n_won"])
    assert g4["n_fired"] == 20 and g4["n_turns"] == 80
    assert i5["steps"]["guard"]["local"]["n"] == 80
    turn_fig = i7["metrics"]["turn"][f"replay run {rid}"]
    assert turn_fig["n"] == shown["turn"]["n"] == 80
    assert turn_fig["p50_ms"] == shown["turn"]["p50_ms"]  # not pulled down by the 5 ms
    assert i7["turns"][f"replay run {rid}"] == counts
    row = next(r for r in report.items[6].tables[0].rows if r[0] == "turn")
    assert row[-1] == "6 cancelled, 2 errored"
    assert "n = 80 completed turns (6 cancelled, 2 errored left out)" in report.items[6].evidence


# ------------------------------------------------------------------------- 7. live/replay


def _timed_turns(n: int, ms: float) -> list:  # type: ignore[type-arg]
    return [turn([llm("compose", dur=ms + i % 7)]) for i in range(n)]


def test_item7_not_enough_data_warn_and_needed_n(store) -> None:
    assert item(store, 7).verdict == "not_enough_data"
    add_run(store, "replay", _timed_turns(12, 100.0))
    add_run(store, "live", _timed_turns(12, 100.0))
    it = item(store, 7)
    assert it.verdict == "warn"
    assert {"metric": "turn", "sample": "live", "p": 90, "n": 12, "n_needed": 36} in (
        it.figures["unbounded"]
    )
    assert (needed_n(90), needed_n(95), needed_n(99)) == (36, 72, 368)


def test_item7_fail_when_live_is_slower_than_the_replay(store) -> None:
    add_run(store, "replay", _timed_turns(60, 100.0))
    add_run(store, "live", _timed_turns(60, 400.0))
    it = item(store, 7)
    assert it.verdict == "fail"
    assert {s["metric"] for s in it.figures["live_slower"]} == {"turn", "compose"}


def test_item7_pass_with_samples_large_enough_for_every_percentile(store) -> None:
    add_run(store, "replay", _timed_turns(400, 100.0))
    add_run(store, "live", _timed_turns(400, 100.0))
    it = item(store, 7)
    assert it.verdict == "pass", it.notes
    assert it.figures["metrics"]["turn"]["live"]["p99_ci"] is not None


# ------------------------------------------------------------------------- rendering


def test_html_and_markdown_escape_what_came_from_models_users_and_configs(store) -> None:
    evil_step = '<img src=x onerror="alert(1)">'
    answer = "<script>alert('x')</script> and <b onerror=alert(2)>"
    add_run(
        store,
        "replay",
        [turn([llm(evil_step, output=answer)], answer=answer, message="<script>steal()</script>")]
        * 3,
        config={"steps": {evil_step: {"kind": "llm", "reasoning_effort": "high"}}},
    )
    report = audit(store)
    html = render(report, "html")
    assert "<script" not in html and "<img" not in html and "<b " not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "onerror=&quot;alert(1)&quot;" in html
    assert "Content-Security-Policy" in html and "<svg" in html  # plots inlined
    md = render(report, "md")
    assert "<script>" not in md and "\\<script\\>" in md
    doc = json.loads(render(report, "json"))
    assert doc["items"][1]["figures"]["steps"][evil_step]["reasoning_effort"] == "high"
