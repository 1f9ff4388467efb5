"""Pending actions a shopper can rely on: a yes sent five times at once runs the action
once (on one process and on two sharing a PostgreSQL log), every answer saying what
happened; a yes sent the moment the question arrives is decided while the asking turn's
checks still run; a process killed while a confirmed tool runs leaves the action honest
(asked again, the same tool key on the retry); every argument that runs is asked; a
confirmed action is checked again against the tool, the catalogue and its config."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from log_backends import log_target
from test_confirm_actions import cart_fake, confirm_config, turn
from test_tool_steps import DELAY_S, RUNS, cart_call, rounds_script

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.config.defaults import DEFAULT_CHAIN
from chainrun.events import ToolCallEvent, TurnFinished
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply

TESTS = Path(__file__).parent
#: how long a test waits for what must happen while the checks are held, in s
WAIT_S = 30


@pytest.fixture(autouse=True)
def _fresh_runs() -> Iterator[None]:
    RUNS.clear()
    DELAY_S["value"] = 0.0
    yield
    RUNS.clear()
    DELAY_S["value"] = 0.0


# -- five yeses at once ----------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_five_concurrent_yeses_run_the_action_once_and_each_says_what_happened(
    tmp_path: Path, backend: str
) -> None:
    """A client retrying its "yes" five times at once, served by two chains (two workers)
    on one log: the action runs exactly once, and every answer says what happened (done,
    or being done by the earlier yes), none "decided by another turn" with nothing done."""
    DELAY_S["value"] = 0.3  # the tool runs while the other yeses arrive
    with log_target(backend, tmp_path) as db:
        chains = [Chain(confirm_config(), store=Store.open(db), providers={"local": cart_fake()},
                        quiet=True) for _ in range(2)]  # fmt: skip
        async with chains[0] as one, chains[1] as two:
            asked, _ = await turn(one, "put 2 of JKT-12 in my cart", conversation_id="y1")
            (action,) = asked.pending_actions
            done = await asyncio.gather(*[
                turn([one, two][i % 2], "yes please", conversation_id="y1") for i in range(5)])
    outputs = [d.output or "" for d, _ in done]
    assert [(r["sku"], r["qty"], r["key"]) for r in RUNS] == [("JKT-12", 2, action.id)]
    assert outputs.count("Done: two JKT-12 are in your cart.") == 1, outputs
    for out in outputs:
        assert out == "Done: two JKT-12 are in your cart." or (
            "being carried out now" in out or "already done" in out), outputs
        assert "decided by another turn" not in out


# -- a yes at once ---------------------------------------------------------------------
def gated_confirm_config() -> Any:
    """The confirm chain with the default validate step after its answer."""
    cfg = confirm_config()
    data = cfg.model_dump(mode="json", exclude={"path"})
    data["steps"]["validate"] = DEFAULT_CHAIN["steps"]["validate"]
    data["order"] = ["answer", "validate"]
    return config_from_dict(data)


class GatedValidate(FakeProvider):
    """The cart fake whose validate step of the asking turn waits for ``gate`` (a slow
    check after the answer): what happens before the gate opens happens while the asking
    turn runs."""

    def __init__(self) -> None:
        answer = rounds_script(cart_call({"sku": "JKT-12", "qty": 2}),
                               FakeReply("Done: two JKT-12 are in your cart.", gap_s=0.001))

        def script(req: ChatRequest) -> FakeReply:
            if "Review as JSON" in req.messages[-1]["content"]:
                return FakeReply('{"ok": true, "reason": "fine"}', ttft_s=0.001)
            return answer(req)

        super().__init__(name="local", script=script)
        self.gate = asyncio.Event()

    async def chunks(self, request: ChatRequest) -> Any:
        prompt = request.messages[-1]["content"]
        if "Review as JSON" in prompt and "to your cart?" in prompt:  # the asking turn's
            await self.gate.wait()
        async for chunk in super().chunks(request):
            yield chunk


async def test_a_confirm_sent_as_the_question_arrives_is_decided_while_checks_run(
    tmp_path: Path,
) -> None:
    fake = GatedValidate()
    async with Chain(gated_confirm_config(), store=Store.open(tmp_path / "log.db"),
                     providers={"local": fake}, quiet=True) as chain:  # fmt: skip
        yes: TurnFinished | None = None
        async with asyncio.timeout(WAIT_S):
            async for ev in chain.stream_turn("put 2 of JKT-12 in my cart",
                                              conversation_id="q1"):  # fmt: skip
                if isinstance(ev, ToolCallEvent) and ev.action is not None:
                    yes, _ = await turn(chain, "yes", conversation_id="q1",
                                        confirm=ev.action["id"])  # fmt: skip
                    fake.gate.set()
    assert yes is not None and yes.output == "Done: two JKT-12 are in your cart."
    assert len(RUNS) == 1


async def test_chat_a_confirm_sent_on_the_action_event_is_decided(tmp_path: Path) -> None:
    import httpx
    from serve_helpers import serving, sse

    fake = GatedValidate()
    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(gated_confirm_config(), store=store,
                                         providers={"local": fake}, quiet=True)) as (url, _):
            async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
                async with client.stream("POST", "/chat", json={
                        "message": "put 2 of JKT-12 in my cart", "conversation_id": "q2"}) as r:
                    async for event, data in sse(r):
                        if event == "action":
                            got = await client.post("/chat", json={"conversation_id": "q2",
                                                                   "confirm": data["id"]})
                            fake.gate.set()
    finally:
        store.close()
    assert got.status_code == 200, got.text
    assert "Done: two JKT-12 are in your cart." in got.text
    assert len(RUNS) == 1


async def test_openai_face_a_yes_sent_as_the_question_streams_in_is_decided(
    tmp_path: Path,
) -> None:
    import openai
    from serve_helpers import serving

    fake = GatedValidate()
    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(gated_confirm_config(), store=store,
                                         providers={"local": fake}, quiet=True)) as (url, _):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            async with client, asyncio.timeout(WAIT_S):
                thread: list[Any] = [{"role": "user", "content": "put 2 of JKT-12 in my cart"}]
                stream = await client.chat.completions.create(
                    model="chainrun-shop", messages=thread, stream=True)
                question = ""
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        question += chunk.choices[0].delta.content
                assert question == "Add 2 x JKT-12 to your cart?"
                thread += [{"role": "assistant", "content": question},
                           {"role": "user", "content": "yes"}]
                yes = await client.chat.completions.create(model="chainrun-shop",
                                                           messages=thread)  # fmt: skip
                fake.gate.set()
    finally:
        store.close()
    assert yes.choices[0].message.content == "Done: two JKT-12 are in your cart."
    assert len(RUNS) == 1


# -- a process killed mid-tool ---------------------------------------------------------
CRASH_TOOLS = '''
import json, os, time

def add_to_cart(sku, qty, idempotency_key):
    with open(os.environ["CART_FILE"], "a") as f:
        f.write(json.dumps({"key": idempotency_key, "sku": sku, "qty": qty}) + "\\n")
    time.sleep(float(os.environ.get("CART_SLEEP_S", "0")))
    return {"added": sku, "qty": qty}
'''

CRASH_CHILD = '''
import asyncio, sys
sys.path[:0] = [{tests!r}, {tmp!r}]
from test_confirm_actions import cart_fake, confirm_config, turn
from chainrun.chain import Chain
from chainrun.log.store import Store

async def main():
    cfg = confirm_config(function="crash_tools:add_to_cart", timeout_s={timeout})
    async with Chain(cfg, store=Store.open({db!r}), providers={{"local": cart_fake()}},
                     quiet=True) as chain:
        asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="k1")
        print(asked.pending_actions[0].id, flush=True)
        await turn(chain, "yes", conversation_id="k1")

asyncio.run(main())
'''


def _killed_mid_tool(tmp_path: Path, cart: Path, db: Path, timeout_s: float) -> str:
    """Run the asking turn and a yes in a child process, kill -9 it once its tool has
    started (it sleeps a minute); the action's id."""
    script = CRASH_CHILD.format(tests=str(TESTS), tmp=str(tmp_path), db=str(db),
                                timeout=timeout_s)  # fmt: skip
    env = {**os.environ, "CART_FILE": str(cart), "CART_SLEEP_S": "60"}
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None
        action_id = child.stdout.readline().strip()
        deadline = time.monotonic() + WAIT_S
        while not (cart.exists() and cart.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)  # the tool has started and has not finished
    finally:
        child.wait(timeout=WAIT_S)
        if child.stdout is not None:
            child.stdout.close()
    return action_id


