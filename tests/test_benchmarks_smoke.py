"""Smoke test of the hedging benchmarks: each runs end to end with tiny sizes.

Each benchmark is run as the user runs it (``python benchmarks/NAME.py ... --json``, a
subprocess that starts its own lab server) and its JSON document is checked for its
keys and for numbers in range. Not a timing assertion: the sizes are far too small to
say anything about hedging, and the result file goes to a temporary directory so the
recorded results in ``benchmarks/results/`` stay untouched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{name}.py", *args, "--json", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard, not a speed target: sizes here are tiny, load is not
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert json.loads(out.read_text(encoding="utf-8")) == doc
    assert doc["benchmark"] == name
    assert doc["command"].startswith(f"python benchmarks/{name}.py")
    assert doc["date"].endswith("+00:00")
    assert {"platform", "python", "cpu_count"} <= doc["machine"].keys()
    assert isinstance(doc["parameters"], dict)
    return doc["results"]


def unit(x: Any) -> bool:
    return isinstance(x, int | float) and 0.0 <= x <= 1.0


def test_hedge_bimodal(tmp_path: Path) -> None:
    res = run_benchmark(
        "hedge_bimodal", tmp_path, *("--turns", "20", "--concurrency", "20", "--warmup", "5")
    )
    assert res["predicted"]["single"] == pytest.approx(0.5)
    assert res["predicted"]["hedged"] == pytest.approx(0.875)
    assert res["predicted"]["hedged_calls_per_turn"] == pytest.approx(1.75)
    for mode in ("single", "hedged"):
        m = res[mode]
        assert m["n"] == 20
        assert unit(m["success_rate"])
        assert 1.0 <= m["calls_per_turn"] <= 3.0
        assert unit(m["client_lag"]["share_turns_lagging"])
    assert res["single"]["calls_per_turn"] == 1.0
    assert res["hedged"]["hedge"]["budget_exhausted"] == 0
    auto = res["auto"]
    assert auto["n"] == 20 and auto["warmup_turns"] == 5
    assert 0.0 <= auto["extra_calls_per_turn"] <= 9.0
    assert isinstance(auto["advisor"], list)
    assert set(res["checks"]) >= {"auto_in_time_at_least_0_99", "auto_extra_calls_at_most_1_05"}


def test_hedge_work_noise(tmp_path: Path) -> None:
    # one wave of turns per variant (each call carries up to 2 s of work): 30 turns in
    # two waves took 25 s at load 6 and passed the subprocess limit at load 21
    res = run_benchmark(
        "hedge_work_noise",
        tmp_path,
        *("--turns", "12", "--concurrency", "12", "--min-samples", "5", "--deadline-s", "8"),
    )
    assert "N1 - N2 > d" in res["explanation"]
    for name in ("low_noise", "noisy"):
        h = res[name]["hedge"]
        assert h["n"] == 12
        assert h["n_warmup"] + h["n_armed"] == 12
        for key in ("fire_rate", "win_rate"):
            assert h[key] is None or unit(h[key])
        assert 0.0 <= h["extra_calls_per_turn"] <= 1.0
        assert h["time_saved_per_win_ms"] is None or h["time_saved_per_win_ms"] > 0
        p = res[name]["predicted"]
        assert unit(p["fire_rate"]) and p["delay_ms"] > 0
    assert res["low_noise"]["predicted"]["win_rate"] == pytest.approx(0.0, abs=0.01)


def test_hedge_overhead(tmp_path: Path) -> None:
    out = tmp_path / "hedge_overhead.json"
    res = run_benchmark(
        "hedge_overhead", tmp_path, "--calls", "20", "--warmup", "2", "--concurrency", "5",
        "--concurrent-rounds", "4",
    )
    for arm in ("bare", "hedger", "chain_nolog", "chain_inline", "chain"):
        assert res[arm]["n"] == 20
        assert res[arm]["median_ms"] > 0
    for arm in ("hedger", "chain_nolog", "chain"):
        assert isinstance(res[arm]["added_median_ms"], float)
        assert res[arm]["ratio_of_medians"] > 0
    assert res["checks"]["hedger_fires"] == 0
    # 22 one at a time (measured + warm-up rounds), 4 + 1 warm-up rounds of 5 at once
    assert res["checks"]["turns_logged"] == res["checks"]["turns_run"] == 22 + 25
    assert res["checks"]["turns_logged_inline"] == 22 + 25
    assert res["concurrent"]["inline_log"]["n"] == 4  # one added-per-call value per round
    assert res["concurrent"]["per_rank_latency"]["n"] == 20  # 4 rounds of 5 calls
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["n"] == 20 and isinstance(doc["median_added_ms"], float)
    assert isinstance(doc["p99_added_ms"], float) and doc["p99_added_ci"] is None  # n < 368
    assert doc["by_concurrency"]["5"]["n"] == 4 and doc["by_concurrency"]["5"]["rounds"] == 4
    assert doc["by_concurrency"]["1"]["median_added_ms"] == doc["median_added_ms"]
    assert doc["parameters"]["gc"] == "paired" and doc["parameters"]["pin"] is True
    # the collector ran once per timed call, at its end (one young collection each)
    assert res["gc_during_sequential_part"]["gen0"]["n"] >= 5 * 20


def test_guard_advise(tmp_path: Path) -> None:
    res = run_benchmark(
        "guard_advise",
        tmp_path,
        *("--turns", "10", "--learn-turns", "30", "--concurrency", "10"),
        *("--simulations", "300"),
    )
    for name in ("every_1s", "learn"):
        m = res[name]
        assert m["n"] == (10 if name == "every_1s" else 30)
        assert unit(m["in_time_share"]) and m["extra_calls_per_check"] >= 0
        assert m["in_time_ci95"][0] <= m["in_time_share"] <= m["in_time_ci95"][1]
    assert res["learn"]["extra_calls_per_check"] == 0
    rec = res["advise"]["recommendation"]
    assert isinstance(rec["hedge"], bool) and "predicted" in rec
    assert ("advised" in res) is rec["hedge"]
    assert res["advise"]["toml"]


def test_scale(tmp_path: Path) -> None:
    res = run_benchmark("scale", tmp_path, "--levels", "1,3", "--min-turns", "3", "--runs",
                        "saturating")  # fmt: skip
    assert set(res) == {"1", "3"}
    for key, row in res.items():
        assert row["concurrency"] == int(key) and row["turns"] == 3
        assert row["turns_logged"] == 3 and row["turns_logged_once"] is True
        assert row["statuses"] == {"ok": 3}
        assert row["calls"] == 9  # three model steps a turn (classify calls no model)
        assert row["turns_per_s"] > 0 and row["peak_rss_mb"] > 0
        assert row["loop_lag_p99_ms"] >= 0 and isinstance(row["added_ms_per_call"], float)
        # every call paired with the lab's record of it (by response id)
        assert row["added_ms_per_call_n"] == 9
        assert row["client_cpu_ms_per_turn"] > 0 and row["lab_cpu_ms_per_turn"] > 0


def test_scale_paced(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/scale.py", "--runs", "paced", "--paced-levels", "1,4",
         "--paced-turns-per-slot", "2", "--paced-min-turns", "2", "--paced-ramp-s", "0.3",
         "--paced-ttft-ms", "150", "--paced-token-ms", "5", "--paced-tokens", "6",
         "--uvloop-levels", "4", "--json", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["results"] == {}  # the saturating run was not asked for
    assert doc["parameters"]["paced"]["scenario"]["latency"]["median_ms"] == 150
    paced = doc["results_paced"]
    assert set(paced) == {"1", "4"}
    for key, row in paced.items():
        n = int(key)
        assert row["concurrency"] == n and row["turns"] == 2 * n
        assert row["turns_logged"] == 2 * n and row["turns_logged_once"] is True
        assert row["added_ms_per_call_n"] == row["calls"] == 6 * n  # 3 model steps a turn
        assert row["peak_rss_mb"] > 0 and row["loop_lag_n"] >= 0
    assert paced["1"]["ramp_s"] == 0.0 and paced["4"]["ramp_s"] == 0.3
    assert {row["event_loop"] for row in paced.values()} == {"asyncio"}
    try:  # the 4 level again on uvloop, in the same run, when the uvloop extra is there
        import uvloop  # noqa: F401
    except ImportError:
        assert "results_paced_uvloop" not in doc
        assert doc["parameters"]["paced"]["uvloop_levels"] == "uvloop not installed"
    else:
        (row,) = doc["results_paced_uvloop"].values()
        assert row["event_loop"] == "uvloop" and row["turns_logged_once"] is True


def test_vs_litellm_without_litellm(tmp_path: Path) -> None:
    # the LiteLLM arms need the bench extra; the suite runs the two that do not
    res = run_benchmark(
        "vs_litellm",
        tmp_path,
        *("--calls", "12", "--concurrency", "6", "--arms", "single,chainrun"),
        *("--slow-range-s", "0.3,0.6"),
    )
    assert set(res["arms"]) == {"single", "chainrun"}
    for arm in ("single", "chainrun"):
        m = res["arms"][arm]
        assert m["n"] == 12 and m["errors"] == {}
        assert unit(m["success_rate"])
        assert m["p50_ms"] <= m["p99_ms"] <= m["p999_ms"] <= m["max_ms"]
        assert m["p50_ci95"][0] is not None and m["p999_ci95"][1] is None  # n too small
        assert sum(m["upstream_calls"].values()) == round(m["upstream_calls_per_request"] * 12)
    assert res["arms"]["single"]["upstream_calls"] == {"lab_a": 12, "lab_b": 0}
    assert res["arms"]["chainrun"]["upstream_calls_per_request"] >= 1.0
    assert "chainrun_over_single" in res["ratios"]


def test_transport_cpu(tmp_path: Path) -> None:
    res = run_benchmark(
        "transport_cpu", tmp_path, *("--calls", "20", "--concurrency", "5", "--rounds", "1")
    )
    arms = res["arms"]
    assert {"chainrun", "sdk_httpx2", "raw_asyncio"} <= set(arms)
    # chainrun's aiohttp transport is a dependency; the SDK's aiohttp arms need the bench
    # extra (openai[aiohttp]) and without it say why
    assert "chainrun_transport_aiohttp" in arms
    assert set(arms) | set(res["unavailable"]) == {
        "chainrun", "chainrun_transport_aiohttp", "chainrun_aiohttp", "sdk_httpx2",
        "sdk_aiohttp", "raw_asyncio",
    }  # fmt: skip
    # the same lab bytes through every arm: the same chunks parsed
    assert len({m["chunks_per_call"] for m in arms.values()}) == 1
    assert arms["raw_asyncio"]["chunks_per_call"] >= 16
    assert arms["raw_asyncio"]["over_floor"] == 1.0
    assert all(m["cpu_ms_per_call"] > 0 for m in arms.values())


def test_retrieval_scale(tmp_path: Path) -> None:
    res = run_benchmark("retrieval_scale", tmp_path, "--sizes", "600", "--searches", "6")
    size = res["sizes"]["600"]
    assert size["products"] == 600
    names = {"keyword", "keyword_any", "vector_numpy", "hybrid_numpy", "vector_numpy_sized"}
    if size["sqlite_vec"]:
        names |= {f"{s}_{b}" for s in ("vector", "hybrid") for b in ("sqlite_vec", "vec0")}
        names |= {"vector_sqlite_vec_sized", "vector_vec0_sized"}
        assert size["searches"]["vector_vec0_sized"]["vec0_rounds_per_search"] >= 1
    assert names <= set(size["searches"])
    for name, s in size["searches"].items():
        assert s["n"] == 6 and s["p50_ms"] > 0 and unit(s["share_empty"])
        assert s["short_of_k"] == (None if name.startswith("keyword") else 0)
    for key in ("loop_lag_off_loop", "loop_lag_inline"):
        assert size[key]["searches"] == 80 and size[key]["lag_n"] >= 1


def test_own_cost(tmp_path: Path) -> None:
    res = run_benchmark("own_cost", tmp_path, "--calls", "30", "--warmup", "5")
    layers = ("bare", "chatstream", "unhedged", "hedged", "chain_nolog", "chain")
    assert list(res) == list(layers)
    for name in layers:
        assert res[name]["n"] == 30 and res[name]["median_us"] > 0
    # the floor waits once for its "network"; the engine's attempt task adds its start
    # and the race's wake-up; a hedge that never fires adds no loop iteration
    assert res["bare"]["loop_iterations"] == 1
    assert res["unhedged"]["loop_iterations"] == res["hedged"]["loop_iterations"] == 3


def test_sequential_aa(tmp_path: Path) -> None:
    res = run_benchmark("sequential_aa", tmp_path, "--sequences", "60", "--turns", "80")
    for metric in ("pass_rate", "faster_share", "ungrounded_rate"):
        for kind in ("sequence", "fixed_n_peeking"):
            got = res["aa"][metric][kind]
            assert got["sequences"] == 60 and 0 <= got["rate"] <= 1
    assert set(res["ab"]) == {"pass_rate", "faster_share"}


def test_pg_fleet_conversations_through_pgbouncer(tmp_path: Path) -> None:
    """Conversations across ``serve --workers 4`` on a private PostgreSQL behind a private
    PgBouncer, restarted half way: tiny sizes, the checks the benchmark makes."""
    import shutil

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _pg import pg_bin
    finally:
        sys.path.pop(0)
    if pg_bin() is None or shutil.which("pgbouncer") is None:
        pytest.skip("no PostgreSQL server binaries or pgbouncer (.ci/run installs both)")
    res = run_benchmark("pg_fleet", tmp_path, "--conversations", "4", "--turns", "3",
                        "--parallel", "2", "--restart-after", "6")  # fmt: skip
    assert res["turns_sent"] == 12 and res["turns_answered_ok"] == 12, res
    assert res["errors"] == {} and res["turns_missing_earlier_turns"] == 0
    assert res["conversations_with_wrong_indexes"] == 0 and res["every_turn_logged_once"]
    assert res["pgbouncer_restart"]["after_turns"] >= 6


def test_hung_sync_tool(tmp_path: Path) -> None:
    res = run_benchmark("hung_sync_tool", tmp_path, "--flood", "6", "--probes", "1",
                        "--hang-s", "1.5", "--timeout-s", "0.3", "--ttft-ms", "5")  # fmt: skip
    assert len(res["answer_ttft_ms_alone"]) == len(res["answer_ttft_ms_loaded"]) == 1
    assert res["flood_statuses"] == ["ok"] * 6
    assert sum(res["flood_tool_statuses"].values()) == 6


def _followup_log(path: Path) -> None:
    """A replay log written by hand with the columns ``followup_floor`` reads: two
    conversations; a's turn 2 stays on its material, its turn 3 and b's turn 2 bring new
    material (a policy section, product lines)."""
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("create table turns (id integer primary key, conversation_id text, "
                "turn_index int, label text, status text, answer_ttft_ms real, admit_ms real)")
    con.execute("create table steps (turn_id int, step text, started_offset_ms real, "
                "duration_ms real, status text)")
    con.execute("create table calls (turn_id int, step text, attempt int, round int, "
                "outcome text, ttft_ms real, started_offset_ms real, input_tokens int, "
                "cached_input_tokens int, server_timings text, prompt text, output text)")

    def prompt(user: str) -> str:
        return json.dumps([{"role": "system", "content": "S."}, {"role": "user", "content": user}])

    p1 = "Catalogue matches:\n- [A-1] Coat\n\nShopper: a coat?\nStylist: Here"
    o1 = " is the coat."
    p2 = (p1 + o1 + "\n- Coat, A-1: €10.\n\nCatalogue matches:\n- as above: A-1\n\n"
          "Shopper: in red?\nStylist: The coat")
    o2 = " comes in red."
    p3 = (p2 + o2 + "\n\nShop policy, Returns:\nReturns within 30 days.\n\n"
          "Catalogue matches:\n(none)\n\nShopper: can I return it?\nStylist: Our policy")
    q1 = "Catalogue matches:\n(none)\n\nShopper: hello\nStylist: Hi"
    q2 = q1 + "!\n\nCatalogue matches:\n- [B-2] Boots\n\nShopper: boots?\nStylist: Here"
    turns = [  # id, conversation, index, label, answer TTFT, compose start, call TTFT,
        # prompt_n, cache_n, prompt_ms, prompt text, output
        (1, "a", 1, "product_search", 900.0, 50.0, 800.0, 300, 0, 700.0, p1, o1),
        (2, "b", 1, "other", 800.0, 40.0, 700.0, 280, 0, 600.0, q1, "!"),
        (3, "a", 2, "product_search", 300.0, 20.0, 250.0, 60, 310, 150.0, p2, o2),
        (4, "b", 2, "product_search", 600.0, 30.0, 500.0, 200, 290, 400.0, q2, "."),
        (5, "a", 3, "returns", 700.0, 40.0, 600.0, 250, 380, 500.0, p3, "."),
    ]
    for tid, conv, idx, label, ttft, start, call, pn, cn, pms, text, out in turns:
        con.execute("insert into turns values (?, ?, ?, ?, 'ok', ?, 1.0)",
                    (tid, conv, idx, label, ttft))
        con.execute("insert into steps values (?, 'classify', 0, ?, 'ok')", (tid, start))
        con.execute("insert into steps values (?, 'compose', ?, 2000, 'ok')", (tid, start))
        timings = {"cache_n": cn, "prompt_n": pn, "prompt_ms": pms,
                   "prompt_per_token_ms": pms / pn, "predicted_n": 20, "predicted_ms": 400.0}
        con.execute("insert into calls values (?, 'compose', 1, 1, 'not_fired', ?, 2.0, ?, ?, "
                    "?, ?, ?)", (tid, call, pn + cn, cn, json.dumps(timings), prompt(text), out))
    con.commit()
    con.close()


def test_followup_floor_reads_a_log(tmp_path: Path) -> None:
    # the benchmark itself replays on the embedded model; here it reads a log written by
    # hand (--from-dir) and is checked on what it computes from it
    _followup_log(tmp_path / "run-1.db")
    kept = {"command": "python benchmarks/followup_floor.py", "runs": [{"db": "run-1.db"}]}
    (tmp_path / "runs.json").write_text(json.dumps(kept), encoding="utf-8")
    res = run_benchmark("followup_floor", tmp_path, "--from-dir", str(tmp_path),
                        "--no-tokenize", "--example", "a")  # fmt: skip
    assert res["turns_ok"] == 5 and res["compose_calls_without_server_timings"] == 0
    assert res["turn_1"]["answer_ttft_ms"]["n"] == 2
    later = res["turns_2_on"]
    assert later["answer_ttft_ms"]["n"] == 3 and later["answer_ttft_ms"]["p50"] == 600.0
    assert res["turns_2_on_stayed"]["answer_ttft_ms"]["n"] == 1  # a's turn 2
    assert res["turns_2_on_changed"]["answer_ttft_ms"]["n"] == 2  # a's 3 (policy), b's 2
    by_turn = {(t["conversation"], t["turn_index"]): t for t in res["per_turn"]}
    a2 = by_turn[("a", 2)]
    assert a2["after_call"] == 300.0 - 20.0 - 250.0
    assert a2["call_ttft_minus_prompt"] == 100.0 and a2["new_material"] is False
    assert by_turn[("a", 3)]["label_changed"] is True
    # what is new in a's turn 2: the shown answer's product line (history), the
    # catalogue's "as above" line, the message and the lead, after the cached prefix
    example = {t["turn_index"]: t for t in res["example_conversation"]["turns"]}
    assert [name for name, _ in example[2]["new_parts"]] == [
        "history", "catalogue", "message", "lead"]
    assert example[2]["new_parts"][0][1].startswith("\n- Coat, A-1")
    assert [name for name, _ in example[3]["new_parts"]][:2] == ["history", "policy_section"]
    # the floor: median prompt_n x median ms/token + median (TTFT - prompt) + before + after
    m = later["medians"]
    fl = later["floor"]
    assert fl["prompt"] == round(m["prompt_n"] * m["prompt_per_token_ms"], 1)
    assert fl["total_ms"] == round(fl["prompt"] + m["call_ttft_minus_prompt"]
                                   + m["before_compose"] + m["after_call"], 1)
    assert res["tokenized_by_server"] is False
    assert res["new_prompt_tokens_by_part"]["later"]["n"] == 0
    # a's turn 2 found 310 cached of turn 1's 300 prompt tokens; b's 290 of 280; a's
    # turn 3 380 of turn 2's 370: nothing of the previous prompt recomputed
    assert res["previous_prompt_tokens_not_reused"] == {"n": 3, "median": -10.0, "max": -10.0,
                                                         "over_20": 0}
