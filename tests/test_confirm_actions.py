"""Actions that wait for the shopper's yes (``[tools.NAME] confirm = true``) through the
library: the ask runs nothing and the answer is chainrun's question; a yes runs exactly the
pending arguments once; a no, a new request, an unclear reply and an expired action run
nothing; the log holds every decision (who, when), read back by another chain."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from log_backends import log_target
from test_tool_steps import CART, RUNS, cart_call, rounds_script, tool_config

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError, ConversationForbidden, UserInputError
from chainrun.events import TokenDelta, ToolCallEvent, TurnFinished
from chainrun.identity import Identity
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.tools.confirm import PendingAction, read_reply


@pytest.fixture(autouse=True)
def _fresh_runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


def confirm_config(**tool: Any) -> Any:
    cfg = tool_config()
    data = cfg.model_dump(mode="json", exclude={"path"})
    data["tools"]["add_to_cart"] = {**CART, "confirm": True,
                                    "confirm_question": "Add {qty} x {sku} to your cart?", **tool}
    return config_from_dict(data)


def cart_fake() -> FakeProvider:
    return FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": 2}),
        FakeReply("Done: two JKT-12 are in your cart.", gap_s=0.001)))  # fmt: skip


async def turn(chain: Chain, message: str, **kw: Any) -> tuple[TurnFinished, list[Any]]:
    events = [ev async for ev in chain.stream_turn(message, **kw)]
    done = events[-1]
    assert isinstance(done, TurnFinished)
    return done, events


async def test_the_ask_runs_nothing_and_a_yes_runs_the_pending_arguments_once(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "log.db")
    fake = cart_fake()
    async with Chain(confirm_config(), store=store, providers={"local": fake}, quiet=True) as chain:
        asked, events = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="c1")
        assert RUNS == []
        assert asked.output == "Add 2 x JKT-12 to your cart?"
        (action,) = asked.pending_actions
        assert action.arguments == {"sku": "JKT-12", "qty": 2} and action.tool == "add_to_cart"
        # the turn id and the log's nonce (tools' keys never repeat across logs)
        assert re.fullmatch(rf"{asked.turn_id}\.[0-9a-f]{{8}}:answer:1:0", action.id)
        tool_events = [e for e in events if isinstance(e, ToolCallEvent)]
        assert [e.status for e in tool_events] == ["awaiting_confirmation"]
        assert tool_events[0].action is not None
        assert tool_events[0].action["question"] == "Add 2 x JKT-12 to your cart?"
        assert "".join(e.text for e in events if isinstance(e, TokenDelta)) == asked.output
        n_requests = len(fake.requests)
        done, _ = await turn(chain, "yes please", conversation_id="c1")
        assert done.output == "Done: two JKT-12 are in your cart."
        assert [(r["sku"], r["qty"], r["key"]) for r in RUNS] == [("JKT-12", 2, action.id)]
        # the model was handed the call and its result; it was not asked to restate it
        first = fake.requests[n_requests]
        assert [m["role"] for m in first.messages][-2:] == ["assistant", "tool"]
        assert json.loads(first.messages[-1]["content"])["added"] == "JKT-12"
        assert done.decisions == ({"id": action.id, "tool": "add_to_cart",
                                   "decision": "confirmed", "reply": "yes"},)  # fmt: skip
        again, _ = await turn(chain, "yes please", conversation_id="c1")  # nothing pending
        assert len(RUNS) == 1 and again.decisions == ()
    with Store.open(tmp_path / "log.db", create=False) as log:
        rows = {r.turn_id: r for r in log.tool_calls(asked.run_id)}
    asked_row, run_row = rows[asked.turn_id], rows[done.turn_id]
    assert asked_row.status == "confirmed" and asked_row.decided_by == "shopper"
    assert asked_row.decided_turn_id == done.turn_id and asked_row.decided_at
    assert asked_row.question == "Add 2 x JKT-12 to your cart?" and asked_row.expires_at
    assert run_row.status == "ok" and run_row.action_id == action.id and run_row.round == 0
    assert run_row.idempotency_key == action.id


@pytest.mark.parametrize(("reply", "decision", "answered_by_chainrun"), [
    ("no", "denied", True),
    ("no thanks, don't", "denied", True),
    ("nein danke", "denied", True),
    ("👎", "denied", True),
    ("hmm", "asked_again", True),
    ("maybe", "asked_again", True),
    ("yes if it's under 50", "asked_again", True),
    ("no, show me a warm fleece for hiking instead", "denied", False),
    ("show me a warm fleece for hiking in the mountains", "kept", False),
])  # fmt: skip
async def test_a_no_an_unclear_reply_or_a_new_request_runs_nothing(
    tmp_path: Path, reply: str, decision: str, answered_by_chainrun: bool
) -> None:
    """A no denies; an unclear reply asks again; a new request that conflicts with the
    action denies it and runs; one beside it runs and keeps the action pending (shown
    again): a later yes runs it."""
    store = Store.open(tmp_path / "log.db")
    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": 2}), FakeReply("Here is a fleece.", gap_s=0.001)))
    async with Chain(confirm_config(), store=store, providers={"local": fake}, quiet=True) as chain:
        asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="c2")
        n = len(fake.requests)
        fake.script = rounds_script(FakeReply("Here is a fleece.", gap_s=0.001))  # no new ask
        done, _ = await turn(chain, reply, conversation_id="c2")
        assert [d["decision"] for d in done.decisions] == [decision]
        if answered_by_chainrun:
            assert len(fake.requests) == n  # no model call: chainrun's own words
            assert "Add 2 x JKT-12 to your cart?" in (done.output or "")
        if decision == "asked_again":
            assert done.output == "Please answer yes or no: Add 2 x JKT-12 to your cart?"
        if decision in ("asked_again", "kept"):
            assert [a.id for a in done.pending_actions] == [asked.pending_actions[0].id]
            assert RUNS == []
            yes, _ = await turn(chain, "ok", conversation_id="c2")  # still pending: runs now
            assert len(RUNS) == 1 and yes.output == "Here is a fleece."
        else:
            assert RUNS == []
    with Store.open(tmp_path / "log.db", create=False) as log:
        row = next(r for r in log.tool_calls(asked.run_id) if r.turn_id == asked.turn_id)
    want = {"denied": "denied", "asked_again": "confirmed", "kept": "confirmed"}[decision]
    assert row.status == want
    if decision == "denied":
        assert row.decided_by == ("shopper" if answered_by_chainrun else "new_request")


async def test_an_expired_action_runs_nothing_and_says_so(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "log.db")
    async with Chain(confirm_config(confirm_turns=1), store=store,
                     providers={"local": cart_fake()}, quiet=True) as chain:  # fmt: skip
        asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="c3")
        await turn(chain, "hm?", conversation_id="c3")  # unclear: asked again (turn 2 of 1+1)
        late, _ = await turn(chain, "yes", conversation_id="c3")  # turn 3: past it
    assert RUNS == []
    assert late.output is not None and late.output.startswith("That request has expired")
    assert [d["decision"] for d in late.decisions] == ["expired"]
    with Store.open(tmp_path / "log.db", create=False) as log:
        row = next(r for r in log.tool_calls(asked.run_id) if r.turn_id == asked.turn_id)
    assert row.status == "expired" and row.decided_by == "expiry"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_an_explicit_confirmation_by_id_from_another_chain_on_the_same_log(
    tmp_path: Path, backend: str
) -> None:
    """The pending action is read from the log: a second chain (another process, or a
    restart) confirms it, and the first identity's user id is who decided."""
    with log_target(backend, tmp_path) as db:
        await _confirm_from_another_chain(db)