async def test_killed_while_a_confirmed_tool_runs_then_a_new_yes_is_told_the_truth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 while the confirmed tool runs; a new process, a new "yes": the shopper is
    told it may not have been done and asked again (not "already done"), and the retry
    hands the tool the same idempotency key (the shop's system can tell it is one)."""
    import chainrun.actions.confirmations as confirmations

    monkeypatch.setattr(confirmations, "START_GRACE_S", 0.2, raising=False)
    (tmp_path / "crash_tools.py").write_text(CRASH_TOOLS)
    cart, db, timeout_s = tmp_path / "cart.jsonl", tmp_path / "log.db", 1.5
    action_id = await asyncio.to_thread(_killed_mid_tool, tmp_path, cart, db, timeout_s)
    started = [json.loads(line) for line in cart.read_text().splitlines()]
    assert [s["key"] for s in started] == [action_id]
    await asyncio.sleep(timeout_s + 0.3)  # the killed run's timeout has passed
    monkeypatch.setenv("CART_FILE", str(cart))
    monkeypatch.setenv("CART_SLEEP_S", "0")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = confirm_config(function="crash_tools:add_to_cart", timeout_s=timeout_s)
    async with Chain(cfg, store=Store.open(db), providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        told, _ = await turn(chain, "yes", conversation_id="k1")
        assert told.output is not None
        assert "cannot say it was done" in told.output and "already" not in told.output
        assert "Should I try again?" in told.output
        assert [a.id for a in told.pending_actions] == [action_id]  # pending again
        assert len(cart.read_text().splitlines()) == 1  # nothing ran on the news
        done, _ = await turn(chain, "yes", conversation_id="k1")
    runs = [json.loads(line) for line in cart.read_text().splitlines()]
    assert done.output == "Done: two JKT-12 are in your cart."
    assert [r["key"] for r in runs] == [action_id, action_id]  # the same key on the retry


# -- every argument that runs is asked -------------------------------------------------
async def test_a_confirm_tools_arguments_outside_its_schema_are_refused(tmp_path: Path) -> None:
    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": 2, "ship_to": "elsewhere"}),
        FakeReply("I could not do that.", gap_s=0.001)))  # fmt: skip
    async with Chain(confirm_config(), store=Store.open(tmp_path / "log.db"),
                     providers={"local": fake}, quiet=True) as chain:  # fmt: skip
        asked, events = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="a1")
    (call,) = [e for e in events if isinstance(e, ToolCallEvent)]
    assert call.status == "invalid_arguments"
    assert "'ship_to'" in fake.requests[-1].messages[-1]["content"]  # the model is told
    assert asked.pending_actions == () and RUNS == []


