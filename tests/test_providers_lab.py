"""The Responses API adapter and Azure OpenAI over real HTTP: the latency lab, the real
``openai`` client, the chain and its log. Same scenarios and faults as Chat Completions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import Faults, Lognormal
from chainrun.log.store import Store
from chainrun.replay.run import ReplayRequest, run_requests

MESSAGES = ["a linen shirt for summer?", "does the wool coat run small?", "denim jacket washes"]


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    # 20 hidden reasoning tokens (Responses only), 12 text tokens, 5 ms apart
    scenario = Scenario(
        name="providers",
        n_tokens=12,
        per_token_ms=5,
        reasoning_tokens=20,
        latency=Lognormal(median_ms=20, sigma=0.01),
    )
    with LabServer(scenario) as server:
        yield server


def chain_config(providers: dict[str, Any], step: dict[str, Any] | None = None) -> Any:
    answer = {
        "provider": "p",
        "prompt": "{message}",
        "stream": True,
        "max_output_tokens": 64,
        "deadline_s": 10.0,
        "on_failure": "closed",
        **(step or {}),
    }
    return config_from_dict(
        {
            "order": ["answer"],
            "answer_step": "answer",
            "providers": providers,
            "steps": {"answer": answer},
        }
    )


async def replay(cfg: Any, store: Store, messages: list[str] = MESSAGES) -> list[dict[str, Any]]:
    requests = [ReplayRequest(id=f"r{i}", message=m) for i, m in enumerate(messages)]
    run_id = await run_requests(cfg, requests, store, quiet=True)
    return [c.model_dump() for c in store.calls(run_id)]


async def wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def root(lab: LabServer) -> str:
    return lab.base_url.removesuffix("/v1")


# ------------------------------------------------------------------ Responses API


async def test_responses_replay_fills_the_same_call_columns_as_chat_completions(
    lab: LabServer,
) -> None:
    with Store.open(":memory:") as store:
        chat = await replay(chain_config({"p": {"base_url": lab.base_url}}), store)
        resp = await replay(
            chain_config({"p": {"base_url": lab.base_url, "api": "responses"}}), store
        )
    assert len(chat) == len(resp) == len(MESSAGES)
    for c, r in zip(chat, resp, strict=True):
        # every column known for one API is known for the other (unknown is NULL on both)
        unknown = {k for k, v in c.items() if v is None}
        assert unknown == {k for k, v in r.items() if v is None}, (c, r)
        assert r["output"] == c["output"] and r["finish_reason"] == c["finish_reason"] == "stop"
        assert r["input_tokens"] == c["input_tokens"]
        # the Responses call also reasoned: 20 hidden tokens, included in output_tokens
        assert (r["reasoning_tokens"], c["reasoning_tokens"]) == (20, 0)
        assert r["output_tokens"] == c["output_tokens"] + 20
        assert r["response_id"].startswith("resp_") and r["cached_input_tokens"] == 0
        assert not r["truncated"] and r["error_type"] is None
        # without a summary nothing is visible while it reasons: TTFT >= 20 tokens x 5 ms
        assert r["ttft_ms"] >= 100
        # chunks: one per text delta plus the completed event (no created/in_progress)
        assert r["n_chunks"] == 12 + 1 and len(r["chunk_gaps_ms"]) == 12
    routes = {rec["route"] for rec in lab.requests()}
    assert routes == {"/v1/chat/completions", "/v1/responses"}


async def test_reasoning_summary_delta_is_the_first_token(lab: LabServer) -> None:
    cfg = chain_config(
        {"p": {"base_url": lab.base_url, "api": "responses"}},
        {"reasoning_effort": "low", "reasoning_summary": "auto"},
    )
    with Store.open(":memory:") as store:
        (call,) = await replay(cfg, store, ["summary please"])
    assert call["reasoning"].startswith("thinking1") and call["reasoning_tokens"] == 20
    # the first summary delta is the first token, long before the text: the reasoning
    # phase (20 tokens x 5 ms) and the 12 text tokens x 5 ms all came after it (the lab's
    # sleeps make this a lower bound, which a loaded machine cannot break)
    assert call["ttft_ms"] is not None and call["duration_ms"] - call["ttft_ms"] >= 100
    # effort "none" skips the reasoning phase in the lab
    cfg = chain_config(
        {"p": {"base_url": lab.base_url, "api": "responses"}}, {"reasoning_effort": "none"}
    )
    with Store.open(":memory:") as store:
        (call,) = await replay(cfg, store, ["no reasoning"])
    assert call["reasoning_tokens"] == 0 and call["reasoning"] is None


async def test_max_output_tokens_gives_length_and_counts_reasoning(lab: LabServer) -> None:
    cfg = chain_config(
        {"p": {"base_url": lab.base_url, "api": "responses"}}, {"max_output_tokens": 25}
    )
    with Store.open(":memory:") as store:
        (call,) = await replay(cfg, store, ["capped"])
    # 25 = 20 reasoning + 5 text: the response is incomplete (max_output_tokens)
    assert call["finish_reason"] == "length" and call["output_tokens"] == 25
    assert len(call["output"].split()) == 5


async def test_hedged_responses_step_settles_on_the_first_token_and_the_loser_disconnects(
    lab: LabServer,
) -> None:
    slow = Scenario(
        name="slow", n_tokens=12, per_token_ms=5, latency=Lognormal(median_ms=1500, sigma=0.01)
    )
    with LabServer(slow) as slow_lab:
        providers = {
            "p": {"base_url": slow_lab.base_url, "api": "responses"},
            "backup": {"base_url": lab.base_url, "api": "responses"},
        }
        hedge = {"delay_ms": 100, "max_attempts": 2, "max_extra_load": 1.0, "targets": ["backup"]}
        cfg = chain_config(providers, {"hedge": hedge, "reasoning_summary": "auto"})
        with Store.open(":memory:") as store:
            async with Chain(cfg, store=store) as chain:
                done = await chain.run_turn("hedge me")
                calls = {c.attempt: c.model_dump() for c in store.calls(chain.run_id)}
        assert done.status == "ok" and done.output
        # did not wait for the 1.5 s primary: it was cancelled before its first token
        assert calls[1]["outcome"] == "cancelled" and calls[1]["ttft_ms"] is None
        assert calls[2]["outcome"] == "duplicate"
        assert calls[1]["output_tokens"] is None and calls[2]["reasoning_tokens"] == 20
        await wait_for(lambda: slow_lab.requests()[0]["disconnected"])
        loser = slow_lab.requests()[0]
        assert loser["route"] == "/v1/responses" and loser["tokens_sent"] == 0
        assert not loser["completed"]


async def test_responses_faults_as_for_chat() -> None:
    """429 keeps its Retry-After, a cut stream is truncated, a missing usage stays unknown."""
    cases = [
        (Faults(rate_limit=1.0, retry_after_s=2), "http_429"),
        (Faults(cut_after_tokens={"k": 3, "p": 1.0}), "truncated"),
        (Faults(no_usage=1.0), None),
    ]
    for faults, error_type in cases:
        with LabServer(Scenario(name="f", n_tokens=6, per_token_ms=1, faults=faults)) as flab:
            cfg = chain_config(
                {"p": {"base_url": flab.base_url, "api": "responses"}}, {"on_failure": "open"}
            )
            with Store.open(":memory:") as store:
                (call,) = await replay(cfg, store, ["fault"])
        assert call["error_type"] == error_type, (faults, call)
        if error_type == "truncated":
            assert call["truncated"] and len(call["output"].split()) == 3
        if error_type is None:
            assert call["output_tokens"] is None and call["input_tokens"] is None
            assert call["finish_reason"] == "stop"
        if error_type == "http_429":
            assert "rate limited" in call["error_message"]


# ------------------------------------------------------------------ Azure OpenAI


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_azure_provider_replays_against_the_lab_azure_route(
    lab: LabServer, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    monkeypatch.setenv("CHAINRUN_TEST_AZURE_KEY", "azure-secret")
    provider = {
        "kind": "azure",
        "endpoint": root(lab),
        "api_version": "2024-10-21",
        "deployment": "shop-gpt",
        "api_key_env": "CHAINRUN_TEST_AZURE_KEY",
        "api": api,
    }
    lab.reset()
    with Store.open(":memory:") as store:
        calls = await replay(chain_config({"p": provider}), store)
        snapshot = store.get_run(calls[0]["run_id"]).config
    assert [c["error_type"] for c in calls] == [None] * len(MESSAGES)
    assert all(c["output_tokens"] and c["ttft_ms"] is not None for c in calls)
    records = [r for r in lab.requests() if r["route"] != "/openai/models"]
    want = (
        "/openai/deployments/shop-gpt/chat/completions"
        if api == "chat_completions"
        else "/openai/responses"
    )
    assert {r["route"] for r in records} == {want}
    assert {r["auth"] for r in records} == {"api-key"}
    if api == "chat_completions":
        assert {r["model"] for r in records} == {"shop-gpt"}  # the deployment answers
    assert "azure-secret" not in snapshot


async def test_azure_entra_token_and_refusals(
    lab: LabServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINRUN_TEST_AZURE_TOKEN", "entra-token")
    provider = {
        "kind": "azure",
        "endpoint": root(lab),
        "api_version": "2024-10-21",
        "entra_token_env": "CHAINRUN_TEST_AZURE_TOKEN",
    }
    lab.reset()
    with Store.open(":memory:") as store:
        (call,) = await replay(
            chain_config({"p": provider}, {"model": "dep-from-model"}), store, ["token please"]
        )
    assert call["error_type"] is None
    (rec,) = lab.requests()
    assert rec["auth"] == "bearer"
    assert rec["route"] == "/openai/deployments/dep-from-model/chat/completions"
    url = f"{root(lab)}/openai/deployments/d/chat/completions"
    body = {"messages": [{"role": "user", "content": "x"}]}
    async with httpx2.AsyncClient() as http:
        no_version = await http.post(url, json=body, headers={"api-key": "k"})
        no_key = await http.post(url, params={"api-version": "2024-10-21"}, json=body)
    assert no_version.status_code == 404 and no_key.status_code == 401