async def _confirm_from_another_chain(db: str) -> None:
    user = Identity("shopper-7", {"tier": "gold"})
    async with Chain(confirm_config(), store=Store.open(db), providers={"local": cart_fake()},
                     quiet=True) as first:  # fmt: skip
        asked, _ = await turn(first, "put 2 of JKT-12 in my cart", conversation_id="c4",
                              user=user)  # fmt: skip
    (action,) = asked.pending_actions
    async with Chain(confirm_config(), store=Store.open(db), providers={"local": cart_fake()},
                     quiet=True) as second:  # fmt: skip
        with pytest.raises(UserInputError, match="no action 'nope'"):
            await turn(second, "yes", conversation_id="c4", user=user, confirm="nope")
        with pytest.raises(ConversationForbidden):
            await turn(second, "yes", conversation_id="c4", user=Identity("someone-else"),
                       confirm=action.id)  # fmt: skip
        # another conversation (a new one, as a bare /chat confirm starts) neither sees the
        # action nor decides it: no question, no status of it in the answer
        with pytest.raises(UserInputError, match=f"no action '{action.id}' waits in "
                                                 "conversation 'c5'"):  # fmt: skip
            await turn(second, "yes", conversation_id="c5", user=Identity("someone-else"),
                       confirm=action.id)  # fmt: skip
        done, _ = await turn(second, "yes", conversation_id="c4", user=user, confirm=action.id)
        twice, _ = await turn(second, "yes", conversation_id="c4", user=user, confirm=action.id)
    assert len(RUNS) == 1 and done.status == "ok"
    assert twice.output is not None and "already done" in twice.output
    with Store.open(db, create=False) as log:
        rows = [r for r in log.tool_calls([asked.run_id, done.run_id])]
        turns = {t.id: t for t in log.turns(done.run_id)}
    assert next(r for r in rows if r.turn_id == asked.turn_id).decided_by == "shopper-7"
    assert turns[done.turn_id].user_id == "shopper-7"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_an_unknown_action_id_is_refused_before_its_turn_claims_an_index(
    tmp_path: Path, backend: str
) -> None:
    """A confirm of an id the conversation has not (a typo, another conversation's) is
    the request's mistake: refused, no turn logged and no index claimed, so a later
    worker death cannot log it as a lost turn the shopper never sent; the yes after it
    is the conversation's next turn."""
    with log_target(backend, tmp_path) as db:
        async with Chain(confirm_config(), store=Store.open(db),
                         providers={"local": cart_fake()}, quiet=True) as chain:  # fmt: skip
            asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="c8")
            with pytest.raises(UserInputError, match="no action 'nosuch:1' waits in "
                                                     "conversation 'c8'"):  # fmt: skip
                await turn(chain, "yes", conversation_id="c8", confirm="nosuch:1")
            with pytest.raises(UserInputError, match="a new conversation"):
                await turn(chain, "yes", confirm="nosuch:1")
            (action,) = asked.pending_actions
            done, _ = await turn(chain, "yes", conversation_id="c8", confirm=action.id)
        with Store.open(db, create=False) as log:
            turns = log.turns(done.run_id)
            # a shared log hands indexes out in the log: nothing claimed past the yes
            claimed = log.log.query("select last_index from conversation_index where "
                                    "conversation_id = 'c8'")  # fmt: skip
    assert [t.turn_index for t in turns] == [1, 2] and len(RUNS) == 1
    assert claimed == ([{"last_index": 2}] if backend == "postgresql" else [])