async def test_arguments_the_question_does_not_name_are_shown_in_it(tmp_path: Path) -> None:
    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": 2}), FakeReply("ok", gap_s=0.001)))
    cfg = confirm_config(confirm_question="Add {sku} to your cart?")
    async with Chain(cfg, store=Store.open(tmp_path / "log.db"), providers={"local": fake},
                     quiet=True) as chain:  # fmt: skip
        asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="a2")
    assert asked.output == "Add JKT-12 to your cart? (qty = 2)"


# -- checked again when it runs --------------------------------------------------------
async def test_a_tool_config_changed_since_the_question_asks_again(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    async with Chain(confirm_config(), store=Store.open(db), providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="r1")
    changed = confirm_config(confirm_question="Put {qty} x {sku} in your cart (paid now)?")
    async with Chain(changed, store=Store.open(db), providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        again, _ = await turn(chain, "yes", conversation_id="r1")
        assert RUNS == []
        assert again.output is not None and "please confirm again" in again.output
        assert "Put 2 x JKT-12 in your cart (paid now)?" in again.output
        assert [a.id for a in again.pending_actions] == [asked.pending_actions[0].id]
        done, _ = await turn(chain, "yes", conversation_id="r1")
    assert done.output == "Done: two JKT-12 are in your cart." and len(RUNS) == 1


async def test_a_schema_that_no_longer_takes_the_arguments_runs_nothing(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    async with Chain(confirm_config(), store=Store.open(db), providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="r2")
    stricter = {"type": "object", "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string"},
                               "qty": {"type": "integer", "maximum": 1}}}  # fmt: skip
    async with Chain(confirm_config(parameters=stricter), store=Store.open(db),
                     providers={"local": cart_fake()}, quiet=True) as chain:  # fmt: skip
        told, _ = await turn(chain, "yes", conversation_id="r2")
    assert RUNS == []
    assert told.output is not None and "no longer do that" in told.output
    assert told.decisions[0]["decision"] == "expired"


# -- a hung sync tool ------------------------------------------------------------------
HUNG = threading.Event()
HUNG_CALLS: list[int] = []


def hung_order_service(order_id: int) -> dict[str, Any]:
    """A shop's order service that stopped answering: blocks until the test lets go."""
    HUNG_CALLS.append(order_id)
    HUNG.wait(WAIT_S)
    return {"order_id": order_id, "status": "shipped"}


def product_lookup(sku: str) -> dict[str, Any]:
    return {"sku": sku, "in_stock": True}


def hung_tools_chain(log: Path) -> Chain:
    tool_call = {"lookup": ("product_lookup", {"sku": "JKT-12"}),
                 "order": ("order_service", {"order_id": 7})}  # fmt: skip

    def script(req: ChatRequest) -> FakeReply:
        prompt = req.messages[0]["content"]
        if any(m.get("role") == "tool" for m in req.messages):
            return FakeReply("Here is what I found.", ttft_s=0.001, gap_s=0.001)
        name, args = tool_call["order" if "order" in prompt else "lookup"]
        return FakeReply(tool_calls=[{"id": "c1", "name": name, "arguments": json.dumps(args)}],
                         gap_s=0.001)  # fmt: skip

    cfg = config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": "http://127.0.0.1:9/v1"}},
        "steps": {"answer": {"provider": "local", "prompt": "{message}", "stream": True,
                             "tools": ["order_service", "product_lookup"]}},
        "tools": {
            "order_service": {"description": "Look an order up",
                              "function": f"{__name__}:hung_order_service", "timeout_s": 0.3,
                              "parameters": {"type": "object", "required": ["order_id"],
                                             "properties": {"order_id": {"type": "integer"}}}},
            "product_lookup": {"description": "Look a product up",
                               "function": f"{__name__}:product_lookup",
                               "parameters": {"type": "object", "required": ["sku"],
                                              "properties": {"sku": {"type": "string"}}}},
        },
    })  # fmt: skip
    return Chain(cfg, store=Store.open(log), providers={"local": FakeProvider(
        name="local", script=script)}, quiet=True)  # fmt: skip


