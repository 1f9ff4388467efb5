"""History as the model reads it best: for a chat model the earlier turns go as role
messages (the turn's user message, its tool calls with their results, the answer)
before the new user message; a completion-style model (the embedded one) keeps the
transcript inside the user message. The lab is the model (it calls a tool on every
turn's first round) and records every request's messages."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from counted_tools import ORDER

from chainrun import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.steps.model_call import resolve_history_layout


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=4, tool_calls={"rounds": 1}, record_bodies=True) as lab:
        yield lab


def _config(lab: LabServer, layout: str) -> Any:
    return config_from_dict({
        "order": ["compose"], "answer_step": "compose",
        "providers": {"lab": {"base_url": lab.base_url}},
        "steps": {"compose": {"provider": "lab", "system": "You sell shoes.",
                              "prompt": "{history}Shopper: {message}\nStylist:",
                              "tools": ["order_status"], "history_layout": layout}},
        "tools": {"order_status": ORDER},
    })  # fmt: skip


async def _two_turns(cfg: Any) -> list[str]:
    answers = []
    async with Chain(cfg, quiet=True) as chain:
        for message in ("where is order 12?", "and order 13?"):
            done = await chain.run_turn(message, conversation_id="conv-m")
            assert done.status == "ok", done
            answers.append(done.output or "")
    return answers


def _first_request_of(lab: LabServer, message: str) -> list[dict[str, Any]]:
    for r in lab.requests():
        msgs = r["messages"]
        if message in str(msgs[-1].get("content")):
            return list(msgs)
    raise AssertionError(f"no request ending with {message!r}")


def test_a_chat_models_history_is_role_messages_with_the_tool_calls(lab: LabServer) -> None:
    lab.reset()
    answers = asyncio.run(_two_turns(_config(lab, "messages")))
    msgs = _first_request_of(lab, "and order 13?")
    roles = [m["role"] for m in msgs]
    # system; turn 1: user, the assistant's tool call, its result, the answer; turn 2: user
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert msgs[1]["content"] == "Shopper: where is order 12?\nStylist:"
    call = msgs[2]["tool_calls"][0]
    assert call["function"]["name"] == "order_status"
    assert msgs[3]["tool_call_id"] == call["id"] and "shipped" in msgs[3]["content"]
    assert msgs[4] == {"role": "assistant", "content": answers[0].strip()}
    # the new user message carries no transcript of the earlier turn
    assert msgs[5]["content"] == "Shopper: and order 13?\nStylist:"


def test_a_completion_models_history_stays_a_transcript(lab: LabServer) -> None:
    lab.reset()
    answers = asyncio.run(_two_turns(_config(lab, "transcript")))
    msgs = _first_request_of(lab, "and order 13?")
    assert [m["role"] for m in msgs] == ["system", "user"]
    text = msgs[1]["content"]
    assert text.startswith(f"Shopper: where is order 12?\nStylist: {answers[0].strip()}\n\n")
    assert text.endswith("Shopper: and order 13?\nStylist:")


def test_auto_layout_is_messages_for_openai_and_azure_only() -> None:
    cfg = config_from_dict({"providers": {
        "o": {"base_url": "https://api.openai.com/v1"},
        "a": {"kind": "azure", "endpoint": "https://x.openai.azure.com",
              "api_version": "2024-10-21", "api_key_env": "K"},
        "l": {"base_url": "http://127.0.0.1:8080/v1"}, "e": {}}})  # fmt: skip
    layouts = {n: resolve_history_layout("auto", p) for n, p in cfg.providers.items()}
    assert layouts == {"o": "messages", "a": "messages", "l": "transcript", "e": "transcript",
                       "local": "transcript"}  # the default chain's embedded model
    assert resolve_history_layout("messages", cfg.providers["e"]) == "messages"
