"""The example shop (examples/shop/) against the latency lab, through ``/chat``: "Where is
my order 1042?" is answered from the order_status tool's result, the cart tool runs
once per call with its idempotency key, and an order is placed only after the shopper's
yes (the chat page's Yes button, clicked in headless Chromium)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import chat, serving, sse
from test_tool_steps import is_key

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.events import TurnFinished
from chainrun.lab import LabServer, load_scenario
from chainrun.log.store import Store

SHOP = Path(__file__).resolve().parents[1] / "examples" / "shop"


@pytest.fixture(scope="module")
def shop_lab() -> Iterator[LabServer]:
    with LabServer(load_scenario(SHOP / "lab.toml")) as lab:
        yield lab


def shop_config(lab: LabServer) -> object:
    data = tomllib.loads((SHOP / "chainrun.toml").read_text(encoding="utf-8"))
    data["providers"]["local"]["base_url"] = lab.base_url  # the lab on its own port
    return config_from_dict(data, str(SHOP / "chainrun.toml"), path=str(SHOP / "chainrun.toml"))


async def test_the_shop_answers_an_order_question_from_the_tool(
    shop_lab: LabServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_DB", str(tmp_path / "shop.db"))
    cfg = shop_config(shop_lab)
    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(cfg, store=store, quiet=True)) as (url, _):
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                order = await chat(client, "Where is my order 1042?")
                cart = await chat(client, "Please add 2 of product JKT-012 to my cart")
    finally:
        store.close()
    turn = order[-1][1]
    assert turn["status"] == "ok"
    assert "order_status" in turn["output"] and '"status": "shipped"' in turn["output"]
    assert '"order_id": 1042' in turn["output"] and "DHL" in turn["output"]
    tools = [d for e, d in order if e == "tool"]
    assert [(d["phase"], d["tool"]) for d in tools] == [("started", "order_status"),
                                                       ("finished", "order_status")]  # fmt: skip
    # the cart: one row in the shop's table per call, keyed by the idempotency key
    turn2 = cart[-1][1]
    assert turn2["status"] == "ok" and '"added": true' in turn2["output"]
    with sqlite3.connect(tmp_path / "shop.db") as db:
        rows = db.execute("select idempotency_key, sku, qty from cart").fetchall()
    (compose,) = [s for s in turn2["steps"] if s["step"] == "compose"]
    assert len(compose["tool_calls"]) == 1
    ((key, sku, qty),) = rows
    assert is_key(key, turn2["turn_id"], "compose:1:0") and (sku, qty) == ("JKT-012", 2)


def test_the_shop_config_names_tools_that_import() -> None:
    cfg = tomllib.loads((SHOP / "chainrun.toml").read_text(encoding="utf-8"))
    assert json.dumps(sorted(cfg["tools"])) == '["add_to_cart", "order_status", "place_order"]'
    chain = Chain(config_from_dict(cfg, "shop", path=str(SHOP / "chainrun.toml")), store=None)
    assert sorted(chain.tools) == ["add_to_cart", "order_status", "place_order"]
    assert chain.tools["place_order"].config.confirm
    assert not chain.tools["add_to_cart"].config.confirm


@contextlib.contextmanager
def serve_shop(lab: LabServer, tmp_path: Path, *, db: str | None = None, extra: str = "",
               env_extra: dict[str, str] | None = None,
               args: tuple[str, ...] = ()) -> Iterator[str]:  # fmt: skip
    """``chainrun serve --config`` on a copy of the example pointed at ``lab`` (``extra``:
    TOML appended to it; ``args``: more options of serve), the shop's tools on
    ``tmp_path/s.db``, the run log ``db`` (default ``tmp_path/log.db``); yields the base
    URL once ``/readyz`` says ready, stops it with SIGTERM."""
    shop = tmp_path / "shop"
    if not shop.exists():
        shutil.copytree(SHOP, shop, ignore=shutil.ignore_patterns("*.db", "__pycache__"))
    cfg = shop / "chainrun.toml"
    text = (SHOP / "chainrun.toml").read_text(encoding="utf-8")
    cfg.write_text(text.replace("http://127.0.0.1:8090/v1", lab.base_url) + extra,
                   encoding="utf-8")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SHOP.parents[1]), "SHOP_DB": str(tmp_path / "s.db"),
           **(env_extra or {})}  # fmt: skip
    env.pop("CHAINRUN_SERVE_TOKEN", None)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
         "--db", db or str(tmp_path / "log.db"), *args],
        stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()
        assert line.startswith("chainrun serve: http://"), line + proc.stderr.read()
        url = line.split()[2].rstrip("/")
        for _ in range(300):  # until its providers answered their preflight
            if httpx.get(url + "/readyz", timeout=10).status_code == 200:
                break
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stderr.close()


def ready_page(browser: Any, url: str) -> Any:
    """A 1280x720 page of the chat page at ``url``, once it says ready."""
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(url + "/")
    page.wait_for_selector('#ready[data-state="ready"]', timeout=30_000)
    return page


def placed(tmp_path: Path) -> list[tuple[str, str, int]]:
    """The shop's placed orders (idempotency key, sku, qty): one row per run of the tool."""
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        db.execute("create table if not exists placed (idempotency_key text primary key, "
                   "sku text not null, qty integer not null)")  # fmt: skip
        return db.execute("select idempotency_key, sku, qty from placed").fetchall()


