"""Item 4 on a real hedged run: the latency lab's ``work-noise`` scenario (low noise) over
HTTP, the setup of ``benchmarks/hedge_work_noise.py`` scaled down to a test.

W (tokens x time per token, fixed per request content) dominates and the serving noise
N is small, so a percentile delay fires on long answers and the copy, carrying the same
W, loses: the audit must fail the hedge and say why (W + N)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from chainrun.audit import audit
from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer, load_scenario
from chainrun.lab.scenarios import WorkNoise
from chainrun.log.store import Store

TURNS = 90
CONCURRENCY = 15


async def _drive(chain: Chain, messages: list[str]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(message: str) -> None:
        async with gate:
            await chain.run_turn(message)

    async with asyncio.TaskGroup() as tg:
        for m in messages:
            tg.create_task(one(m))


async def test_item4_fails_the_low_noise_work_noise_hedge_with_the_w_plus_n_reason(
    tmp_path: Path,
) -> None:
    base = load_scenario("work-noise", seed=0)
    assert isinstance(base.latency, WorkNoise)
    # W = 20-120 tokens x 25 ms (the benchmark: 20-200 x 10 ms), N lognormal with a 30 ms
    # median. A fixed d of 2.1 s (the benchmark adapts to the p95) fires on about 40% of
    # the turns, the longest answers: 90 turns give over 30 fires. W is
    # long next to the lag of a busy test machine's own event loop (a late client fires
    # copies at random, which is the client's noise, not the server's).
    scenario = base.model_copy(update={"latency": base.latency.model_copy(
        update={"per_token_ms": 25.0, "tokens_min": 20, "tokens_max": 120})})  # fmt: skip
    with LabServer(scenario) as lab, Store.open(tmp_path / "log.db") as store:
        config = config_from_dict({
            "order": ["guard"], "answer_step": "guard",
            "providers": {"lab": {"base_url": lab.base_url, "max_connections": 100}},
            "steps": {"guard": {
                "provider": "lab", "prompt": "{message}", "max_output_tokens": 256,
                "deadline_s": 30.0, "stream": False, "on_failure": "open",
                "hedge": {"delay_ms": 2100, "max_attempts": 2, "shadow_fraction": 1.0,
                          "max_extra_load": 1.0},
            }},
        })  # fmt: skip
        messages = [f"turn {i}: describe the linen shirt and how it fits" for i in range(TURNS)]
        async with Chain(config, store=store, kind="replay", label="work-noise") as chain:
            await _drive(chain, messages)
        report = audit(store)
    item = report.items[3]
    f = item.figures["steps"]["guard"]
    assert f["n_fired"] >= 30, f
    assert item.verdict == "fail", item.notes
    assert f["win_rate"] < 0.05
    # where the fires land (long answers: "work") is not asserted: on a loaded test machine
    # the client's own loop lag fires copies at random too (client noise); the figures
    # are reported either way
    assert f["diagnosis"] in ("work", "mixed", "noise")
    assert f["output_tokens"]["n_fired"] == f["n_fired"]
    text = " ".join(item.notes)
    assert "N1 − N2 > d" in text and "W cancels out" in text
    assert "extra calls per 1,000 turns" in text
