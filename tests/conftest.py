"""Shared fixtures. Unit tests use the in-process fake provider and never touch the network."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from chainrun.config import ChainConfig, config_from_dict
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.store import Store


def reply_by_step(
    overrides: dict[str, FakeReply] | None = None,
) -> Callable[[ChatRequest], FakeReply]:
    """A fake script answering each default step plausibly (steps told apart by their prompt)."""
    overrides = overrides or {}

    def script(req: ChatRequest) -> FakeReply:
        prompt = req.messages[-1]["content"]
        if "Category:" in prompt:
            return overrides.get("classify", FakeReply("product_search", ttft_s=0.002))
        if "Review as JSON" in prompt:
            return overrides.get(
                "validate", FakeReply('{"ok": true, "reason": "fine"}', ttft_s=0.002)
            )
        if "more helpful" in prompt:
            return overrides.get("critique", FakeReply("Mention the price.", ttft_s=0.002))
        return overrides.get(
            "compose",
            FakeReply("Try the Storm Shell jacket at 89 euros.", ttft_s=0.005, gap_s=0.001),
        )

    return script


@pytest.fixture
def store() -> Store:
    s = Store.open(":memory:")
    yield s
    s.close()


@pytest.fixture
def config() -> ChainConfig:
    return config_from_dict({})


@pytest.fixture
def fake() -> FakeProvider:
    return FakeProvider(name="local", script=reply_by_step())
