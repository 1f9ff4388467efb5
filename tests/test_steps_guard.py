"""The guard step: Llama Guard verdicts, the missing-verdict policy, and an input guard
raced against the answer step whose `unsafe` cancels the in-flight compose call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.events import TokenDelta
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply

GUARD_PROMPT = "Task: check the user message.\nUser: {message}\nVerdict:"


@pytest.fixture(scope="module")
def slow_lab() -> Iterator[LabServer]:
    # the compose call streams 40 tokens 50 ms apart: still in flight when the guard answers
    with LabServer("fast", n_tokens=40, per_token_ms=50) as lab:
        yield lab


def guard_config(compose_url: str, on_missing: str | None = "closed", **guard: Any) -> Any:
    step: dict[str, Any] = {"provider": "guard", "prompt": GUARD_PROMPT, "kind": "guard",
                            "deadline_s": 2.0, **guard}  # fmt: skip
    if on_missing is not None:
        step["on_missing_verdict"] = on_missing
    return config_from_dict({
        "order": ["guard", "compose"],
        "providers": {"local": {"base_url": compose_url}, "guard": {"base_url": compose_url}},
        "steps": {"guard": step, "compose": {"prompt": "{message}", "stream": True,
                                            "max_output_tokens": 40}},
    })  # fmt: skip


def test_a_guard_without_on_missing_verdict_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"steps\.guard\.on_missing_verdict"):
        guard_config("http://127.0.0.1:9/v1", on_missing=None)


async def run_with_guard(lab: LabServer, reply: FakeReply, **guard: Any) -> tuple[Any, Any, list]:  # type: ignore[type-arg]
    cfg = guard_config(lab.base_url, **guard)
    fake = FakeProvider(name="guard", script=lambda req: reply)
    shown: list[str] = []
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"guard": fake}) as chain:
            done = None
            async for ev in chain.stream_turn("how do I hurt someone"):
                if isinstance(ev, TokenDelta):
                    shown.append(ev.text)
                done = ev
            steps = {s.step: s for s in store.steps(chain.run_id or 0)}
    return done, steps, shown


async def test_unsafe_input_guard_cancels_the_in_flight_compose_call(slow_lab: LabServer) -> None:
    slow_lab.reset()
    done, steps, shown = await run_with_guard(slow_lab, FakeReply("unsafe\nS1", ttft_s=0.3))
    assert done.status == "refused"
    assert done.verdicts["guard"] == {"status": "unsafe", "categories": ["S1"], "missing": None}
    assert shown == []  # nothing of the compose stream reached the user
    assert steps["compose"].status == "cancelled"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        records = slow_lab.requests()
        if records and records[0]["disconnected"]:
            break
        await asyncio.sleep(0.05)
    assert len(records) == 1 and records[0]["disconnected"]  # the lab saw the disconnect
    assert not records[0]["completed"]


async def test_safe_input_guard_releases_the_held_answer(slow_lab: LabServer) -> None:
    slow_lab.reset()
    done, _, shown = await run_with_guard(slow_lab, FakeReply("safe", ttft_s=0.2))
    assert done.status == "ok" and done.verdicts["guard"]["status"] == "safe"
    assert "".join(shown) == done.output and shown


@pytest.mark.parametrize(("policy", "status"), [("open", "ok"), ("closed", "refused")])
async def test_missing_verdict_follows_the_policy_and_logs_its_reason(
    slow_lab: LabServer, policy: str, status: str
) -> None:
    done, steps, _ = await run_with_guard(
        slow_lab, FakeReply("probably fine", ttft_s=0.01), on_missing=policy
    )
    assert done.status == status
    missing = {"status": "missing", "categories": [], "missing": "unparseable"}
    assert done.verdicts["guard"] == missing
    assert steps["guard"].status == ("failed_open" if policy == "open" else "failed_closed")
    slow = await run_with_guard(slow_lab, FakeReply("safe", ttft_s=5.0), on_missing=policy)
    assert slow[0].verdicts["guard"]["missing"] == "timeout"
    assert slow[0].status == status
