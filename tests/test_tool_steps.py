"""Model steps with tools through the chain: rounds, invalid arguments corrected, the
round limit, cancellation before and during a side-effecting tool, and a hedged step
whose two attempts both ask for the tool (against two latency-lab servers)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chainrun.chain import REFUSAL, Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError, ProviderStatusError
from chainrun.events import StepFinished, TokenDelta, ToolCallEvent, TurnFinished
from chainrun.lab import LabServer
from chainrun.lab.scenarios import Lognormal, Scenario
from chainrun.lab.tool_calls import ToolCallsConfig
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.tools import ToolContext

#: what the test tools did, per test (the tools are imported by name from this module)

def is_key(key: str, turn_id: int | None, call: str) -> bool:
    """Whether ``key`` is the tools' key of ``call`` (``step:round:position``) in turn
    ``turn_id``: its id with the log's nonce (chainrun.desk.keys.tool_key)."""
    return re.fullmatch(rf"{turn_id}\.[0-9a-f]{{8}}:{call}", key) is not None


RUNS: list[dict[str, Any]] = []
STARTED = asyncio.Event()
DELAY_S = {"value": 0.0}


async def add_to_cart(sku: str, qty: int, idempotency_key: str,
                      context: ToolContext) -> dict[str, Any]:  # fmt: skip
    """The test's side-effecting tool: counts its runs (the count the tests check)."""
    RUNS.append({"sku": sku, "qty": qty, "key": idempotency_key, "turn_id": context.turn_id,
                 "finished": False})  # fmt: skip
    STARTED.set()
    await asyncio.sleep(DELAY_S["value"])
    RUNS[-1]["finished"] = True
    return {"added": sku, "qty": qty, "items_in_cart": sum(r["qty"] for r in RUNS)}


def order_status(order_id: int) -> dict[str, Any]:
    return {"order_id": order_id, "status": "shipped", "carrier": "DHL"}


@pytest.fixture(autouse=True)
def _fresh_tools() -> Iterator[None]:
    global STARTED
    RUNS.clear()
    STARTED = asyncio.Event()
    DELAY_S["value"] = 0.0
    yield


CART = {"description": "Add a product to the cart", "function": f"{__name__}:add_to_cart",
        "side_effects": True, "timeout_s": 5,
        "parameters": {"type": "object", "required": ["sku", "qty"],
                       "properties": {"sku": {"type": "string"},
                                      "qty": {"type": "integer", "minimum": 1}}}}  # fmt: skip
ORDER = {"description": "Look an order up", "function": f"{__name__}:order_status",
         "parameters": {"type": "object", "required": ["order_id"],
                        "properties": {"order_id": {"type": "integer"}}}}  # fmt: skip


def tool_config(providers: dict[str, Any] | None = None, *, guard: dict[str, Any] | None = None,
                **answer: Any) -> Any:  # fmt: skip
    step = {"provider": "local", "prompt": "{message}", "stream": True, "deadline_s": 10.0,
            "on_failure": "closed", "tools": ["add_to_cart", "order_status"], **answer}  # fmt: skip
    steps: dict[str, Any] = {"answer": step}
    order = ["answer"]
    if guard is not None:
        steps = {"guard": guard, **steps}
        order = ["guard", "answer"]
    return config_from_dict({
        "order": order, "answer_step": "answer",
        "providers": providers or {"local": {"base_url": "http://127.0.0.1:9/v1"}},
        "steps": steps, "tools": {"add_to_cart": CART, "order_status": ORDER},
    })  # fmt: skip


def rounds_script(*replies: FakeReply) -> Callable[[ChatRequest], FakeReply]:
    """Answer by round: the number of tool results already in the request."""

    def script(req: ChatRequest) -> FakeReply:
        done = sum(1 for m in req.messages if m.get("role") == "assistant" and m.get("tool_calls"))
        return replies[min(done, len(replies) - 1)]

    return script


