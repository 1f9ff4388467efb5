"""The chat page in a real browser: Debian's chromium, headless, driven by Playwright.

``chainrun serve`` runs as the CLI runs it (a subprocess) with the latency lab as its
model server; the test types a question, watches the waterfall fill in while the answer
streams, waits for the turn, checks that user text went in as text, and saves a
screenshot (``CHAINRUN_SCREENSHOT=path`` keeps a copy, e.g. for the README).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chainrun.lab import LabServer

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):  # .ci/run installs it: missing there is a failure, not a skip
        raise RuntimeError(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    pytest.skip(f"{CHROMIUM} is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("serve-browser")
    with LabServer("fast", n_tokens=24, per_token_ms=20) as lab:
        cfg = tmp / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("CHAINRUN_SERVE_TOKEN", None)
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
             "--db", str(tmp / "log.db"), "--step-events"],  # the waterfall's events
            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
        )  # fmt: skip
        assert proc.stderr is not None
        try:
            line = proc.stderr.readline()
            assert line.startswith("chainrun serve: http://"), line
            yield line.split()[2].rstrip("/")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            proc.stderr.close()


def test_the_page_streams_the_answer_and_fills_the_waterfall(served: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    question = 'do you have a linen shirt? <img src=x onerror="window.pwned=1"><b>bold</b>'
    shot = tmp_path / "serve.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(served + "/")
            page.wait_for_selector('#ready[data-state="ready"]', timeout=30_000)
            page.fill("#message", question)
            page.press("#message", "Enter")
            # live: a step is drawn running before the turn has finished
            page.wait_for_selector('.wf-row[data-status="running"] .wf-bar', timeout=20_000)
            assert page.text_content("#turn-status") == "running"
            page.wait_for_selector('#answer[data-status="ok"]', timeout=60_000)
            page.wait_for_selector('.wf-row[data-step="critique"][data-status="ok"]')
            page.screenshot(path=str(shot), full_page=True)
            answer = page.text_content("#answer") or ""
            rows = page.eval_on_selector_all(
                ".wf-row",
                "rows => rows.map(r => [r.dataset.step, r.dataset.status, "
                "r.querySelector('.wf-bar').style.width, "
                "!!r.querySelector('.wf-ttft'), r.querySelector('.wf-facts').textContent])",
            )
            user = page.text_content("#messages li.user")
            injected = page.evaluate("() => [document.querySelectorAll('#messages img, "
                                     "#messages b').length, window.pwned === 1]")  # fmt: skip
            status = page.text_content("#turn-status") or ""
            # the answer's grounding check, as the page shows it
            page.wait_for_selector("#grounding:not([hidden])", timeout=10_000)
            grounding = page.text_content("#grounding") or ""
            # the products the answer lists, as cards drawn from the products event
            page.wait_for_selector("#messages li.products .card", timeout=10_000)
            cards = page.eval_on_selector_all(
                "#messages li.products .card",
                "cards => cards.map(c => [c.dataset.productId, "
                "c.querySelector('.title').textContent, c.querySelector('.price').textContent])",
            )
            shown = page.text_content("#answer") or ""  # once the cards are drawn
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert grounding.startswith("Grounding: ") and "claims checked" in grounding
    assert 1 <= len(cards) <= 3
    for product_id, title, price in cards:
        # the cards show the products; the text no longer lists them beside the cards
        assert product_id not in shown and title not in shown, shown
        assert re.search(r"\d", price), price
    assert shown.strip() and shown.strip() in answer  # the model's sentence stays
    assert answer.strip() and "<" not in answer
    assert [r[0] for r in rows] == ["classify", "retrieve", "policy", "compose", "validate",
                                    "critique"]  # fmt: skip
    model_steps = {"compose", "validate", "critique"}  # classify calls no model
    for step, st, width, has_ttft, facts in rows:
        if step == "policy":  # a product question: the catalogue route, not the policy's
            assert st == "skipped", (step, st)
            continue
        # the lab's words are no JSON: validate fails open (the turn goes on unchecked)
        assert st == ("failed_open" if step == "validate" else "ok"), (step, st)
        assert width.endswith("%") and float(width[:-1]) > 0, (step, width)
        assert has_ttft == (step in model_steps), step  # model steps show their TTFT mark
        assert ("TTFT" in facts) == (step in model_steps), facts
        assert re.match(r"\d+(\.\d+)? m?s", facts), facts  # the duration first
    assert user == question and injected == [0, False]  # inserted as text, never as HTML
    assert status.startswith("ok · turn ")
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("CHAINRUN_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_the_page_is_served_without_a_token_but_chat_needs_it(tmp_path: Path) -> None:
    # the page itself holds no data; with a token set, /chat refuses without it (and the
    # page then asks for the token)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CHAINRUN_SERVE_TOKEN": "t0ken"}
    with LabServer("fast") as lab:
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
             "--db", str(tmp_path / "log.db")],
            stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert proc.stderr is not None
        try:
            url = proc.stderr.readline().split()[2].rstrip("/")
            with urllib.request.urlopen(url + "/", timeout=10) as r:
                assert r.status == 200
            req = urllib.request.Request(url + "/chat", data=b'{"message": "hi"}', method="POST")
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == 401
            e.value.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            proc.stderr.close()


def test_the_page_keeps_its_conversation_and_shows_the_thread(served: str) -> None:
    from playwright.sync_api import sync_playwright

    def ask(page: Any, text: str, n_answers: int) -> None:
        page.fill("#message", text)
        page.press("#message", "Enter")
        page.wait_for_function(
            f"() => document.querySelectorAll('#messages li.assistant[data-status=\"ok\"]')"
            f".length === {n_answers}", timeout=60_000)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(served + "/")
            page.wait_for_selector('#ready[data-state="ready"]', timeout=30_000)
            page.click("#new")  # a clean start, whatever the session held
            ask(page, "Do you have rain jackets?", 1)
            ask(page, "Which of those is cheapest?", 2)
            second = page.text_content("#turn-status") or ""
            thread = page.eval_on_selector_all(  # the messages (product cards left out)
                "#messages li:not(.products)",
                "items => items.map(i => [i.className, i.textContent])")
            label = page.text_content("#conversation") or ""
            page.reload()  # the conversation survives a reload of the page
            page.wait_for_selector('#ready[data-state="ready"]', timeout=30_000)
            restored = page.eval_on_selector_all("#messages li", "items => items.length")
            page.click("#new")
            cleared = page.eval_on_selector_all("#messages li", "items => items.length")
            ask(page, "Any scarves?", 1)
            fresh = page.text_content("#turn-status") or ""
        finally:
            browser.close()
    assert "#2 of its conversation" in second
    assert [c for c, _ in thread] == ["user", "assistant", "user", "assistant"]
    asked = [t for _, t in thread[::2]]
    assert asked == ["Do you have rain jackets?", "Which of those is cheapest?"]
    assert label.startswith("conversation ") and label.endswith("2 turns")
    assert restored == 4 and cleared == 0
    assert "#1 of its conversation" in fresh


#: a page on another origin: form posts of JSON-looking text/plain bodies (the classic
#: cross-site request: no preflight) to /chat and to the OpenAI face, and a script's
#: fetch with application/json to each
OTHER_PAGE = """<!doctype html><html><body>
<form id="f" method="POST" action="{serve}/chat?form" enctype="text/plain" target="sink">
<input type="hidden" name='{{"message": "place the order", "x": "' value='"}}'>
</form><iframe name="sink"></iframe>
<form id="g" method="POST" action="{serve}/v1/chat/completions?form" enctype="text/plain"
 target="sink2"><input type="hidden" name='{{"model": "chainrun-shop", "messages":
 [{{"role": "user", "content": "place the order"}}], "x": "' value='"}}'>
