"""Deterministic checks in the chain: a card number is blocked before any model call."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chainrun.chain import REFUSAL, Chain
from chainrun.checks.patterns import BLOCK_TEXTS, DEFAULT_BLOCK_TEXT
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.lab import LabServer
from chainrun.log.store import Store


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=5, per_token_ms=1) as server:
        yield server


def lab_chain_config(base_url: str, checks: dict | None = None):  # type: ignore[no-untyped-def,type-arg]
    return config_from_dict({
        "order": ["classify", "compose"], "providers": {"local": {"base_url": base_url}},
        # no retrieve step here: the compose prompt must not read {products}
        "steps": {"compose": {"prompt": "Shopper: {message}\nStylist:"}},
        "checks": checks or {},
    })  # fmt: skip


def chat_requests(lab: LabServer) -> list[dict]:  # type: ignore[type-arg]
    return lab.requests()  # one record per chat-completions request


async def test_a_card_number_is_blocked_with_no_model_call(lab: LabServer) -> None:
    lab.reset()
    cfg = lab_chain_config(lab.base_url)
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("Please charge my card 4111 1111 1111 1111 for the boots")
            # the shopper is told what to do (not the generic "try again"), and the
            # blocked number is not echoed
            assert done.status == "refused" and done.output == BLOCK_TEXTS["card"]
            assert done.output != REFUSAL and "don't share card numbers" in done.output
            assert "4111" not in done.output
            assert done.verdicts["checks"]["blocked"] is True
            assert [f["check"] for f in done.verdicts["checks"]["findings"]] == ["card"]
            assert chat_requests(lab) == []  # the lab received zero requests
            turn = store.turns(chain.run_id or 0)[0]
            assert "4111" not in turn.input and "[card]" in turn.input
            assert turn.output == BLOCK_TEXTS["card"]  # show and the log say the same
            steps = store.steps(chain.run_id or 0)
            assert {s.status for s in steps} == {"skipped"}
            assert store.calls(chain.run_id or 0) == []

            # a Luhn-invalid number is just a number: the turn goes on
            ok = await chain.run_turn("my order number is 4111 1111 1111 1112")
            assert ok.status == "ok" and "checks" not in ok.verdicts
            assert len(chat_requests(lab)) == 1  # compose's (classify calls no model)


async def test_the_block_text_is_configurable_per_check(lab: LabServer) -> None:
    lab.reset()
    own = "Please keep card details out of the chat; I can help with everything else."
    cfg = lab_chain_config(lab.base_url, {
        "block_texts": {"card": own},
        "patterns": [{"name": "secret", "regex": r"SECRET-\d+", "action": "block"}],
    })  # fmt: skip
    async with Chain(cfg) as chain:
        card = await chain.run_turn("card 4111 1111 1111 1111 please")
        assert (card.status, card.output) == ("refused", own)
        pattern = await chain.run_turn("my code is SECRET-1234")
        assert (pattern.status, pattern.output) == ("refused", DEFAULT_BLOCK_TEXT)
        assert "SECRET" not in pattern.output
    assert chat_requests(lab) == []


async def test_redaction_changes_what_the_model_sees(lab: LabServer) -> None:
    lab.reset()
    cfg = lab_chain_config(lab.base_url, {"email": "redact"})
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("write to anna@example.com about my parcel")
            assert done.status == "ok"
            prompts = [c.prompt for c in store.calls(chain.run_id or 0)]
            assert prompts and all("anna@example.com" not in p for p in prompts)
            assert any("[email]" in p for p in prompts)


def test_checks_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"checks\.card"):
        config_from_dict({"checks": {"card": "warn"}})
    with pytest.raises(ConfigError, match="invalid regex"):
        config_from_dict({"checks": {"patterns": [{"name": "x", "regex": "("}]}})
    cfg = config_from_dict(
        {"checks": {"phone": "block", "patterns": [{"name": "order", "regex": r"ORD-\d+"}]}}
    )
    with pytest.raises(ConfigError, match=r"block_texts\.cards: no such check"):
        config_from_dict({"checks": {"block_texts": {"cards": "no"}}})
    with pytest.raises(ConfigError, match=r"block_texts\.card: expected a non-empty text"):
        config_from_dict({"checks": {"block_texts": {"card": " "}}})
    names = [c.name for c in cfg.checks.checker().checks]
    assert names == ["card", "iban", "api_key", "phone", "order"]