def cart_call(args: Any, call_id: str = "call_1") -> FakeReply:
    text = args if isinstance(args, str) else json.dumps(args)
    return FakeReply(tool_calls=[{"id": call_id, "name": "add_to_cart", "arguments": text}],
                     gap_s=0.001)  # fmt: skip


async def collect(chain: Chain, message: str) -> tuple[TurnFinished, list[Any]]:
    events: list[Any] = []
    done = None
    async for ev in chain.stream_turn(message):
        events.append(ev)
        if isinstance(ev, TurnFinished):
            done = ev
    assert done is not None
    return done, events


def test_a_step_naming_an_unknown_tool_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"steps\.answer\.tools: unknown tool 'refund'"):
        tool_config(tools=["refund"])


def test_a_tool_that_does_not_import_fails_before_any_call() -> None:
    cfg = config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": "http://127.0.0.1:9/v1"}},
        "steps": {"answer": {"prompt": "{message}", "tools": ["t"]}},
        "tools": {"t": {"description": "d", "function": "no_such_shop_module:t"}},
    })  # fmt: skip
    fake = FakeProvider(name="local")
    with pytest.raises(ConfigError, match=r"^tools\.t\.function: cannot import"):
        Chain(cfg, store=None, providers={"local": fake})
    assert fake.requests == []


async def test_invalid_arguments_go_back_to_the_model_and_are_corrected() -> None:
    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": "two"}),  # breaks the schema
        cart_call({"sku": "JKT-12", "qty": 2}, call_id="call_2"),
        FakeReply("Added two JKT-12 jackets to your cart.", gap_s=0.001)))  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(tool_config(max_tool_rounds=2), store=store,
                         providers={"local": fake}) as chain:  # fmt: skip
            done, events = await collect(chain, "put 2 of JKT-12 in my cart")
            await chain.flush()
            rows = store.tool_calls(chain.run_id or 0)
            calls = store.calls(chain.run_id or 0)
    assert done.status == "ok" and done.output == "Added two JKT-12 jackets to your cart."
    assert [(r.status, r.round) for r in rows] == [("invalid_arguments", 1), ("ok", 2)]
    assert "$.qty" in (rows[0].error_message or "") and rows[0].duration_ms is None
    assert len(RUNS) == 1 and RUNS[0]["qty"] == 2
    assert RUNS[0]["key"] == rows[1].idempotency_key
    assert is_key(RUNS[0]["key"], done.turn_id, "answer:2:0")
    # the model saw the error, then the result
    second = fake.requests[1].messages
    assert second[-1]["role"] == "tool" and "$.qty" in second[-1]["content"]
    assert json.loads(fake.requests[2].messages[-1]["content"])["added"] == "JKT-12"
    # each round's primary is attempt 1 of its round: a round is no hedge copy
    assert [(c.round, c.attempt) for c in calls] == [(1, 1), (2, 1), (3, 1)]
    assert [c.first_tool_call_ms is not None for c in calls] == [True, True, False]
    tool_events = [(e.phase, e.status) for e in events if isinstance(e, ToolCallEvent)]
    assert tool_events == [("finished", "invalid_arguments"), ("started", None),
                           ("finished", "ok")]  # fmt: skip


@pytest.mark.parametrize("on_failure", ["closed", "open"])
async def test_past_max_tool_rounds_the_step_fails_per_on_failure(on_failure: str) -> None:
    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": "two"}),
        cart_call({"sku": "JKT-12", "qty": 2}, call_id="call_2"),
        FakeReply("never reached")))  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(tool_config(max_tool_rounds=1, on_failure=on_failure), store=store,
                         providers={"local": fake}) as chain:  # fmt: skip
            done, _ = await collect(chain, "put 2 of JKT-12 in my cart")
            (step,) = store.steps(chain.run_id or 0)
    assert step.error_type == "tool_rounds_exceeded"
    assert step.status == ("failed_closed" if on_failure == "closed" else "failed_open")
    # the answer step has no answer either way: refused (fail closed), or failed (fail
    # open has nothing to let through), never an ok turn with an empty answer
    assert (done.status, done.error_type) == (
        "refused" if on_failure == "closed" else "error", "tool_rounds_exceeded")
    assert done.output == (REFUSAL if on_failure == "closed" else None)
    assert RUNS == []  # round 1 was invalid; round 2's call is past the limit: never run
    assert len(fake.requests) == 2


