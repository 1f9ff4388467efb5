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
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import chat, serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
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
                cart = await chat(client, "Please add 2 of product JKT-12 to my cart")
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
    assert rows == [(f"{turn2['turn_id']}:compose:1:0", "JKT-12", 2)]


def test_the_shop_config_names_tools_that_import() -> None:
    cfg = tomllib.loads((SHOP / "chainrun.toml").read_text(encoding="utf-8"))
    assert json.dumps(sorted(cfg["tools"])) == '["add_to_cart", "order_status", "place_order"]'
    chain = Chain(config_from_dict(cfg, "shop", path=str(SHOP / "chainrun.toml")), store=None)
    assert sorted(chain.tools) == ["add_to_cart", "order_status", "place_order"]
    assert chain.tools["place_order"].config.confirm
    assert not chain.tools["add_to_cart"].config.confirm


@contextlib.contextmanager
def serve_shop(lab: LabServer, tmp_path: Path, *, db: str | None = None,
               extra: str = "", env_extra: dict[str, str] | None = None) -> Iterator[str]:
    """``chainrun serve --config`` on a copy of the example pointed at ``lab`` (``extra``:
    TOML appended to it), the shop's tools on ``tmp_path/s.db``, the run log ``db``
    (default ``tmp_path/log.db``); yields the base URL, stops it with SIGTERM."""
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
         "--db", db or str(tmp_path / "log.db")],
        stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()
        assert line.startswith("chainrun serve: http://"), line + proc.stderr.read()
        yield line.split()[2].rstrip("/")
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
                page.fill("#message", "Please place an order for 2 of JKT-12")
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
    assert question == "Place an order for 2 x JKT-12?" and asked == question
    assert before == []
    rows = placed(tmp_path)
    assert [(sku, qty) for _, sku, qty in rows] == [("JKT-12", 2)]
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