async def test_ten_hung_sync_tool_calls_leave_another_turns_ttft_alone(tmp_path: Path) -> None:
    """Ten turns whose sync tool hangs (a service that stopped answering) on a process
    whose default thread pool has 6 threads (as Python gives a 2-core machine): an
    unrelated turn that looks a product up (another sync tool) answers within 1 s of
    its time unloaded; the hung tool's calls past its threads are refused at once."""
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(6)
    loop.set_default_executor(pool)
    HUNG.clear()
    HUNG_CALLS.clear()
    try:
        async with hung_tools_chain(tmp_path / "log.db") as chain:
            alone, _ = await turn(chain, "is JKT-12 in stock?")
            flood = [asyncio.create_task(turn(chain, f"where is my order {i}?"))
                     for i in range(10)]  # fmt: skip
            await asyncio.sleep(0.5)  # the calls hang past their timeout_s
            async with asyncio.timeout(5):
                loaded, _ = await turn(chain, "is JKT-12 in stock?")
                await asyncio.wait_for(asyncio.to_thread(lambda: None), 1)
            HUNG.set()
            flooded = [done for done, _ in await asyncio.gather(*flood)]
    finally:
        HUNG.set()
        pool.shutdown(wait=False)
    assert alone.answer_ttft_ms is not None and loaded.answer_ttft_ms is not None
    assert loaded.answer_ttft_ms - alone.answer_ttft_ms < 1000.0
    assert len(HUNG_CALLS) == 4  # the tool's own 4 threads; the other calls refused
    assert all(d.status == "ok" for d in flooded)