async def test_a_400_in_a_tool_round_of_a_fail_open_answer_step_fails_the_turn() -> None:
    """the server refused the history of round 2 (HTTP 400, no parameter named); the
    step failing open ended the turn ok with an empty answer and no error type."""
    order = FakeReply(tool_calls=[{"id": "call_1", "name": "order_status",
                                   "arguments": '{"order_id": 7}'}], gap_s=0.001)  # fmt: skip
    refused = FakeReply(error=ProviderStatusError("local: HTTP 400: bad history", 400))
    fake = FakeProvider(name="local", script=rounds_script(order, refused))
    with Store.open(":memory:") as store:
        async with Chain(tool_config(on_failure="open"), store=store,
                         providers={"local": fake}) as chain:  # fmt: skip
            done, events = await collect(chain, "where is order 7?")
            (step,) = store.steps(chain.run_id or 0)
            (tool,) = store.tool_calls(chain.run_id or 0)
    assert (step.status, step.error_type) == ("failed_open", "http_400")
    assert (done.status, done.error_type, done.output) == ("error", "http_400", None)
    assert not any(isinstance(e, TokenDelta) for e in events)
    assert tool.status == "ok" and len(fake.requests) == 2  # the tool ran; round 2 failed


GUARD_PROMPT = "Task: check the user message.\nUser: {message}\nVerdict:"


def guard_and_answer(guard_reply: FakeReply, answer: Callable[[ChatRequest], FakeReply]) -> Any:
    def script(req: ChatRequest) -> FakeReply:
        return guard_reply if "Verdict:" in str(req.messages[-1]["content"]) else answer(req)

    return script


async def test_a_guard_refusing_before_the_side_effect_started_means_it_never_starts() -> None:
    # the model asks for add_to_cart at once; the input guard answers "unsafe" 300 ms later:
    # the side-effecting tool waits for the guard (the turn is not clear to act) and never runs
    fake = FakeProvider(name="local", script=guard_and_answer(
        FakeReply("unsafe\nS2", ttft_s=0.3),
        rounds_script(cart_call({"sku": "JKT-12", "qty": 1}), FakeReply("done"))))  # fmt: skip
    guard = {"kind": "guard", "prompt": GUARD_PROMPT, "on_missing_verdict": "closed",
             "deadline_s": 5.0}  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(tool_config(guard=guard), store=store,
                         providers={"local": fake}) as chain:  # fmt: skip
            done, _ = await collect(chain, "put 1 of JKT-12 in my cart")
            rows = store.tool_calls(chain.run_id or 0)
    assert done.status == "refused"
    await asyncio.sleep(0.1)
    assert RUNS == []
    assert [r.status for r in rows] == ["not_started"]


async def test_a_client_gone_before_the_side_effect_started_means_it_never_starts() -> None:
    # the guard takes 5 s (safe in the end); the client goes away once the model has asked
    fake = FakeProvider(name="local", script=guard_and_answer(
        FakeReply("safe", ttft_s=5.0),
        rounds_script(cart_call({"sku": "JKT-12", "qty": 1}), FakeReply("done"))))  # fmt: skip
    guard = {"kind": "guard", "prompt": GUARD_PROMPT, "on_missing_verdict": "closed",
             "deadline_s": 10.0}  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(tool_config(guard=guard), store=store,
                         providers={"local": fake}) as chain:  # fmt: skip
            async with contextlib.aclosing(chain.stream_turn("put 1 of JKT-12")) as events:
                t0 = time.monotonic()
                async for _ in events:
                    if fake.finished >= 1 or time.monotonic() - t0 > 3:
                        break  # the model's tool call is complete: the client goes away
            await chain.flush()
            (turn,) = store.turns(chain.run_id or 0)
            rows = store.tool_calls(chain.run_id or 0)
    await asyncio.sleep(0.1)
    assert fake.finished >= 1 and turn.status == "cancelled"
    assert RUNS == []
    assert [r.status for r in rows] == ["not_started"]