async def test_replies_are_read_as_yes_no_unclear_or_a_new_request() -> None:
    """The reader against a pending "Add 2 x JKT-12 to your cart?": a leading yes with more
    words, a yes in other languages and as an emoji; a no; doubt; a new request that
    changes the action (dropped) or stands beside it (kept)."""
    action = PendingAction(id="1:answer:1:0", tool="add_to_cart",
                           arguments={"sku": "JKT-12", "qty": 2},
                           question="Add 2 x JKT-12 to your cart?", step="answer",
                           conversation_id="c", turn_id=1, turn_index=1, asked_at="",
                           expires_at="", expires_after_turn=4)  # fmt: skip

    async def read(*messages: str) -> list[str]:
        return [await read_reply(m, [action]) for m in messages]

    assert await read("Yes!", "ok, go ahead", "sure why not", "yes add it to my cart",
                      "yeah go ahead and place it", "Yes, 2 of JKT-12 please", "ja bitte",
                      "oui, vas-y", "sí, por favor", "va bene", "doe maar", "👍") == ["yes"] * 12
    assert await read("no", "No thanks", "cancel it", "don't", "nein", "non merci",
                      "no gracias", "no grazie", "nee dank je", "❌") == ["no"] * 10
    assert await read("hmm", "maybe", "not sure", "vielleicht", "yes but only one",
                      "yes, 3 of them", "") == ["unclear"] * 7
    assert await read("actually show me the red jacket in size M",
                      "add the blue one instead", "add 3 of JKT-12 to my cart",
                      "no, show me the cheaper one") == ["new_request"] * 4
    assert await read("what is your return policy for jackets?",
                      "show me a warm fleece for hiking") == ["side_request"] * 2


async def test_a_turn_sent_again_with_its_idempotency_key_runs_nothing(tmp_path: Path) -> None:
    """The library's key: the second turn is the first one's, from the log; the tool ran
    once, with a key derived from the client's; another request with the key is refused."""
    from chainrun.errors import IdempotencyKeyReused

    store = Store.open(tmp_path / "log.db")
    async with Chain(tool_config(), store=store, providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        first, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="k1",
                              idempotency_key="retry-1")  # fmt: skip
        again, events = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="k1",
                                   idempotency_key="retry-1")  # fmt: skip
        with pytest.raises(IdempotencyKeyReused, match="'retry-1'"):
            await turn(chain, "something else", conversation_id="k1", idempotency_key="retry-1")
    assert len(RUNS) == 1 and RUNS[0]["key"].endswith(":answer:1:0")
    assert not RUNS[0]["key"].startswith(f"{first.turn_id}:")  # derived from the client's key
    assert again.repeated and again.turn_id == first.turn_id and again.output == first.output
    assert not any(isinstance(e, ToolCallEvent) for e in events)


