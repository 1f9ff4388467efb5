"""``chainrun review A B``: the blind side-by-side review of two runs' answers.

The page in Debian's headless Chromium (driven by Playwright): two replays of the lab,
ten shared requests judged by keyboard, the page reloaded mid-way resumes at the first
request not yet judged, and the summary's counts and intervals checked against values
computed here by hand from the logged judgements (whose order shown is random)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import chainrun, short_replay

from chainrun.lab import LabServer
from chainrun.log.rows import ReviewJudgementRow
from chainrun.log.store import Store
from chainrun.review.summary import judgements_to_decide, review_summary

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _wilson(k: int, n: int, z: float = 1.959963984540054) -> list[float]:
    """Wilson's interval written out (JASA 22, 1927), to check the summary against."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def _row(request_id: str, choice: str, left_run: int, reviewer: str = "r1") -> ReviewJudgementRow:
    right = 2 if left_run == 1 else 1
    preferred = {"left": left_run, "right": right, "same": None}[choice]
    return ReviewJudgementRow(run_a=1, run_b=2, request_id=request_id, reviewer=reviewer,
                              judged_at="2026-12-02T00:00:00Z", left_run=left_run,
                              choice=choice, preferred_run=preferred)  # type: ignore[arg-type]


def test_the_summary_by_hand() -> None:
    rows = [_row("q1", "left", 2), _row("q2", "right", 2), _row("q3", "same", 1),
            _row("q4", "left", 1), _row("q5", "right", 1), _row("q6", "right", 1),
            _row("q1", "left", 2, "r2"), _row("q2", "left", 2, "r2")]  # fmt: skip
    doc = review_summary(rows, n_shared=6)
    # B preferred: q1 (left=2), q5, q6 (right of left 1), r2's q1 and q2 -> 5; A: q2, q4 -> 2
    assert (doc["b_better"]["n"], doc["b_worse"]["n"], doc["same"]["n"]) == (5, 2, 1)
    assert doc["b_better"]["ci95"] == _wilson(5, 8) and doc["b_worse"]["ci95"] == _wilson(2, 8)
    # exact two-sided sign test of 5 of 7: 2 * (C(7,0) + C(7,1) + C(7,2)) / 2^7
    assert doc["sign_test"]["p_value"] == round(2 * (1 + 7 + 21) / 128, 6)
    assert doc["verdict"] == "inconclusive" and doc["to_decide"] == judgements_to_decide(5, 2)
    # two reviewers agree on q1 (better) and differ on q2: 1 of 2 pairs
    assert doc["agreement"]["reviewer_pairs"] == 2
    assert doc["agreement"]["percent_agreement"] == 0.5
    assert doc["reviewers"] == {"r1": {"better": 3, "worse": 2, "same": 1},
                                "r2": {"better": 2}}  # fmt: skip


if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    pytest.skip(f"{CHROMIUM} is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("review")
    with LabServer("fast", n_tokens=8) as lab:
        cfg = tmp / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        requests = short_replay(tmp, n=10)
        db = tmp / "log.db"
        for _ in range(2):
            res = chainrun("replay", str(requests), "--config", str(cfg), "--db", str(db))
            assert res.returncode == 0, res.output
    yield db


@pytest.fixture
def review_url(two_runs: Path) -> Iterator[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "review", "1", "2", "--db", str(two_runs),
         "--port", "0", "--reviewer", "alice", "--seed", "11"],
        stderr=subprocess.PIPE, text=True, env=env, cwd=two_runs.parent,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()
        assert line.startswith("chainrun review: http://"), line
        yield line.split()[2]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        proc.stderr.close()


def test_ten_requests_judged_by_keyboard_resume_after_a_reload(
    two_runs: Path, review_url: str
) -> None:
    from playwright.sync_api import sync_playwright

    keys = ["1", "3", "2", "1", "1", "3", "3", "2", "1", "3"]
    seen: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(review_url)
            for i, key in enumerate(keys):
                if i == 5:  # stop half way and come back
                    page.reload()
                page.wait_for_selector('body[data-ready="yes"]', timeout=20_000)
                progress = page.get_attribute("#progress", "data-judged")
                assert progress == str(i) and page.get_attribute("#progress", "data-total") == "10"
                rid = page.get_attribute("#item", "data-request-id")
                assert rid is not None and rid not in seen  # resumed at the next one
                seen.append(rid)
                if i == 0:
                    page.keyboard.press("i")  # "invented fact" on the left answer
                    page.keyboard.press("Shift+L")  # "too long" on the right one
                    page.keyboard.press("n")
                    page.keyboard.type("left answer names a product we do not sell")
                    page.keyboard.press("Escape")
                page.keyboard.press(key)
            page.wait_for_selector("#done:not([hidden])", timeout=20_000)
        finally:
            browser.close()
    with Store.open(two_runs, create=False) as store:
        rows = store.review_judgements(1, 2)
    assert [r.request_id for r in rows] == seen
    choice = {"1": "left", "2": "same", "3": "right"}
    assert [r.choice for r in rows] == [choice[k] for k in keys]
    assert {r.left_run for r in rows} == {1, 2}  # the order shown is random, and logged
    first = rows[0]
    left_side = "a" if first.left_run == 1 else "b"
    right_side = "b" if left_side == "a" else "a"
    assert first.tags == {left_side: ["invented fact"], right_side: ["too long"]}
    assert first.note == "left answer names a product we do not sell"
    # the summary against a count by hand
    better = sum(1 for r in rows if r.preferred_run == 2)
    worse = sum(1 for r in rows if r.preferred_run == 1)
    res = chainrun("review", "1", "2", "--db", str(two_runs), "--summary", "--json")
    assert res.returncode == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["n_shared"], doc["n_judgements"]) == (10, 10)
    assert (doc["b_better"]["n"], doc["b_worse"]["n"], doc["same"]["n"]) == (better, worse, 2)
    assert doc["b_better"]["ci95"] == _wilson(better, 10)
    text = chainrun("review", "1", "2", "--db", str(two_runs), "--summary")
    assert f"{doc['n_judgements']} judgements of 10 shared requests" in text.stdout