# -- a replay plays the shopper's reply --------------------------------------------------
async def test_a_replay_of_a_conversation_with_a_confirmation_decides_as_live_without_acting(
    tmp_path: Path,
) -> None:
    from chainrun.replay.run import load_requests, run_requests

    db = tmp_path / "log.db"
    async with Chain(confirm_config(), store=Store.open(db), providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="p1")
        live, _ = await turn(chain, "yes please", conversation_id="p1")
    assert len(RUNS) == 1
    with Store.open(db) as store:
        lines = [{"id": f"p1-{t.turn_index}", "message": t.input, "conversation_id": "p1",
                  "turn": t.turn_index} for t in store.turns(asked.run_id)]  # as exported
        path = tmp_path / "replay.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        got: list[TurnFinished] = []
        run_id = await run_requests(confirm_config(), load_requests(path), store,
                                    providers={"local": cart_fake()}, quiet=True,
                                    on_turn=lambda _, done: got.append(done))  # fmt: skip
        calls = store.tool_calls([run_id])
    assert len(RUNS) == 1  # the replay acted on nothing
    replay_ask, replay_yes = got
    assert replay_ask.output == asked.output and len(replay_ask.pending_actions) == 1
    assert [d["decision"] for d in replay_yes.decisions] == [
        d["decision"] for d in live.decisions] == ["confirmed"]
    assert replay_yes.output == live.output
    assert [c.status for c in calls] == ["confirmed", "stubbed"]  # asked, then decided


@contextlib.contextmanager
def _pg_log(route: str) -> Iterator[tuple[str, str]]:
    """A new PostgreSQL log: (the DSN the servers use, the DSN to read it directly);
    ``route`` ``pgbouncer``: through PgBouncer in transaction mode."""
    from log_backends import need_pg, pg_schema

    if route == "pgbouncer":
        from test_log_pgbouncer import bounced_db

        with bounced_db() as (bounced, direct):
            yield bounced, direct
        return
    with pg_schema(need_pg()) as dsn:
        yield dsn, dsn


