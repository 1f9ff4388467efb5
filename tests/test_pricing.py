"""Cost in money: a call's cost from its tokens and a price table, sums that keep the
unknown apart, and the cost a run's log shows (a replay against the lab, whose usage
is known: every answer is ``n_tokens`` tokens)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chainrun.analysis.summary import hedge_cost, latency_summary
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.pricing import (
    Cost,
    Price,
    PriceBook,
    call_cost,
    cost_summary,
    price_book,
    shipped_prices,
    sum_costs,
)
from chainrun.replay.run import ReplayRequest, run_requests

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class U:
    input_tokens: int | None
    cached_input_tokens: int | None
    output_tokens: int | None


GPT4O = Price(input=2.50, cached_input=1.25, output=10.00)


def test_a_calls_cost_by_hand() -> None:
    # 600 uncached x 2.50 + 400 cached x 1.25 + 200 out x 10.00 = 1500 + 500 + 2000
    # micro-dollars
    assert call_cost(U(1000, 400, 200), GPT4O) == pytest.approx(0.004)
    # no cache: 1000 x 2.50 + 50 x 10.00 = 3000 micro-dollars
    assert call_cost(U(1000, 0, 50), GPT4O) == pytest.approx(0.003)
    # no cached price: cached tokens at the input price; unknown cached count is then 0
    flat = Price(input=1.0, output=4.0)
    assert call_cost(U(300, None, 25), flat) == pytest.approx((300 * 1.0 + 25 * 4.0) / 1e6)
    assert call_cost(U(300, 100, 25), flat) == pytest.approx((300 * 1.0 + 25 * 4.0) / 1e6)


def test_unknown_tokens_give_unknown_cost_never_zero() -> None:
    assert call_cost(U(1000, 0, None), GPT4O) is None  # a cancelled stream: no usage
    assert call_cost(U(None, None, 12), GPT4O) is None
    assert call_cost(U(1000, None, 10), GPT4O) is None  # the discount unknown
    assert call_cost(U(1000, 0, 10), None) is None  # no price
    total = sum_costs([0.004, None, 0.003])
    assert total == Cost(usd=pytest.approx(0.007), calls=3, unknown=1)
    assert total.total is None and not total.known
    assert total.text() == "≥ $0.007000 (1 call unknown)"
    assert sum_costs([None]).text() == "unknown"
    assert sum_costs([0.004, 0.003]).total == pytest.approx(0.007)


def test_the_price_book_order_and_the_shipped_table() -> None:
    models, source = shipped_prices()
    assert source["url"].startswith("https://") and source["date"]
    assert models["gpt-4o-mini"].input > 0
    book = PriceBook(models={"gpt-4o": Price(input=1, output=2)},
                     providers={"mine": Price(input=0, output=0)})  # fmt: skip
    assert book.price("mine", "gpt-4o") == Price(input=0, output=0)  # the provider's first
    assert book.price("openai", "gpt-4o") == Price(input=1, output=2)  # then the config's
    assert book.price("openai", "gpt-4o-mini-2024-07-18") == models["gpt-4o-mini"]  # snapshot
    assert book.price("openai", "no-such-model") is None
    cfg = {"prices": {"m": {"input": 3, "output": 5}},
           "providers": {"p": {"price": {"input": 7, "output": 9}}, "q": {"price": None}}}
    b2 = price_book(json.dumps(cfg))
    assert b2.price("x", "m") == Price(input=3, output=5)
    assert b2.price("p", "m") == Price(input=7, output=9)
    assert b2.price("q", "m") == Price(input=3, output=5)


def test_cost_summary_and_hedging_cost() -> None:
    s = cost_summary([0.002, 0.001, 0.003])
    assert s["n"] == 3 and s["p50_usd"] == pytest.approx(0.002)
    assert s["mean_usd"] == pytest.approx(0.002)
    assert s["p50_ci"] is None  # 3 values cannot bound a median at 95%
    h = hedge_cost([0.002, None], [100.0, 300.0])
    assert h["copies_cost"] == {"usd": None, "known_usd": 0.002, "calls": 2, "unknown_calls": 1}
    assert h["saved_s"] == pytest.approx(0.4)
    assert h["usd_per_s_saved"] == pytest.approx(0.005)
    assert hedge_cost([None], [100.0])["usd_per_s_saved"] is None


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=4, per_token_ms=1) as lab:
        yield lab


def _replay(lab: LabServer, db: Path, **extra: Any) -> int:
    cfg = config_from_dict({
        "order": ["compose"], "answer_step": "compose",
        "providers": {"lab": {"base_url": lab.base_url, **extra.pop("provider", {})}},
        "steps": {"compose": {"provider": "lab", "model": "shop-model",
                              "prompt": "{history}{message}", "stream": True}},
        **extra,
    })  # fmt: skip
    turns = [ReplayRequest(f"r{i}", f"shoes {i}?") for i in range(3)]
    with Store.open(str(db)) as store:
        asyncio.run(run_requests(cfg, turns, store, quiet=True))
        return store.latest_run_id() or 0


def test_a_runs_cost_from_its_logged_tokens(lab: LabServer, tmp_path: Path) -> None:
    # $1 an output token, inputs free: each answer of 4 tokens costs exactly $4
    db = tmp_path / "log.db"
    rid = _replay(lab, db, prices={"shop-model": {"input": 0, "output": 1_000_000}})
    with Store.open(str(db), create=False) as store:
        cost = latency_summary(store, rid)["cost"]
    assert cost["run"] == {"usd": 12.0, "known_usd": 12.0, "calls": 3, "unknown_calls": 0}
    assert cost["per_turn"]["p50_usd"] == 4.0 and cost["per_turn"]["n"] == 3
    # the provider's own price wins over the model's
    rid2 = _replay(lab, db, provider={"price": {"input": 0, "output": 2_000_000}},
                   prices={"shop-model": {"input": 0, "output": 1_000_000}})  # fmt: skip
    with Store.open(str(db), create=False) as store:
        assert latency_summary(store, rid2)["cost"]["run"]["usd"] == 24.0
    shown = subprocess.run([sys.executable, "-m", "chainrun", "show", str(rid), "--db", str(db)],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "cost $4.000000" in shown.stdout  # each turn's line
    assert "cost: $12.000000 for the run" in shown.stdout


def test_an_unpriced_model_costs_unknown(lab: LabServer, tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    rid = _replay(lab, db)
    with Store.open(str(db), create=False) as store:
        cost = latency_summary(store, rid)["cost"]
    assert cost["run"]["usd"] is None and cost["run"]["unknown_calls"] == 3
    assert cost["per_turn"]["n"] == 0 and cost["per_turn"]["n_unknown"] == 3


def test_compare_gives_cost_per_turn_with_its_interval(lab: LabServer, tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    a = _replay(lab, db, prices={"shop-model": {"input": 0, "output": 1_000_000}})
    b = _replay(lab, db, prices={"shop-model": {"input": 0, "output": 3_000_000}})
    from chainrun.analysis.compare import compare

    with Store.open(str(db), create=False) as store:
        doc = compare(store, str(a), str(b))
    assert doc["cost"]["a"]["p50_usd"] == 4.0 and doc["cost"]["b"]["p50_usd"] == 12.0
    assert doc["cost"]["diff_mean_usd"] == 8.0
    assert doc["cost"]["a"]["p50_ci"] is None  # 3 turns: no 95% interval of a median
    out = subprocess.run([sys.executable, "-m", "chainrun", "compare", str(a), str(b),
                          "--db", str(db)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "cost per turn: A p50 $4.000000 -*" in out.stdout
    assert "B − A mean +$8.000000" in out.stdout


def test_hedging_cost_in_hedge_stats_and_the_audit(tmp_path: Path) -> None:
    """Every compose call fires a copy (a 1 ms delay against a ~200 ms server); the
    copies are priced at $1 an output token: hedge-stats and audit item 4 say what they
    cost, a copy cancelled before its usage is unknown, never $0."""
    with LabServer("lognormal", median_ms=200, sigma=0.05, n_tokens=4) as lab:
        cfg = tmp_path / "hedged.toml"
        cfg.write_text(
            'order = ["compose"]\n'
            f'[providers.local]\nbase_url = "{lab.base_url}"\n'
            '[prices."shop-model"]\ninput = 0\noutput = 1000000\n'
            '[steps.compose]\nmodel = "shop-model"\nprompt = "{message}"\nstream = true\n'
            '[steps.compose.hedge]\ndelay_ms = 1\nmax_attempts = 2\nmax_extra_load = 1.0\n'
        )
        requests = tmp_path / "r.jsonl"
        requests.write_text("".join(json.dumps({"id": f"r{i}", "message": f"hat {i}?"}) + "\n"
                                    for i in range(4)))  # fmt: skip
        db = tmp_path / "log.db"
        run = subprocess.run([sys.executable, "-m", "chainrun", "replay", str(requests),
                              "--config", str(cfg), "--db", str(db)], capture_output=True,
                             text=True, timeout=180, cwd=ROOT)  # fmt: skip
        assert run.returncode == 0, run.stderr
    stats = json.loads(subprocess.run(
        [sys.executable, "-m", "chainrun", "hedge-stats", "--db", str(db), "--json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT).stdout)["steps"]["compose"]
    cost = stats["copies_cost"]
    assert cost["calls"] == stats["copies_sent"] > 0
    # each copy is $4 when its usage arrived, unknown when it was cancelled first
    assert cost["known_usd"] == 4.0 * (cost["calls"] - cost["unknown_calls"])
    text = subprocess.run([sys.executable, "-m", "chainrun", "hedge-stats", "--db", str(db)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT).stdout
    assert f"compose: hedging cost: {cost['calls']} copies cost" in " ".join(text.split())
    audit = subprocess.run([sys.executable, "-m", "chainrun", "audit", "--db", str(db),
                            "--format", "json", "--out", "-"], capture_output=True, text=True,
                           timeout=180, cwd=ROOT)  # fmt: skip
    assert audit.returncode in (0, 1), audit.stderr
    item4 = next(i for i in json.loads(audit.stdout)["items"] if i["id"] == 4)
    assert item4["figures"]["steps"]["compose"]["cost"]["copies_cost"] == cost
    assert any("hedging cost" in n for n in item4["notes"])