async def test_cancelled_while_the_side_effect_runs_it_finishes_once_and_is_logged() -> None:
    DELAY_S["value"] = 0.4
    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": 1}), FakeReply("Added.")))  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(tool_config(), store=store, providers={"local": fake}) as chain:
            async with contextlib.aclosing(chain.stream_turn("put 1 of JKT-12")) as events:
                async for ev in events:
                    if isinstance(ev, ToolCallEvent) and ev.phase == "started":
                        break  # the client goes away while the tool runs
            await chain.flush()
            (turn,) = store.turns(chain.run_id or 0)
            (row,) = store.tool_calls(chain.run_id or 0)
    assert turn.status == "cancelled"
    assert len(RUNS) == 1 and RUNS[0]["finished"]  # awaited to its end, once
    assert row.status == "ok" and row.turn_cancelled and (row.duration_ms or 0) >= 350
    assert is_key(row.idempotency_key or "", turn.id, "answer:1:0")
    assert len(fake.requests) == 1  # no second round after the cancel


# -- hedged: both attempts ask for add_to_cart (two lab servers) ---------------------------


async def settled(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll the lab's records (they settle a moment after the client closed a stream)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)


def tool_scenario(median_ms: float) -> Scenario:
    return Scenario(name="tools", latency=Lognormal(median_ms=median_ms, sigma=0.01),
                    n_tokens=4, per_token_ms=5,
                    tool_calls=ToolCallsConfig(fragments=3))  # fmt: skip


@pytest.fixture(scope="module")
def slow_tool_lab() -> Iterator[LabServer]:
    with LabServer(tool_scenario(1500)) as lab:
        yield lab


@pytest.fixture(scope="module")
def fast_tool_lab() -> Iterator[LabServer]:
    with LabServer(tool_scenario(5)) as lab:
        yield lab


async def test_a_hedged_tool_step_runs_the_tool_once_from_the_winner(
    slow_tool_lab: LabServer, fast_tool_lab: LabServer
) -> None:
    slow_tool_lab.reset()
    fast_tool_lab.reset()
    providers = {"local": {"base_url": slow_tool_lab.base_url},
                 "backup": {"base_url": fast_tool_lab.base_url}}  # fmt: skip
    cfg = tool_config(providers, tools=["add_to_cart"], hedge={
        "delay_ms": 100, "max_attempts": 2, "max_extra_load": 1.0, "targets": ["backup"]})
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done, events = await collect(chain, "put 2 of JKT-12 in my cart")
            await chain.flush()
            (row,) = store.tool_calls(chain.run_id or 0)
            calls = store.calls(chain.run_id or 0)
    assert done.status == "ok" and "add_to_cart" in (done.output or "")
    assert len(RUNS) == 1 and RUNS[0]["sku"] == "JKT-12" and RUNS[0]["qty"] == 2
    assert RUNS[0]["key"] == row.idempotency_key
    assert is_key(RUNS[0]["key"], done.turn_id, "answer:1:0")
    assert row.attempt == 2 and row.status == "ok"  # asked by the copy, which won
    assert calls[0].outcome == "cancelled" and calls[1].outcome == "duplicate"
    await settled(lambda: all(r["disconnected"] for r in slow_tool_lab.requests()))
    loser = slow_tool_lab.requests()[0]  # round 1's primary: asked for the same tool, lost
    assert loser["tool_call"] == "add_to_cart"
    assert loser["disconnected"] and not loser["completed"]
    finished = [e for e in events if isinstance(e, StepFinished)]
    assert finished[-1].hedge_won


async def test_results_go_to_a_state_field_and_the_label_picks_the_tools() -> None:
    def script(req: ChatRequest) -> FakeReply:
        prompt = str(req.messages[-1]["content"])
        if "Category:" in prompt:
            return FakeReply("order_status")
        if req.tools:  # the lookup step: one round of order_status, then a short text
            if any(m.get("role") == "tool" for m in req.messages):
                return FakeReply("looked up")
            return FakeReply(tool_calls=[{"id": "call_o", "name": "order_status",
                                          "arguments": '{"order_id": 1042}'}])  # fmt: skip
        return FakeReply(f"Answer from: {prompt}")

    fake = FakeProvider(name="local", script=script)
    cfg = config_from_dict({
        "order": ["classify", "lookup", "answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": "http://127.0.0.1:9/v1"}},
        "tools": {"add_to_cart": CART, "order_status": ORDER},
        "steps": {
            "classify": {"kind": "llm", "prompt": "{message}\nCategory:",
                         "labels": ["order_status", "other"]},
            "lookup": {"prompt": "{message}", "tools": ["order_status", "add_to_cart"],
                       "tools_by_label": {"order_status": ["order_status"]},
                       "tool_results_field": "order"},
            "answer": {"prompt": "Order: {order}\n{message}"},
        },
    })  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"local": fake}) as chain:
            done, _ = await collect(chain, "Where is my order 1042?")
    lookup = [r for r in fake.requests if r.tools]
    assert [t["name"] for t in lookup[0].tools or []] == ["order_status"]  # by the label
    assert done.status == "ok" and done.label == "order_status"
    assert '"order_status": {"order_id": 1042, "status": "shipped"' in (done.output or "")
    assert RUNS == []  # add_to_cart was never offered