def test_the_chat_page_asks_before_placing_an_order_and_a_yes_click_places_it_once(
    shop_lab: LabServer, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright
    from test_serve_browser import ARGS, CHROMIUM

    with serve_shop(shop_lab, tmp_path) as url:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = ready_page(browser, url)
                page.click("#new")
                page.fill("#message", "Please place an order for 2 of JKT-012")
                page.press("#message", "Enter")
                page.wait_for_selector("#messages li.action button.yes", timeout=60_000)
                question = page.text_content("#messages li.action .question")
                asked = page.text_content("#answer")
                before = placed(tmp_path)
                page.click("#messages li.action button.yes")
                page.wait_for_function(
                    "() => document.querySelectorAll('#messages li.assistant[data-status=\"ok\"]')"
                    ".length === 2", timeout=60_000)  # fmt: skip
                answer = page.text_content("#answer") or ""
                buttons = page.eval_on_selector_all(
                    "#messages li.action button", "bs => bs.map(b => b.disabled)")
                thread = page.eval_on_selector_all(
                    "#messages li", "items => items.map(i => i.className)")
            finally:
                browser.close()
    assert question == "Place an order for 2 x JKT-012?" and asked == question
    assert before == []
    rows = placed(tmp_path)
    assert [(sku, qty) for _, sku, qty in rows] == [("JKT-012", 2)]
    assert rows[0][0].endswith(":compose:1:0")  # the action's id: the asking call's key
    assert "place_order" in answer and '"placed": true' in answer
    assert buttons == [True, True]  # decided: the buttons are spent
    assert thread == ["user", "assistant", "action", "user", "assistant"]


def test_the_shop_through_the_cli_and_the_chat_page(shop_lab: LabServer, tmp_path: Path) -> None:
    """As a new user would: ``chainrun serve --config`` on the example (pointed at this
    lab's port), the chat page asked "Where is my order 1042?": the answer comes from the
    tool and the waterfall draws the tool call under compose."""
    from playwright.sync_api import sync_playwright
    from test_serve_browser import ARGS, CHROMIUM

    with serve_shop(shop_lab, tmp_path) as url:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = ready_page(browser, url)
                page.fill("#message", "Where is my order 1042?")
                page.press("#message", "Enter")
                page.wait_for_selector('#answer[data-status="ok"]', timeout=60_000)
                page.wait_for_selector('.wf-row[data-step="compose"] .wf-tool[data-status="ok"]')
                answer = page.text_content("#answer") or ""
                tool = page.eval_on_selector(
                    '.wf-row[data-step="compose"] .wf-tool',
                    "t => [t.dataset.tool, t.style.width, t.title]")  # fmt: skip
                skipped = page.get_attribute('.wf-row[data-step="retrieve"]', "data-status")
                page.screenshot(path=str(tmp_path / "shop.png"), full_page=True)
            finally:
                browser.close()
    assert '"status": "shipped"' in answer and "order_status" in answer
    assert tool[0] == "order_status" and tool[1].startswith("max(3px")
    assert "round 1" in tool[2] and "ok" in tool[2]
    assert skipped == "skipped"  # an order question searches no catalogue
    keep = os.environ.get("CHAINRUN_SCREENSHOT_SHOP")
    if keep:
        shutil.copy(tmp_path / "shop.png", keep)


def answer(response: httpx.Response) -> str:
    """The output of a whole ``/chat`` response's ``turn`` event."""
    lines = response.text.splitlines()
    (data,) = [lines[i + 1] for i, line in enumerate(lines) if line == "event: turn"]
    return str(json.loads(data.removeprefix("data: "))["output"])


@pytest.mark.parametrize("signed", [False, True], ids=["gateway-header", "signed-token"])
async def test_each_identity_sees_only_its_own_orders_and_conversations(
    shop_lab: LabServer, tmp_path: Path, signed: bool
) -> None:
    """``chainrun serve --identity-header`` on the example: the gateway's header (or an
    HS256 token under ``CHAINRUN_SERVE_IDENTITY_KEY``, made by joserfc, an independent
    JOSE implementation) names the shopper; order_status finds only the shopper's own
    orders (``context.user``); a conversation started by one shopper is refused to the
    other (403, said once) on /chat and on the OpenAI face (the conversation named in
    ``metadata.conversation_id``), its answers nowhere in it."""
    import openai

    key = "k3y-of-the-shop-gateway-0123456789abcdef"

    def who(user_id: str) -> dict[str, str]:
        if not signed:
            return {"X-Shopper": user_id}
        from joserfc import jwt
        from joserfc.jwk import OctKey

        claims = {"sub": user_id, "exp": int(time.time()) + 600, "tier": "gold"}
        return {"X-Shopper": jwt.encode({"alg": "HS256"}, claims, OctKey.import_key(key))}

    async def ask(client: httpx.AsyncClient, user: str, message: str, conv: str) -> httpx.Response:
        return await client.post("/chat", json={"message": message, "conversation_id": conv},
                                 headers=who(user))  # fmt: skip

    env = {"CHAINRUN_SERVE_IDENTITY_KEY": key} if signed else {}
    with serve_shop(shop_lab, tmp_path, args=("--identity-header", "X-Shopper"),
                    env_extra=env) as url:  # fmt: skip
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            ann = await ask(client, "u-ann", "Where is my order 1042?", "ann-1")
            bob = await ask(client, "u-bob", "Where is my order 1042?", "bob-1")
            bobs = await ask(client, "u-bob", "Where is my order 1043?", "bob-1")
            stolen = await ask(client, "u-bob", "Where is my order 1044?", "ann-1")
            anonymous = await client.post("/chat", json={"message": "Where is my order 1042?"})
            forged = await client.post("/chat", json={"message": "hi"},
                                       headers={"X-Shopper": "u-ann.x.y" if signed else "u" * 400})
        v1 = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0,
                                default_headers=who("u-bob"))  # fmt: skip
        try:
            with pytest.raises(openai.PermissionDeniedError) as refused:
                await v1.chat.completions.create(
                    model="chainrun-shop", metadata={"conversation_id": "ann-1"},
                    messages=[{"role": "user", "content": "Where is my order 1044?"}])
            own = await v1.chat.completions.create(
                model="chainrun-shop", metadata={"conversation_id": "bob-2"},
                messages=[{"role": "user", "content": "Where is my order 1043?"}])
        finally:
            await v1.close()
    assert ann.status_code == bob.status_code == bobs.status_code == 200
    assert '"status": "shipped"' in answer(ann) and '"found": true' in answer(ann)
    assert '"order_id": 1042, "found": false' in answer(bob) and "shipped" not in bob.text
    assert '"status": "processing"' in answer(bobs)
    assert stolen.status_code == 403 and stolen.headers["content-type"] == "application/json"
    assert stolen.json()["error"]["message"] == "this conversation belongs to another user"
    assert "1042" not in stolen.text and "shipped" not in stolen.text
    assert refused.value.status_code == 403 and "shipped" not in refused.value.response.text
    assert '"status": "processing"' in (own.choices[0].message.content or "")
    assert anonymous.status_code == forged.status_code == 401
    assert "X-Shopper" in anonymous.json()["error"]["message"]
    with contextlib.closing(sqlite3.connect(tmp_path / "log.db")) as db:
        users = db.execute("select conversation_id, user_id from turns order by id").fetchall()
        owners = dict(db.execute("select conversation_id, user_id from conversation_owners"))
    assert users == [("ann-1", "u-ann"), ("bob-1", "u-bob"), ("bob-1", "u-bob"),
                     ("bob-2", "u-bob")]  # fmt: skip
    assert owners == {"ann-1": "u-ann", "bob-1": "u-bob", "bob-2": "u-bob"}


