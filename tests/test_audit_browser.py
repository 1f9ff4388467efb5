"""The audit's HTML in a real headless Chromium (Debian's ``chromium``, driven by
Playwright): it renders with no script errors, no network, and a model answer holding
``<script>`` or ``onerror=`` stays text. Skipped, saying what is missing, only where
the browser or Playwright is not installed (``.ci/run`` installs both)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from audit_logs import add_eval_results, add_run, hedge_config, hedged_turn, llm, turn

from chainrun.audit import audit, render, write_report
from chainrun.log.store import Store

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: launch flags that work in a root container without a GPU or network
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def _log(store: Store) -> None:
    turns = [
        turn(
            [
                llm("classify", dur=80.0 + i),
                llm("compose", dur=3000.0 + 7 * i, tokens=20 + i, output=EVIL),
            ],
            answer=EVIL,
            message=f"<b>q{i}</b>",
        )
        for i in range(12)
    ]
    add_run(store, "replay", turns)
    add_run(store, "live", turns[:6])
    hedged = [hedged_turn("guard", delay=500.0, settle=200.0 + i) for i in range(60)]
    hedged += [
        hedged_turn("guard", delay=500.0, settle=900.0, fired=True, won=False, tokens=180)
        for _ in range(35)
    ]
    add_run(store, "live", hedged, config=hedge_config())
    rid = add_run(store, "eval", turns[:4], config={}, source="evals/x.jsonl")
    tids = [t.id for t in store.turns(rid)]
    add_eval_results(
        store,
        rid,
        [
            {"turn_id": t, "case_id": f"c{i}", "type": "regex", "passed": 1}
            for i, t in enumerate(tids)
        ],
    )


def test_report_renders_in_headless_chromium_without_script_errors(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with Store.open(tmp_path / "log.db") as store:
        _log(store)
        report = audit(store)
    page_path = write_report(render(report, "html"), tmp_path / "audit.html")
    errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.resolve().as_uri())
            page.wait_for_load_state("load")
            shot = tmp_path / "audit-top.png"
            page.screenshot(path=str(shot))  # the top of the report
            rows = page.locator("table").first.locator("tbody tr").count()
            verdicts = page.locator("table").first.locator(".v").all_inner_texts()
            pwned = page.evaluate("() => window.__pwned === undefined ? null : window.__pwned")
            scripts = page.evaluate("() => document.scripts.length")
            svgs = page.evaluate("() => document.querySelectorAll('.plot svg').length")
            shown = page.locator("body").inner_text()
        finally:
            browser.close()
    assert errors == []
    assert requests == [page_path.resolve().as_uri()]  # nothing fetched beyond the file
    assert rows == 8 and len(verdicts) == 8
    assert "fail" in verdicts  # item 4: 0 wins in 35 fires
    assert pwned is None and scripts == 0
    assert EVIL in shown  # the answer is shown as text
    assert svgs >= 4
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