@pytest.mark.parametrize("classify", ["fails", "names no label", "a label not routed"])
async def test_a_turn_without_a_route_is_offered_only_the_read_only_tools(classify: str) -> None:
    """tools_by_label routes the step; a turn whose classify step failed (open), named no
    label ("other") or a label the table does not name offers only order_status: neither
    the side-effecting cart nor the confirm tool (even without side_effects), and the
    model's call of the cart anyway is refused, nothing runs."""

    def script(req: ChatRequest) -> FakeReply:
        prompt = str(req.messages[-1]["content"])
        if "Category:" in prompt:
            if classify == "fails":
                raise ConnectionError("classify is down")
            return FakeReply("no idea" if classify == "names no label" else "sizing")
        if req.tools and not any(m.get("role") == "tool" for m in req.messages):
            return FakeReply(tool_calls=[{"id": "c1", "name": "add_to_cart",
                                          "arguments": '{"sku": "JKT-12", "qty": 1}'}])  # fmt: skip
        return FakeReply("done")

    fake = FakeProvider(name="local", script=script)
    cfg = config_from_dict({
        "order": ["classify", "answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": "http://127.0.0.1:9/v1"}},
        "tools": {"add_to_cart": CART, "order_status": ORDER,
                  "ask_first": {**CART, "side_effects": False, "confirm": True}},
        "steps": {
            "classify": {"kind": "llm", "prompt": "{message}\nCategory:", "on_failure": "open",
                         "labels": ["order_status", "product_search", "sizing", "other"]},
            "answer": {"prompt": "{message}", "tools": ["add_to_cart", "order_status",
                                                        "ask_first"],
                       "tools_by_label": {"order_status": ["order_status"],
                                          "product_search": ["add_to_cart", "ask_first"]}},
        },
    })  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"local": fake}) as chain:
            done, _ = await collect(chain, "put one jacket in")
            rows = store.tool_calls(chain.run_id or 0)
    offered = [[t["name"] for t in r.tools or []] for r in fake.requests if r.tools]
    assert offered == [["order_status"]] * 2  # the round that asked and the one after it
    assert done.label == {"fails": None, "names no label": "other",
                          "a label not routed": "sizing"}[classify]  # fmt: skip
    assert RUNS == []  # the cart the model asked for anyway was not offered, so not run
    assert [(r.tool, r.status) for r in rows] == [("add_to_cart", "unknown_tool")]