async def test_an_order_asked_on_one_serve_process_is_placed_by_a_yes_on_another(
    shop_lab: LabServer, tmp_path: Path
) -> None:
    """Two ``chainrun serve`` processes on one PostgreSQL log: the ask on the first, the
    yes on the second (which reads the pending action from the log) places the order
    once; the same yes sent to the first afterwards places nothing more."""
    from log_backends import need_pg, pg_schema

    with pg_schema(need_pg()) as dsn:
        with serve_shop(shop_lab, tmp_path, db=dsn) as first, \
                serve_shop(shop_lab, tmp_path, db=dsn) as second:  # fmt: skip
            async with httpx.AsyncClient(timeout=60) as client, \
                    httpx.AsyncClient(base_url=second, timeout=60) as other:  # fmt: skip
                async with client.stream("POST", first + "/chat", json={
                        "message": "Please place an order for 3 of JKT-012",
                        "conversation_id": "pg-1"}) as r:  # fmt: skip
                    asked = [ev async for ev in sse(r)]
                (action,) = [d for e, d in asked if e == "action"]
                before = placed(tmp_path)
                yes = await chat(other, "yes",
                                 conversation_id="pg-1", confirm=action["id"])
                again = await client.post(first + "/chat", json={
                    "conversation_id": "pg-1", "confirm": action["id"]})  # fmt: skip
    assert action["question"] == "Place an order for 3 x JKT-012?" and before == []
    assert [(sku, qty) for _, sku, qty in placed(tmp_path)] == [("JKT-012", 3)]
    assert placed(tmp_path)[0][0] == action["id"]
    turn = yes[-1][1]
    assert turn["status"] == "ok" and '"placed": true' in turn["output"]
    assert yes[0][1]["conversation_id"] == "pg-1"
    assert again.status_code == 200 and "event: action" not in again.text