@pytest.mark.parametrize("route", ["direct", "pgbouncer"])
async def test_five_yeses_at_once_to_two_serve_processes_on_postgresql_place_once(
    tmp_path: Path, route: str
) -> None:
    """The example shop served by two ``chainrun serve`` processes on one PostgreSQL log
    (directly, and through PgBouncer): the order asked on the first, then five yeses at
    once (a client retrying), spread over both: the tool runs once (one started run in
    the log, one order placed), and every other answer says the order is done or being
    done."""
    import httpx
    from serve_helpers import chat
    from test_shop_example import SHOP, placed, serve_shop

    from chainrun.lab import LabServer, load_scenario

    with LabServer(load_scenario(SHOP / "lab.toml")) as lab, _pg_log(route) as (dsn, direct):
        with serve_shop(lab, tmp_path, db=dsn) as first, \
                serve_shop(lab, tmp_path, db=dsn) as second:  # fmt: skip
            async with httpx.AsyncClient(base_url=first, timeout=60) as one, \
                    httpx.AsyncClient(base_url=second, timeout=60) as two:  # fmt: skip
                asked = await chat(one, "Please place an order for 2 of JKT-012",
                                   conversation_id="five-1")  # fmt: skip
                (action,) = [d for e, d in asked if e == "action"]
                yeses = await asyncio.gather(*[
                    chat([one, two][i % 2], "yes", conversation_id="five-1",
                         **({"confirm": action["id"]} if i % 3 == 0 else {}))
                    for i in range(5)])  # fmt: skip
        with Store.open(direct, create=False) as log:
            run_ids = [r["id"] for r in log.log.query("select id from runs")]
            runs = [c for c in log.tool_calls(run_ids)
                    if c.action_id == action["id"] and c.started_offset_ms is not None]
    outputs = [events[-1][1]["output"] for events in yeses]
    assert len(runs) == 1, outputs
    assert [(sku, qty) for _, sku, qty in placed(tmp_path)] == [("JKT-012", 2)]
    assert sum('"placed": true' in out for out in outputs) == 1, outputs
    for out in outputs:
        assert '"placed": true' in out or "being carried out now" in out or (
            "already done" in out), outputs


async def test_a_product_gone_from_the_catalogue_since_the_question_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import chainrun.chain

    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-012", "qty": 2}), FakeReply("Done.", gap_s=0.001)))
    cfg = confirm_config(product_arguments=["sku"])
    async with Chain(cfg, store=Store.open(tmp_path / "log.db"), providers={"local": fake},
                     quiet=True) as chain:  # fmt: skip
        asked, _ = await turn(chain, "put 2 of JKT-012 in my cart", conversation_id="g1")
        assert asked.output == "Add 2 x JKT-012 to your cart?"
        monkeypatch.setattr(chainrun.chain, "get_products", lambda db, ids: [])  # sold out
        told, _ = await turn(chain, "yes", conversation_id="g1")
    assert RUNS == []
    assert told.output is not None and "JKT-012 is no longer in the catalogue" in told.output


async def test_on_the_lab_a_yes_sent_as_the_question_arrives_is_decided_on_both_faces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example shop on the latency lab, with a validate step after the answer on a
    lab that takes 3 s a call: on /chat a confirm sent as the ``action`` event arrives,
    and on the OpenAI face a "yes" sent as the streamed question ends, are decided
    (the order placed once each), while the asking turns' validate still runs."""
    import tomllib

    import httpx
    import openai
    from serve_helpers import serving, sse
    from test_shop_example import SHOP, placed

    from chainrun.lab import LabServer, load_scenario

    monkeypatch.setenv("SHOP_DB", str(tmp_path / "s.db"))
    with LabServer(load_scenario(SHOP / "lab.toml")) as lab, \
            LabServer(load_scenario(SHOP / "lab.toml", median_ms=3000, sigma=0)) as slow:
        data = tomllib.loads((SHOP / "chainrun.toml").read_text(encoding="utf-8"))
        data["providers"] = {"local": {"base_url": lab.base_url},
                             "slow": {"base_url": slow.base_url}}  # fmt: skip
        data["order"] = [*data["order"], "validate"]
        data["steps"]["validate"] = {**DEFAULT_CHAIN["steps"]["validate"], "provider": "slow"}
        path = str(SHOP / "chainrun.toml")
        cfg = config_from_dict(data, path, path=path)
        store = Store.open(tmp_path / "log.db")
        try:
            async with serving(lambda: Chain(cfg, store=store, quiet=True)) as (url, _):
                async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
                    t0 = time.monotonic()
                    async with client.stream("POST", "/chat", json={
                            "message": "Please place an order for 2 of JKT-012",
                            "conversation_id": "lab-1"}) as r:  # fmt: skip
                        async for event, data_ in sse(r):
                            if event == "action":
                                chat_yes = await client.post("/chat", json={
                                    "conversation_id": "lab-1", "confirm": data_["id"]})
                                chat_yes_s = time.monotonic() - t0
                oa = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
                async with oa:
                    thread: list[Any] = [{"role": "user",
                                          "content": "Please place an order for 3 of JKT-012"}]
                    stream = await oa.chat.completions.create(
                        model="chainrun-shop", messages=thread, stream=True)
                    question = ""
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].delta.content:
                            question += chunk.choices[0].delta.content
                    thread += [{"role": "assistant", "content": question},
                               {"role": "user", "content": "yes"}]
                    oa_yes = await oa.chat.completions.create(model="chainrun-shop",
                                                              messages=thread)  # fmt: skip
        finally:
            store.close()
    assert chat_yes.status_code == 200, chat_yes.text
    turn_ev = [line for line in chat_yes.text.splitlines() if line.startswith("data:")][-1]
    assert '"placed": true' in json.loads(turn_ev.removeprefix("data:"))["output"]
    assert chat_yes_s < 6.0  # decided before the asking turn's 3 s validate had ended twice
    assert question == "Place an order for 3 x JKT-012?"
    assert '"placed": true' in (oa_yes.choices[0].message.content or "")
    assert sorted((sku, qty) for _, sku, qty in placed(tmp_path)) == [("JKT-012", 2),
                                                                      ("JKT-012", 3)]


