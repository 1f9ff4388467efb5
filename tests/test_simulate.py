"""chainrun simulate: closed forms, an independent small simulation, and the CLI's keys."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chainrun.analysis.simulate import (
    Bimodal,
    lognormal_quantile_ms,
    simulate_bimodal,
    simulate_lognormal,
)
from chainrun.cli import app
from chainrun.errors import UserInputError


@pytest.fixture(scope="module")
def lognormal() -> dict:  # type: ignore[type-arg]
    return simulate_lognormal(
        median_ms=8, sigma=0.6, checks=[1, 2, 4, 8], hedge_quantile=0.95, requests=200_000, seed=1
    )


def test_hedging_at_the_p95_costs_five_percent(lognormal: dict) -> None:  # type: ignore[type-arg]
    for k in ("1", "2", "4", "8"):
        assert lognormal["by_k"][k]["hedged"]["extra_load"] == pytest.approx(0.05, abs=0.002)
    assert lognormal["closed_form"]["hedged_extra_load"] == pytest.approx(0.05)
    assert lognormal["hedge_delay_ms"] == pytest.approx(8 * math.exp(0.6 * 1.6448536), rel=1e-4)


def test_single_check_and_parallel_quantiles_match_closed_forms(lognormal: dict) -> None:  # type: ignore[type-arg]
    one = lognormal["by_k"]["1"]
    assert one["sequential"]["p50_ms"] == pytest.approx(8.0, rel=0.01)
    assert one["sequential"]["p99_ms"] == pytest.approx(
        lognormal_quantile_ms(8, 0.6, 0.99), rel=0.02
    )
    for k in ("2", "4", "8"):
        for p in ("p50_ms", "p90_ms", "p99_ms"):
            got = lognormal["by_k"][k]["parallel"][p]
            assert got == pytest.approx(
                lognormal["closed_form"]["by_k"][k]["parallel"][p], rel=0.02
            )


def test_sequential_median_grows_about_k_fold_and_hedging_cuts_the_tail(lognormal: dict) -> None:  # type: ignore[type-arg]
    base = lognormal["by_k"]["1"]["sequential"]["p50_ms"]
    for k in (2, 4, 8):
        ratio = lognormal["by_k"][str(k)]["sequential"]["p50_ms"] / base
        assert k <= ratio <= 1.3 * k  # the mean of a log-normal exceeds its median
        modes = lognormal["by_k"][str(k)]
        assert (
            modes["hedged"]["p99_ms"] < modes["parallel"]["p99_ms"] < modes["sequential"]["p99_ms"]
        )
        ci = modes["parallel"]["p99_ci95_ms"]
        assert ci[0] <= modes["parallel"]["p99_ms"] <= ci[1]


def test_agrees_with_an_independent_small_simulation(lognormal: dict) -> None:  # type: ignore[type-arg]
    """Plain Python, no NumPy: 4 checks, sequential / parallel / hedged medians and p90s."""
    rng = random.Random(3)
    t = lognormal["hedge_delay_ms"]
    seq, par, hed = [], [], []
    for _ in range(20_000):
        xs = [rng.lognormvariate(math.log(8), 0.6) for _ in range(4)]
        seq.append(sum(xs))
        par.append(max(xs))
        hed.append(max(min(x, t + rng.lognormvariate(math.log(8), 0.6)) for x in xs))
    for mode, values in (("sequential", seq), ("parallel", par), ("hedged", hed)):
        q = statistics.quantiles(values, n=10)
        assert lognormal["by_k"]["4"][mode]["p50_ms"] == pytest.approx(q[4], rel=0.03), mode
        assert lognormal["by_k"]["4"][mode]["p90_ms"] == pytest.approx(q[8], rel=0.04), mode


def test_bimodal_guard_closed_forms() -> None:
    res = simulate_bimodal(
        Bimodal(0.5, (100, 300), (3000, 19000)),
        deadline_s=3, every_ms=[1000, 350], attempts=[1, 3, 8], requests=200_000, seed=2,
    )  # fmt: skip
    rows = {(g["every_ms"], g["attempts"]): g for g in res["grid"]}
    single = rows[(1000, 1)]
    assert single["in_time"] == pytest.approx(0.5, abs=0.005) and single["calls_per_check"] == 1
    three = rows[(1000, 3)]
    assert three["closed_form"] == {"in_time": 0.875, "calls_per_check": 1.75}
    assert three["in_time"] == pytest.approx(0.875, abs=0.004)
    assert three["calls_per_check"] == pytest.approx(1.75, abs=0.01)
    eight = rows[(350, 8)]
    assert eight["closed_form"]["in_time"] == pytest.approx(1 - 1 / 256, abs=1e-5)
    assert eight["in_time"] == pytest.approx(1 - 1 / 256, abs=0.001)
    assert eight["extra_calls_per_check"] == pytest.approx(0.99, abs=0.01)
    assert rows[(350, 3)]["attempts"] == 3


def test_bad_input_is_a_user_error() -> None:
    with pytest.raises(UserInputError, match="median"):
        simulate_lognormal(median_ms=0, sigma=0.6, checks=[1])
    with pytest.raises(UserInputError, match="quantile"):
        simulate_lognormal(median_ms=8, sigma=0.6, checks=[1], hedge_quantile=1.5)
    with pytest.raises(UserInputError, match="fast-share"):
        Bimodal(1.5)


def test_cli_json_keys_and_plot(tmp_path: Path) -> None:
    runner = CliRunner()
    png = tmp_path / "p99.png"
    res = runner.invoke(app, [
        "simulate", "--dist", "lognormal", "--median-ms", "8", "--sigma", "0.6",
        "--checks", "1,2,4,8", "--hedge-quantile", "0.95", "--requests", "20000",
        "--seed", "1", "--json", "--plot", str(png),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc["by_k"]) == {"1", "2", "4", "8"}
    for modes in doc["by_k"].values():
        assert set(modes) == {"sequential", "parallel", "hedged"}
        for s in modes.values():
            assert {"p50_ms", "p90_ms", "p99_ms", "n"} <= set(s)
        assert "extra_load" in modes["hedged"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = runner.invoke(app, ["simulate", "--checks", "1,x"])
    assert bad.exit_code == 2 and "--checks" in bad.output
    text = runner.invoke(app, ["simulate", "--dist", "bimodal", "--requests", "5000"])
    assert text.exit_code == 0 and "in time" in text.output
