"""The server's prompt cache decides TTFT: every TTFT figure says the cached share,
``compare`` warns when the two sides' cache states differ, and a replay can choose the
cache state it measures.

The lab emulates llama-server's prompt cache (a prompt seen before is cached and its
first token comes 20 times sooner; ``"cache_prompt": false`` neither uses nor fills the
cache). The same replay twice: the first run meets a cold cache, the second a warm one,
and ``compare`` of the two reported a twenty-fold "improvement" that was cache state.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chainrun.analysis.compare import compare
from chainrun.analysis.summary import latency_summary
from chainrun.audit import audit
from chainrun.config import config_from_dict
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import Lognormal, PromptCache
from chainrun.log.store import Store
from chainrun.replay.run import ReplayRequest, run_requests

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = [ReplayRequest(f"r{i}", f"is the shirt {i} small?") for i in range(5)]


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    scenario = Scenario(name="cache", n_tokens=4, per_token_ms=1,
                        latency=Lognormal(median_ms=120.0, sigma=0.05),
                        prompt_cache=PromptCache(warm_ttft_factor=0.05))  # fmt: skip
    with LabServer(scenario) as lab:
        yield lab


def chainrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chainrun", *args], capture_output=True,
                          text=True, timeout=180, cwd=ROOT)  # fmt: skip


def config(lab: LabServer, **provider: Any) -> Any:
    return config_from_dict({
        "order": ["compose"], "answer_step": "compose",
        "providers": {"local": {"base_url": lab.base_url, **provider}},
        "steps": {"compose": {"provider": "local", "prompt": "{message}", "stream": True}},
    })  # fmt: skip


@pytest.fixture(scope="module")
def cold_and_warm(lab: LabServer, tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[Path, int, int]:  # fmt: skip
    """The same replay twice on one lab: a cold cache, then a warm one."""
    lab.reset()
    db = tmp_path_factory.mktemp("cache") / "log.db"
    runs = []
    with Store.open(db) as store:
        for _ in range(2):
            runs.append(asyncio.run(run_requests(config(lab), REQUESTS, store, quiet=True)))
    return db, runs[0], runs[1]


def test_the_summary_says_the_cached_share_beside_ttft(cold_and_warm: tuple[Path, int, int]
                                                       ) -> None:  # fmt: skip
    db, cold, warm = cold_and_warm
    with Store.open(db) as store:
        a, b = latency_summary(store, cold), latency_summary(store, warm)
    assert a["steps"]["compose"]["ttft_cached_share"] == 0.0
    assert b["steps"]["compose"]["ttft_cached_share"] > 0.9
    assert a["answer_ttft"]["cached_share"] == 0.0 and b["answer_ttft"]["cached_share"] > 0.9
    assert a["prompt_cache"] == b["prompt_cache"] == "server"
    # the cache state is what made B twenty times faster
    assert b["steps"]["compose"]["ttft_p50_ms"] * 5 < a["steps"]["compose"]["ttft_p50_ms"]
    show = chainrun("show", str(warm), "--db", str(db))
    assert show.returncode == 0, show.stderr
    assert re.search(r"9\d% cached", show.stdout), show.stdout  # beside the TTFT p50


def test_the_audit_says_the_cached_share_in_items_1_and_5(
    cold_and_warm: tuple[Path, int, int],
) -> None:
    db, cold, warm = cold_and_warm
    with Store.open(db) as store:
        items = {run: audit(store, runs=[run]).items for run in (cold, warm)}
    for run, share in ((cold, 0.0), (warm, 0.9)):
        timed, tokens = items[run][0], items[run][4]
        (group,) = timed.figures["by_step_provider"]
        fig = tokens.figures["steps"]["compose"]["local"]
        if share == 0.0:
            assert group["ttft_cached_share"] == 0.0 and fig["ttft_cached_share"] == 0.0
        else:
            assert group["ttft_cached_share"] > share and fig["ttft_cached_share"] > share
        assert "prompt cached (TTFT)" in timed.tables[0].columns
        assert "prompt cached" in tokens.tables[0].columns


def test_compare_says_when_cache_state_explains_a_ttft_difference(
    cold_and_warm: tuple[Path, int, int],
) -> None:
    db, cold, warm = cold_and_warm
    proc = chainrun("compare", str(cold), str(warm), "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    cache = doc["cache"]
    assert cache["a"]["share"] == 0.0 and cache["b"]["share"] > 0.9
    assert cache["differs"] is True and "cache" in cache["warning"]
    llm = doc["steps"]["compose"]["llm"]
    assert llm["a"]["cached_share"]["share"] == 0.0 and llm["b"]["cached_share"]["share"] > 0.9
    assert llm["cache_warning"]
    # like with like: no calls in the same cache state on both sides, so no TTFT verdict
    assert llm["like_with_like"]["status"] == "no_common_cache_state"
    text = chainrun("compare", str(cold), str(warm), "--db", str(db))
    assert text.returncode == 0, text.stderr
    assert "A 0% cached" in text.stdout and "warning" in text.stdout


def test_a_replay_can_measure_a_cold_cache(lab: LabServer, tmp_path: Path) -> None:
    lab.reset()
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(f'order = ["compose"]\nanswer_step = "compose"\n'
                   f'[providers.local]\nbase_url = "{lab.base_url}"\n'
                   '[steps.compose]\nprovider = "local"\nprompt = "{message}"\n')  # fmt: skip
    replay = tmp_path / "set.jsonl"
    replay.write_text("".join(json.dumps({"id": r.id, "message": r.message}) + "\n"
                              for r in REQUESTS))  # fmt: skip
    db = tmp_path / "log.db"
    for _ in range(2):
        proc = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db), "--json",
                        "--prompt-cache", "off")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout)
        assert summary["prompt_cache"] == "off"
        assert summary["steps"]["compose"]["ttft_cached_share"] == 0.0
    recs = lab.requests()
    assert len(recs) == 2 * len(REQUESTS)
    assert all(r["cache_prompt"] is False and r["cached_tokens"] == 0 for r in recs)
    with Store.open(db) as store:
        first, second = sorted(r.id or 0 for r in store.list_runs())
        doc = compare(store, str(first), str(second))
    assert doc["cache"]["differs"] is False and doc["cache"]["warning"] is None
