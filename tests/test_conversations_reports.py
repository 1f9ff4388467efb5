"""Reports of conversations: compare pairs turns by (conversation, turn index) and gives
figures per turn index with n; show groups a run's turns by conversation; eval cases
that are turns of a conversation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from chainrun.analysis.compare import compare
from chainrun.config import config_from_dict
from chainrun.evals.cases import load_cases
from chainrun.evals.runner import run_eval
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider
from chainrun.replay.run import load_requests, run_requests

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "replays" / "conversations.jsonl"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chainrun", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


#: the answer prompt without the products (which vary by turn): only the history grows
HISTORY_ONLY = {"steps": {"compose": {"prompt": "{history}Shopper: {message}\nStylist:"}}}


async def _two_runs(db: Path, fake: FakeProvider) -> tuple[int, int]:
    store = Store.open(db)
    try:
        ids = []
        for _ in range(2):
            ids.append(await run_requests(config_from_dict(HISTORY_ONLY), load_requests(SHIPPED),
                                          store, providers={"local": fake},
                                          concurrency=3))  # fmt: skip
    finally:
        store.close()
    return ids[0], ids[1]


async def test_compare_gives_figures_per_turn_index_paired_on_the_conversation(
    tmp_path, fake
) -> None:
    db = tmp_path / "log.db"
    a, b = await _two_runs(db, fake)
    with Store.open(db, create=False) as store:
        result = compare(store, str(a), str(b))
    by_turn = result["by_turn_index"]
    assert by_turn["pairing"] == ["conversation_id", "turn_index"]
    rows = {r["turn_index"]: r for r in by_turn["turns"]}
    # the shipped set: 10 conversations, 7 of them with a third turn, 1 with a fourth
    assert {i: r["a"]["n_turns"] for i, r in rows.items()} == {1: 10, 2: 10, 3: 7, 4: 1}
    assert all(r["paired"]["n_pairs"] == r["a"]["n_turns"] == r["b"]["n_turns"]
               for r in rows.values())  # fmt: skip
    assert rows[2]["a"]["answer_ttft"]["n"] == 10
    # the history makes later turns' answer prompts longer (the fake counts words)
    p50 = {i: r["a"]["prompt_tokens"]["p50_tokens"] for i, r in rows.items()}
    assert p50[1] < p50[2] < p50[3]
    # an A/A pairing of the same answers: the prompt token difference is 0 at every index
    assert all(r["paired"]["prompt_tokens_diff"]["p50_tokens"] == 0 for r in rows.values())
    # the CLI's --json holds the same block
    proc = _cli("compare", str(a), str(b), "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["by_turn_index"]["turns"][1]["paired"]["n_pairs"] == 10
    text = _cli("compare", str(a), str(b), "--db", str(db))
    assert "by turn index" in text.stdout


async def test_show_groups_a_runs_turns_by_conversation(tmp_path, fake) -> None:
    db = tmp_path / "log.db"
    store = Store.open(db)
    run_id = await run_requests(config_from_dict({}), load_requests(SHIPPED), store,
                                providers={"local": fake}, concurrency=4)  # fmt: skip
    store.close()
    doc = json.loads(_cli("show", str(run_id), "--db", str(db), "--json").stdout)
    groups = {g["conversation_id"]: g["turn_ids"] for g in doc["conversations"]}
    turns = {t["id"]: t for t in doc["turns"]}
    assert [turns[i]["request_id"] for i in groups["wool-coat"]] == [
        "wool-coat-1", "wool-coat-2", "wool-coat-3", "wool-coat-4"]  # fmt: skip
    text = _cli("show", str(run_id), "--db", str(db)).stdout
    assert "conversation rain-jackets (3 turns)" in text
    rain = text[text.index("conversation rain-jackets"):]
    assert rain.index("#1 (rain-jackets-1)") < rain.index("#2 (rain-jackets-2)")


async def test_eval_cases_can_be_turns_of_a_conversation(tmp_path, fake) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(json.dumps(c) for c in [
        {"id": "rain-2", "conversation_id": "rain", "turn": 2,
         "message": "Which of those is cheapest?",
         "assert": [{"type": "latency", "threshold": 30000}]},
        {"id": "rain-1", "conversation_id": "rain", "turn": 1,
         "message": "Do you have rain jackets?",
         "assert": [{"type": "latency", "threshold": 30000}]},
        {"id": "fixed", "conversation_id": "f", "turn": 2, "message": "In blue?",
         "history": [{"message": "Any scarves?", "answer": "A silk one."}],
         "assert": [{"type": "latency", "threshold": 30000}]},
    ]) + "\n")  # fmt: skip
    store = Store.open(tmp_path / "log.db")
    summary = await run_eval(config_from_dict({}), load_cases(cases), store, repeat=2,
                             providers={"local": fake})  # fmt: skip
    turns = {t.request_id: t for t in store.turns(summary["run_id"])}
    assert (turns["rain-2#1"].conversation_id, turns["rain-2#1"].turn_index) == ("rain#1", 2)
    assert turns["rain-1#0"].id < turns["rain-2#0"].id  # turn 1 ran first
    prompts = [r.messages[-1]["content"] for r in fake.requests]
    rain_two = [p for p in prompts if p.endswith("Shopper: Which of those is cheapest?\nStylist:")]
    assert len(rain_two) == 2 and all("Shopper: Do you have rain jackets?" in p for p in rain_two)
    assert any(p.startswith("Shopper: Any scarves?\nStylist: A silk one.\n") for p in prompts)
    store.close()