async def test_against_the_lab_a_client_gone_between_the_tool_call_and_the_tool(
    fast_tool_lab: LabServer,
) -> None:
    """The lab streams the model's add_to_cart call; a guard still checks the message, so
    the turn is not clear to act; the client goes away once the lab's answer is complete:
    the tool never runs."""
    fast_tool_lab.reset()
    guard_fake = FakeProvider(name="guard", script=lambda req: FakeReply("safe", ttft_s=5.0))
    guard = {"kind": "guard", "provider": "guard", "prompt": GUARD_PROMPT,
             "on_missing_verdict": "closed", "deadline_s": 10.0}  # fmt: skip
    cfg = tool_config({"local": {"base_url": fast_tool_lab.base_url},
                       "guard": {"base_url": fast_tool_lab.base_url}},
                      guard=guard, tools=["add_to_cart"])  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"guard": guard_fake}) as chain:
            async def client() -> None:
                async with contextlib.aclosing(chain.stream_turn("put 2 of JKT-12")) as ev:
                    async for _ in ev:
                        pass

            task = asyncio.create_task(client())
            # the model's tool call is complete on the lab's side: the client goes away
            await settled(lambda: any(r["completed"] for r in fast_tool_lab.requests()))
            await asyncio.sleep(0.05)  # the stream's last bytes reach the step
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await chain.flush()
            (turn,) = store.turns(chain.run_id or 0)
            rows = store.tool_calls(chain.run_id or 0)
    (rec,) = fast_tool_lab.requests()
    assert rec["tool_call"] == "add_to_cart" and rec["completed"]
    assert turn.status == "cancelled"
    await asyncio.sleep(0.1)
    assert RUNS == [] and [r.status for r in rows] == ["not_started"]


def shadowed_cart(
    tool_ttft_s: float, text_ttft_s: float
) -> tuple[Any, FakeProvider, FakeProvider]:
    """A hedged answer step with add_to_cart: a slow primary (its tool call after
    ``tool_ttft_s``, its text after ``text_ttft_s``) whose copy on a fast backup wins
    both rounds at 50 ms, every loser left to finish (``shadow_fraction = 1``); returns
    (config, slow, fast)."""
    slow = FakeProvider(name="local", script=rounds_script(
        FakeReply(tool_calls=[{"id": "call_slow", "name": "add_to_cart",
                               "arguments": '{"sku": "JKT-12", "qty": 2}'}], ttft_s=tool_ttft_s),
        FakeReply("Added (slow).", ttft_s=text_ttft_s)))  # fmt: skip
    fast = FakeProvider(name="backup", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": 2}, call_id="call_fast"),
        FakeReply("Added.", gap_s=0.001)))  # fmt: skip
    cfg = tool_config({"local": {"base_url": "http://127.0.0.1:9/v1"},
                       "backup": {"base_url": "http://127.0.0.1:9/v1"}},
                      tools=["add_to_cart"], hedge={
                          "delay_ms": 50, "max_attempts": 2, "max_extra_load": 1.0,
                          "shadow_fraction": 1.0, "targets": ["backup"]})  # fmt: skip
    return cfg, slow, fast


