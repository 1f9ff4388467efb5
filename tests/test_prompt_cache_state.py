"""The server's prompt cache decides TTFT: every TTFT figure says the cached share,
``compare`` warns when the two sides' cache states differ, and a replay can choose the
cache state it measures.

The lab emulates llama-server's prompt cache (a prompt seen before is cached and its
first token comes 20 times sooner; ``"cache_prompt": false`` neither uses nor fills the
cache). The same replay twice: the first run meets a cold cache, the second a warm one,
and ``compare`` of the two reported a twenty-fold "improvement" that was cache state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import Lognormal, PromptCache

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    scenario = Scenario(name="cache", n_tokens=4, per_token_ms=1,
                        latency=Lognormal(median_ms=150.0, sigma=0.05),
                        prompt_cache=PromptCache(warm_ttft_factor=0.05))  # fmt: skip
    with LabServer(scenario) as lab:
        yield lab


def chainrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chainrun", *args], capture_output=True,
                          text=True, timeout=180, cwd=ROOT)  # fmt: skip


@pytest.fixture
def setup(lab: LabServer, tmp_path: Path) -> tuple[Path, Path, Path]:
    lab.reset()  # an empty prompt cache
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
    replay = tmp_path / "set.jsonl"
    replay.write_text("".join(json.dumps({"id": f"r{i}", "message": f"is the shirt {i} small?"})
                              + "\n" for i in range(6)))  # fmt: skip
    return cfg, replay, tmp_path / "log.db"


def replay(cfg: Path, replay: Path, db: Path, *extra: str) -> dict:
    proc = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db), "--json",
                    *extra)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_compare_says_when_cache_state_explains_a_ttft_difference(
    setup: tuple[Path, Path, Path],
) -> None:
    cfg, path, db = setup
    cold = replay(cfg, path, db)
    warm = replay(cfg, path, db)
    # the summaries put the cached share beside every TTFT figure
    compose_cold, compose_warm = cold["steps"]["compose"], warm["steps"]["compose"]
    assert compose_cold["ttft_cached_share"] == 0.0
    assert compose_warm["ttft_cached_share"] > 0.9
    assert cold["answer_ttft"]["cached_share"] == 0.0
    assert warm["answer_ttft"]["cached_share"] > 0.9
    proc = chainrun("compare", str(cold["run_id"]), str(warm["run_id"]), "--db", str(db),
                    "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    cache = doc["cache"]
    assert cache["a"]["share"] == 0.0 and cache["b"]["share"] > 0.9
    assert cache["differs"] is True and "cache" in cache["warning"]
    llm = doc["metrics"]["compose"]["llm"]
    assert llm["a"]["cached_share"]["share"] == 0.0 and llm["b"]["cached_share"]["share"] > 0.9
    assert llm["cache_warning"]
    # like with like: no calls in the same cache state on both sides, so no TTFT verdict
    assert llm["like_with_like"]["status"] == "no_common_cache_state"
    text = chainrun("compare", str(cold["run_id"]), str(warm["run_id"]), "--db", str(db))
    assert text.returncode == 0, text.stderr
    assert "cache" in text.stdout and "0% cached" in text.stdout


def test_a_replay_can_measure_a_cold_cache(
    lab: LabServer, setup: tuple[Path, Path, Path]
) -> None:
    cfg, path, db = setup
    first = replay(cfg, path, db, "--prompt-cache", "off")
    second = replay(cfg, path, db, "--prompt-cache", "off")
    recs = lab.requests()
    assert recs and all(r["cache_prompt"] is False for r in recs)  # sent on every request
    assert all(r["cached_tokens"] == 0 for r in recs)
    for run in (first, second):
        assert run["steps"]["compose"]["ttft_cached_share"] == 0.0
        assert run["prompt_cache"] == "off"
    proc = chainrun("compare", str(first["run_id"]), str(second["run_id"]), "--db", str(db),
                    "--json")  # fmt: skip
    doc = json.loads(proc.stdout)
    assert doc["cache"]["differs"] is False and doc["cache"]["warning"] is None


def test_show_prints_the_cached_share(setup: tuple[Path, Path, Path]) -> None:
    cfg, path, db = setup
    replay(cfg, path, db)
    run = replay(cfg, path, db)
    proc = chainrun("show", str(run["run_id"]), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    assert "cached" in proc.stdout
    doc = json.loads(chainrun("show", str(run["run_id"]), "--db", str(db), "--json").stdout)
    assert doc["summary"]["steps"]["compose"]["ttft_cached_share"] > 0.9