async def test_the_shops_second_turn_sends_the_first_as_role_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example's compose prompt starts with ``{history}`` in the ``messages`` layout:
    a follow-up's answer request holds the first turn's message, its tool call with the
    result, and its answer, as role messages (without it each turn started afresh)."""
    monkeypatch.setenv("SHOP_DB", str(tmp_path / "shop.db"))
    with LabServer(load_scenario(SHOP / "lab.toml"), record_bodies=True) as lab:
        cfg = shop_config(lab)
        store = Store.open(tmp_path / "log.db")
        try:
            async with serving(lambda: Chain(cfg, store=store, quiet=True)) as (url, _):
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    first = await chat(client, "Where is my order 1042?")
                    cid = first[-1][1]["conversation_id"]
                    await chat(client, "And when will it arrive?", conversation_id=cid)
        finally:
            store.close()
        requests = [r["messages"] for r in lab.requests() if r["messages"]]
    follow_up = {"role": "user", "content": "And when will it arrive?"}
    # the follow-up's first answer request: the follow-up its last message
    last = next(m for m in requests if m[-1] == follow_up and m[0]["role"] == "system")
    roles = [m["role"] for m in last]
    assert roles[:2] == ["system", "user"] and "Where is my order 1042?" in last[1]["content"]
    calls = [m for m in last if m["role"] == "assistant" and m.get("tool_calls")]
    results = [m for m in last if m["role"] == "tool"]
    assert calls and calls[0]["tool_calls"][0]["function"]["name"] == "order_status"
    assert results and '"status": "shipped"' in results[0]["content"]


def test_the_shops_tools_refuse_a_product_the_catalogue_does_not_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A product id the model made up (JKT-12: the catalogue's is JKT-012) is refused by
    the cart and the order, and nothing is recorded; a catalogue product is recorded once."""
    monkeypatch.setenv("SHOP_DB", str(tmp_path / "s.db"))
    monkeypatch.syspath_prepend(str(SHOP))
    import shop_tools

    made_up = shop_tools.add_to_cart("JKT-12", 2, "t1:compose:1:0")
    order = shop_tools.place_order("JKT-12", 2, "t1:compose:1:1")
    real = shop_tools.add_to_cart("JKT-012", 2, "t2:compose:1:0")
    assert made_up == {"error": "no product 'JKT-12' in the catalogue", "sku": "JKT-12"}
    assert order == {"error": "no product 'JKT-12' in the catalogue", "sku": "JKT-12"}
    assert real["added"] is True and real["items_in_cart"] == 2
    assert placed(tmp_path) == []
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        assert db.execute("select sku, qty from cart").fetchall() == [("JKT-012", 2)]


async def test_an_order_for_a_product_the_catalogue_does_not_hold_is_not_asked_about(
    shop_lab: LabServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """"Please place an order for a jacket" names no SKU, so the lab's model asks for
    place_order with sku "lab": chainrun does not ask "Place an order for 1 x lab?" and
    records nothing pending; the model is told the catalogue has no such product
    (product_arguments) and answers from that."""
    monkeypatch.setenv("SHOP_DB", str(tmp_path / "s.db"))
    with Store.open(tmp_path / "log.db") as store:
        async with Chain(shop_config(shop_lab), store=store, quiet=True) as chain:
            events = [e async for e in chain.stream_turn("Please place an order for a jacket",
                                                         conversation_id="c-lab")]
        done = events[-1]
        assert isinstance(done, TurnFinished)
        rows = store.tool_calls(done.run_id)  # written once the chain closed
    assert done.label == "place_order" and done.pending_actions == ()
    assert "Place an order" not in (done.output or "")
    assert "no product 'lab' in the catalogue" in (done.output or "")
    assert [(r.tool, r.status, r.question) for r in rows] == [
        ("place_order", "invalid_arguments", None)]
    assert placed(tmp_path) == []
