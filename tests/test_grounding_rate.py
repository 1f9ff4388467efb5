"""The ungrounded rate in compare and the audit says how many claims were judged and how
many could not be, so "0 ungrounded" cannot hide "0 judged"; a run's own currency,
locale and policy are what its answers are judged again with."""

from __future__ import annotations

import json

from conftest import reply_by_step

from chainrun.analysis.compare import compare
from chainrun.analysis.grounding import grounding_rate, rate_text, shop_settings
from chainrun.audit import audit
from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply


async def _run(store: Store, answer: str, n: int, steps: dict | None = None) -> int:
    cfg = config_from_dict({"order": ["compose"],
                            "steps": {"compose": {"prompt": "{message}", **(steps or {})}}})
    fake = FakeProvider(name="local", script=reply_by_step({"compose": FakeReply(answer)}))
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        for i in range(n):
            await chain.run_turn(f"question {i}")
    await store.flush()
    run_id = store.latest_run_id()
    assert run_id is not None
    return run_id


async def test_nothing_judged_is_said_and_the_audit_does_not_pass() -> None:
    """Answers naming a product no source of the turn knows (no catalogue, no search):
    their claims cannot be judged; with the check only flagging, the shopper reads them,
    and compare says 0 ungrounded of 0 judged (10 not judged); the audit warns."""
    with Store.open(":memory:") as store:
        rid = await _run(store, "JKT-013 is a good choice for the rain.", 10,
                         {"grounding": {"action": "flag"}})
        g = compare(store, str(rid), str(rid))["grounding"]["b"]["shown"]
        assert (g["ungrounded"], g["n"], g["claims_judged"], g["claims_unjudged"],
                g["answers_judged"]) == (0, 10, 0, 10, 0)  # fmt: skip
        assert "claims judged 0, not judged 10; 0 of 10 answers with a judged claim" in (
            rate_text(g))
        item = audit(store, runs=[rid]).items[7]
        assert item.id == 8 and item.verdict == "warn"
        assert any("no claim of its 10 answers could be judged" in n for n in item.notes)
        (fig,) = item.figures.values()
        assert fig["grounded_shown"]["claims_unjudged"] == 10


async def test_a_false_policy_fact_the_shopper_read_is_counted() -> None:
    """A wrong refund time is a fact like a price: with the check only flagging, the
    shopper reads it, and compare and the audit count it."""
    with Store.open(":memory:") as store:
        rid = await _run(store, "Your money is back within 3-5 working days of the return.",
                         10, {"grounding": {"action": "flag"}})  # fmt: skip
        g = compare(store, str(rid), str(rid))["grounding"]["b"]
        assert g["shown"]["ungrounded"] == 10 and g["shown"]["claims_judged"] == 10
        assert g["model"]["ungrounded"] == 10 and g["model"]["claims_judged"] == 10
        item = audit(store, runs=[rid]).items[7]
        assert item.verdict == "fail" and "3-5 working days" in item.notes[0]


def test_a_runs_own_shop_is_what_it_is_judged_with(tmp_path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[returns]\ntitle = "Returns"\ntext = "Refunds within 10 days."\n')
    config = {"steps": {"compose": {"grounding": {"enabled": True, "currency": "CHF",
                                                  "locale": "de_CH",
                                                  "policy_file": str(policy)}}}}  # fmt: skip
    shop = shop_settings(json.dumps(config))
    assert (shop.currency, shop.locale, shop.policy) == ("CHF", "de_CH", "Refunds within 10 days.")
    assert shop_settings(None).currency == "EUR" and "30 days" in shop_settings(None).policy


def test_the_rate_of_no_answers() -> None:
    assert grounding_rate([]) == {"ungrounded": 0, "n": 0, "rate": None, "ci95": None,
                                  "claims_judged": 0, "claims_unjudged": 0,
                                  "answers_judged": 0}  # fmt: skip