def test_show_lists_what_was_asked_and_who_decided(tmp_path: Path) -> None:
    """``chainrun show`` prints a pending action's question, status and decision."""
    import asyncio

    from typer.testing import CliRunner

    from chainrun.cli import app

    async def two_turns() -> int | None:
        store = Store.open(tmp_path / "log.db")
        async with Chain(confirm_config(), store=store, providers={"local": cart_fake()},
                         quiet=True) as chain:  # fmt: skip
            asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="s1")
            await turn(chain, "no", conversation_id="s1")
        return asked.run_id

    run_id = asyncio.run(two_turns())
    shown = CliRunner().invoke(app, ["show", str(run_id), "--db", str(tmp_path / "log.db")],
                               env={"COLUMNS": "250"})  # fmt: skip
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "asked='Add 2 x JKT-12 to your cart?'" in text
    assert "status=denied" in text and "decided_by=shopper" in text


async def test_a_yes_while_the_log_cannot_be_read_runs_nothing_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conversation's pending actions cannot be read (the log's database away past its
    outage wait): a yes, and a confirm by id, are answered that nothing was done and run
    nothing; the action stays pending and a yes once the log is back runs it. It used to
    end the turn with the read's exception (an ASGI traceback under serve, no answer)."""
    from chainrun.actions.confirmations import UNREADABLE_ANSWER

    store = Store.open(tmp_path / "log.db")
    async with Chain(confirm_config(), store=store, providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="c1")
        (action,) = asked.pending_actions
        real = store.open_actions

        def away(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("the log's database cannot be reached")

        monkeypatch.setattr(store, "open_actions", away)
        yes, _ = await turn(chain, "yes please", conversation_id="c1")
        by_id, _ = await turn(chain, "yes", conversation_id="c1", confirm=action.id)
        assert yes.status == "ok" and yes.output == UNREADABLE_ANSWER
        assert by_id.status == "ok" and by_id.output == UNREADABLE_ANSWER
        assert RUNS == [] and yes.decisions == ()
        monkeypatch.setattr(store, "open_actions", real)
        done, _ = await turn(chain, "yes please", conversation_id="c1")
    assert done.output == "Done: two JKT-12 are in your cart."
    assert [(r["sku"], r["qty"], r["key"]) for r in RUNS] == [("JKT-12", 2, action.id)]
    store.close()


@pytest.mark.parametrize("on_log", [True, False])
async def test_a_product_the_catalogue_does_not_hold_is_never_asked_about(
    tmp_path: Path, on_log: bool
) -> None:
    """product_arguments = ["sku"]: the model asks to add "lab", which no product of the
    catalogue (the sample one, loaded for the check) is: no question, nothing pending,
    nothing run; the model is told the catalogue has no such product and answers. A SKU
    the catalogue holds is asked about as before."""
    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "lab", "qty": 1}),
        FakeReply("I could not find that product.", gap_s=0.001)))  # fmt: skip
    store = Store.open(tmp_path / "log.db") if on_log else None
    cfg = confirm_config(product_arguments=["sku"])
    async with Chain(cfg, store=store, providers={"local": fake}, quiet=True) as chain:
        done, events = await turn(chain, "put one lab in my cart", conversation_id="p1")
        assert done.pending_actions == () and RUNS == []
        assert done.output == "I could not find that product."
        told = json.loads(fake.requests[-1].messages[-1]["content"])
        assert told == {"error": "no product 'lab' in the catalogue (sku must be a product "
                                 "id); nothing was done"}  # fmt: skip
        tool_events = [e.status for e in events if isinstance(e, ToolCallEvent)]
        assert tool_events == ["invalid_arguments"]
        # a product the catalogue holds: asked as before
        fake.script = rounds_script(cart_call({"sku": "JKT-012", "qty": 2}))
        asked, _ = await turn(chain, "put 2 of JKT-012 in my cart", conversation_id="p2")
        assert asked.output == "Add 2 x JKT-012 to your cart?"
        assert [a.arguments["sku"] for a in asked.pending_actions] == ["JKT-012"]
    if store is not None:
        with Store.open(tmp_path / "log.db", create=False) as log:
            rows = log.tool_calls(done.run_id)
        assert [(r.status, r.question) for r in rows if r.turn_id == done.turn_id] == [
            ("invalid_arguments", None)]


def test_product_arguments_must_name_a_string_parameter() -> None:
    with pytest.raises(ConfigError, match=r"product_arguments: 'qty' is no string or array "
                                          r"parameter of the tool \(parameters: qty, sku\)"):
        confirm_config(product_arguments=["qty"])