async def test_a_shadow_loser_that_asked_for_the_tool_to_the_end_never_runs_it() -> None:
    """Both attempts ask for add_to_cart; the loser is left to finish (a shadow, for the
    time-saved measurement) and its whole tool call arrives: only the winner's runs."""
    cfg, slow, fast = shadowed_cart(0.4, 0.4)
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"local": slow, "backup": fast}) as chain:
            done, _ = await collect(chain, "put 2 of JKT-12 in my cart")
        rows = store.tool_calls(chain.run_id or 0)
    assert slow.finished >= 1  # the shadow loser read its whole tool call
    assert done.status == "ok" and done.output == "Added."
    assert len(RUNS) == 1 and is_key(RUNS[0]["key"], done.turn_id, "answer:1:0")
    assert [r.call_id for r in rows] == ["call_fast"]


async def test_every_rounds_shadow_loser_settles_its_own_time_saved() -> None:
    """Two rounds (the tool call, then the text), each won by the copy while the slow
    primary is left to finish as a shadow: once both shadows end, each round has its own
    time saved (its primary's first event minus its copy's: about 250 ms in round 1 and
    450 ms in round 2), and the step's is their sum (not the round that settled last)."""
    cfg, slow, fast = shadowed_cart(0.3, 0.5)
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"local": slow, "backup": fast}) as chain:
            done, _ = await collect(chain, "put 2 of JKT-12 in my cart")
        # closing the chain waited for both shadows and rewrote their rows
        (step,) = store.steps(chain.run_id or 0)
        calls = store.calls(chain.run_id or 0)
    assert done.status == "ok" and slow.finished == 2  # both shadows read to their end
    by_round: dict[int, dict[str, Any]] = {}
    for c in calls:
        assert c.first_event_ms is not None and c.started_offset_ms is not None
        by_round.setdefault(c.round, {})[c.target] = c.started_offset_ms + c.first_event_ms
    rounds = step.hedge_rounds()
    assert [r.round for r in rounds] == [1, 2] and all(r.won for r in rounds)
    expected = {n: times["local"] - times["backup"] for n, times in by_round.items()}
    for r, other in zip(rounds, reversed(rounds), strict=True):
        # measured on the engine's clock, the rows on the stream's: each round's own value
        # (nearer its own rows' difference than the other round's), never the other's
        assert r.time_saved_ms is not None and r.time_saved_ms > 0, rounds
        mine, theirs = abs(r.time_saved_ms - expected[r.round]), abs(
            r.time_saved_ms - expected[other.round])
        assert mine < theirs, (rounds, expected)
    assert step.time_saved_ms == pytest.approx(sum(r.time_saved_ms or 0 for r in rounds))


async def test_a_check_of_the_answer_does_not_hold_the_answer_steps_own_tool() -> None:
    """A validating step that refuses on a bad verdict holds the answer back, but it reads
    the answer: the answer step's side-effecting tool does not wait for it (it would wait
    for ever), it runs, and the check judges the answer afterwards."""
    def script(req: ChatRequest) -> FakeReply:
        if "Review" in str(req.messages[-1]["content"]):
            return FakeReply('{"ok": true, "reason": "fine"}')
        return rounds_script(cart_call({"sku": "JKT-12", "qty": 1}), FakeReply("Added."))(req)

    fake = FakeProvider(name="local", script=script)
    cfg = config_from_dict({
        "order": ["answer", "check"], "answer_step": "answer",
        "providers": {"local": {"base_url": "http://127.0.0.1:9/v1"}},
        "tools": {"add_to_cart": CART},
        "steps": {"answer": {"prompt": "{message}", "stream": True, "tools": ["add_to_cart"],
                             "deadline_s": 5.0},
                  "check": {"prompt": "Review: {answer}", "on_reject": "refuse",
                            "deadline_s": 5.0}},
    })  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"local": fake}) as chain:
            done, _ = await collect(chain, "put 1 of JKT-12 in my cart")
            steps = {s.step: s.status for s in store.steps(chain.run_id or 0)}
    assert done.status == "ok" and done.output == "Added."
    # no wait for the deadline: a tool held for the check would time the answer step out
    assert steps == {"answer": "ok", "check": "ok"} and len(RUNS) == 1