async def test_an_eval_conversation_asks_and_its_next_case_confirms_without_acting(
    tmp_path: Path,
) -> None:
    from chainrun.evals.cases import parse_case
    from chainrun.evals.runner import run_eval

    cases = [parse_case({
        "id": "ask", "conversation_id": "e1", "turn": 1, "message": "put 2 of JKT-12 in my cart",
        "assert": [{"type": "tool-called", "tool": "add_to_cart",  # asked, then decided
                    "status": "confirmed"}]}),
        parse_case({
        "id": "yes", "conversation_id": "e1", "turn": 2, "message": "yes please",
        "assert": [{"type": "tool-called", "tool": "add_to_cart", "status": "stubbed"},
                   {"type": "contains", "value": "Done"}]})]  # fmt: skip
    with Store.open(tmp_path / "log.db") as store:
        summary = await run_eval(confirm_config(), cases, store,
                                 providers={"local": cart_fake()}, quiet=True)  # fmt: skip
    assert RUNS == []
    assert summary["cases"]["passed"] == 2, summary


async def test_an_asking_turn_refused_by_its_guard_withdraws_its_question(
    tmp_path: Path,
) -> None:
    """The model asks for the confirm tool at once; the input guard refuses the turn
    300 ms later: the shopper never gets the question, so the action is withdrawn
    (``expired`` by ``turn_failed``), and a later yes runs nothing."""
    from test_tool_steps import GUARD_PROMPT, guard_and_answer, tool_config

    fake = FakeProvider(name="local", script=guard_and_answer(
        FakeReply("unsafe\nS2", ttft_s=0.3),
        rounds_script(cart_call({"sku": "JKT-12", "qty": 2}), FakeReply("Done."))))
    guard = {"kind": "guard", "prompt": GUARD_PROMPT, "on_missing_verdict": "closed",
             "deadline_s": 5.0}  # fmt: skip
    data = tool_config(guard=guard).model_dump(mode="json", exclude={"path"})
    data["tools"]["add_to_cart"]["confirm"] = True
    db = tmp_path / "log.db"
    async with Chain(config_from_dict(data), store=Store.open(db), providers={"local": fake},
                     quiet=True) as chain:  # fmt: skip
        refused, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="w1")
        later, _ = await turn(chain, "yes", conversation_id="w1")
    assert refused.status == "refused" and refused.pending_actions == ()
    assert RUNS == [] and later.decisions == ()
    with Store.open(db, create=False) as log:
        rows = log.log.query("select status, decided_by from actions")
    # the guard refuses every turn here: the yes turn's own ask is withdrawn too
    assert {(r["status"], r["decided_by"]) for r in rows} == {("expired", "turn_failed")}