</form><iframe name="sink2"></iframe>
<script>
const post = (path, body) => fetch("{serve}" + path, {{method: "POST",
    headers: {{"Content-Type": "application/json"}}, body: JSON.stringify(body)}})
  .then(async r => ["ok", r.status, await r.text()])
  .catch(e => ["blocked", String(e)]);
window.fetched = post("/chat", {{message: "a rain jacket?"}});
window.fetchedFace = post("/v1/chat/completions", {{model: "chainrun-shop",
    messages: [{{role: "user", content: "a rain jacket?"}}]}});
</script></body></html>"""


@contextlib.contextmanager
def _other_origin() -> Iterator[tuple[str, list[str]]]:
    """A page server on another port of loopback (another origin): yields its URL and a
    list to put the page's HTML in (its first item is served at /)."""
    import http.server
    import threading

    html: list[str] = []

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", html
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _serve(tmp: Path, lab: LabServer, *args: str) -> Iterator[str]:
    cfg = tmp / "chainrun.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CHAINRUN_SERVE_TOKEN", None)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
         "--db", str(tmp / "log.db"), *args],
        stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()
        assert line.startswith("chainrun serve: http://"), line
        url = line.split()[2].rstrip("/")
        for _ in range(300):  # ready: the chain opened
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/readyz") as r:
                if r.status == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stderr.close()


def _turns(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return int(con.execute("select count(*) from turns").fetchone()[0])


@pytest.mark.parametrize("allowed", [False, True])
def test_a_page_on_another_origin_makes_a_turn_only_when_its_origin_is_allowed(
    tmp_path: Path, allowed: bool
) -> None:
    """Without ``--cors-origin`` neither the page's form posts (refused 415: not JSON) nor
    its fetches (no preflight answered) make a turn, on ``/chat`` or the OpenAI face;
    with its origin, the fetches do and read their answers (the form posts still do
    not)."""
    from playwright.sync_api import sync_playwright

    with LabServer("fast", n_tokens=8, per_token_ms=5) as lab, _other_origin() as (page_url,
                                                                                 html):
        args = ("--cors-origin", page_url) if allowed else ()
        with _serve(tmp_path, lab, *args) as serve_url:
            html.append(OTHER_PAGE.format(serve=serve_url))
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                try:
                    page = browser.new_page()
                    with page.expect_response(serve_url + "/chat?form") as posted:
                        page.goto(page_url + "/")
                        page.evaluate("document.getElementById('f').submit()")
                    with page.expect_response(serve_url + "/v1/chat/completions?form") as face:
                        page.evaluate("document.getElementById('g').submit()")
                    form_status = (posted.value.status, face.value.status)
                    fetched = page.evaluate("window.fetched")
                    fetched_face = page.evaluate("window.fetchedFace")
                finally:
                    browser.close()
            time.sleep(0.5)  # the fetched turn's log write
            turns = _turns(tmp_path / "log.db")
    assert form_status == (415, 415)
    if allowed:
        assert fetched[0] == "ok" and fetched[1] == 200, fetched
        assert "event: turn" in fetched[2]
        assert fetched_face[0] == "ok" and fetched_face[1] == 200, fetched_face
        assert json.loads(fetched_face[2])["choices"][0]["message"]["content"]
        assert turns == 2
    else:
        assert fetched[0] == "blocked", fetched
        assert fetched_face[0] == "blocked", fetched_face
        assert turns == 0
