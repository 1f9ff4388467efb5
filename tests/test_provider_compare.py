"""``compare --by provider`` on the latency lab: two instances, one with more TTFT noise
(serving), one generating longer answers (work), told apart with n and intervals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chainrun.analysis.provider_compare import (
    compare_providers,
    contributions,
    differ_only_in_provider,
    hidden_reasoning,
    tpot_ms,
)
from chainrun.cli import app
from chainrun.config import config_from_dict
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import Lognormal
from chainrun.log.store import Store
from chainrun.replay.run import ReplayRequest, run_requests

N = 45  # enough for a bounded p90 difference (the conservative interval needs n >= 42)


def lab_scenario(name: str, median_ms: float, sigma: float, n_tokens: int) -> Scenario:
    return Scenario(name=name, n_tokens=n_tokens, per_token_ms=4,
                    latency=Lognormal(median_ms=median_ms, sigma=sigma))  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, int]]]:
    """Three runs of the same requests: a baseline instance, a noisy one, a verbose one."""
    db = tmp_path_factory.mktemp("by-provider") / "log.db"
    labs = {
        "base": lab_scenario("base", 30, 0.2, 20),
        "noisy": lab_scenario("noisy", 150, 0.8, 20),  # more serving noise, same answers
        "verbose": lab_scenario("verbose", 30, 0.2, 60),  # same serving, 3x the tokens
    }
    run_ids: dict[str, int] = {}
    requests = [ReplayRequest(id=f"q{i}", message=f"question number {i}") for i in range(N)]
    with Store.open(db) as store:
        for name, scenario in labs.items():
            with LabServer(scenario) as lab:
                cfg = config_from_dict({
                    "order": ["answer"], "answer_step": "answer",
                    "providers": {name: {"base_url": lab.base_url}},
                    "steps": {"answer": {"provider": name, "prompt": "{message}",
                                         "stream": True, "max_output_tokens": 100}},
                })  # fmt: skip
                run_ids[name] = asyncio.run(
                    run_requests(cfg, requests, store, concurrency=2, quiet=True)
                )
    yield db, run_ids


def test_noisy_instance_is_serving(runs: tuple[Path, dict[str, int]]) -> None:
    db, ids = runs
    with Store.open(db, create=False) as store:
        doc = compare_providers(store, str(ids["base"]), str(ids["noisy"]))
    step = doc["steps"]["answer"]
    assert step["a"]["n_calls"] == step["b"]["n_calls"] == N
    assert step["a"]["ttft_ms"]["n"] == N and step["b"]["output_tokens"]["p50_ci"] is not None
    assert step["a"]["provider"] == ["base"] and step["b"]["provider"] == ["noisy"]
    assert step["changes"]["ttft_ms"]["status"] == "up"
    assert step["changes"]["output_tokens"]["status"] == "similar"
    assert step["verdict"]["duration"] == "worse"
    assert step["verdict"]["cause"] == "serving"
    assert "another provider or route can fix" in step["verdict"]["explanation"]


def test_verbose_instance_is_work(runs: tuple[Path, dict[str, int]]) -> None:
    db, ids = runs
    with Store.open(db, create=False) as store:
        doc = compare_providers(store, str(ids["base"]), str(ids["verbose"]))
    step = doc["steps"]["answer"]
    assert step["changes"]["output_tokens"]["status"] == "up"
    assert step["changes"]["output_tokens"]["p50_diff"] == 40
    assert step["changes"]["tpot_ms"]["status"] != "up"
    assert step["verdict"]["duration"] == "worse" and step["verdict"]["cause"] == "work"
    parts = step["contributions_ms"]
    assert parts["tokens"] > 100  # 40 more tokens at ~4 ms each
    assert parts["tokens"] >= 2 * max(0.0, parts["ttft"])


def test_the_two_instances_told_apart_and_a_a_is_no_change(
    runs: tuple[Path, dict[str, int]],
) -> None:
    db, ids = runs
    with Store.open(db, create=False) as store:
        noisy_vs_verbose = compare_providers(store, str(ids["noisy"]), str(ids["verbose"]))
        same = compare_providers(store, str(ids["noisy"]), str(ids["noisy"]))
    step = noisy_vs_verbose["steps"]["answer"]
    # B (verbose) generates more (work) while its TTFT fell (better serving)
    assert step["changes"]["output_tokens"]["status"] == "up"
    assert step["changes"]["ttft_ms"]["status"] == "down"
    assert step["verdict"]["cause"] == "work"
    a_a = same["steps"]["answer"]
    assert a_a["verdict"]["duration"] == "inconclusive" and a_a["verdict"]["cause"] is None
    assert {c["status"] for c in a_a["changes"].values()} == {"similar"}


def test_cli_by_provider_json_and_table(runs: tuple[Path, dict[str, int]]) -> None:
    db, ids = runs
    base = ["compare", str(ids["base"]), str(ids["noisy"]), "--db", str(db)]
    runner = CliRunner()
    res = runner.invoke(app, [*base, "--by", "provider", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["steps"]["answer"]["verdict"]["cause"] == "serving"
    res = runner.invoke(app, [*base, "--by", "provider"], terminal_width=200)
    assert res.exit_code == 0 and "answer: B slower" in res.stdout
    assert "ttft:up" in res.stdout and "serving" in res.stdout
    bad = runner.invoke(app, [*base, "--by", "model"])
    assert bad.exit_code == 2 and "--by: expected 'provider'" in bad.stderr


def test_time_per_output_token_definition() -> None:
    assert tpot_ms({"duration_ms": 130.0, "ttft_ms": 30.0, "output_tokens": 11}) == 10.0
    assert tpot_ms({"duration_ms": 130.0, "ttft_ms": 30.0, "output_tokens": 1}) is None
    assert tpot_ms({"duration_ms": 130.0, "ttft_ms": None, "output_tokens": 11}) is None


def test_runs_differing_only_in_provider_get_the_split_without_by(
    runs: tuple[Path, dict[str, int]],
) -> None:
    db, ids = runs
    with Store.open(db, create=False) as store:
        assert differ_only_in_provider(store, str(ids["base"]), str(ids["noisy"]))
        assert not differ_only_in_provider(store, str(ids["base"]), str(ids["base"]))
        assert not differ_only_in_provider(store, "live", str(ids["base"]))
        other = config_from_dict({
            "order": ["answer"], "answer_step": "answer",
            "providers": {"base": {"base_url": "http://127.0.0.1:9/v1"}},
            "steps": {"answer": {"provider": "base", "prompt": "{message}",
                                 "stream": True, "max_output_tokens": 50}},
        })  # fmt: skip
        changed = store.create_run("replay", other.snapshot())
        # a different token cap is a different request, not only another provider
        assert not differ_only_in_provider(store, str(ids["base"]), str(changed))
    res = CliRunner().invoke(
        app, ["compare", str(ids["base"]), str(ids["noisy"]), "--db", str(db), "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["by_provider"]["steps"]["answer"]["verdict"]["cause"] == "serving"


def test_hidden_reasoning_time_moves_from_ttft_to_work() -> None:
    """Unstreamed reasoning sits inside TTFT: its time is work, not serving."""
    hidden = [{"reasoning_tokens": 16, "reasoning": None}] * 3
    shown = [{"reasoning_tokens": 16, "reasoning": "thinking"}] * 3
    assert hidden_reasoning(hidden) == 16 and hidden_reasoning(shown) is None
    va = {"ttft_ms": [80.0], "tpot_ms": [4.0], "output_tokens": [24.0]}
    vb = {"ttft_ms": [150.0], "tpot_ms": [4.0], "output_tokens": [40.0]}
    raw = contributions(va, vb)
    assert raw == {"ttft": 70.0, "per_token": 0.0, "tokens": 64.0}
    # 16 hidden reasoning tokens at 4 ms: 64 ms of the TTFT rise is work
    assert contributions(va, vb, (None, 16.0))["ttft"] == 6.0
