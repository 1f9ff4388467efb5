"""Last week as a replay set: logged live turns written as a replay file (conversation,
turn order, the shopper, the live duration) and replayed as the shoppers who sent them."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from chainrun.chain import Chain
from chainrun.cli import app
from chainrun.identity import Identity
from chainrun.log.store import Store
from chainrun.replay.run import load_requests, run_requests


async def _live_traffic(config, fake, db: str) -> None:
    store = Store.open(db)
    try:
        async with Chain(config, store=store, providers={"local": fake}, quiet=True) as chain:
            first = await chain.run_turn("Do you have rain jackets?", conversation_id="c1",
                                         user=Identity("ana"))  # fmt: skip
            await chain.run_turn("Which of those is cheapest?", conversation_id="c1",
                                 user=Identity("ana"))  # fmt: skip
            await chain.run_turn("Where is my order?", user=Identity("bo"))
        assert first.status == "ok"
    finally:
        store.close()


async def test_live_turns_become_a_replay_set_replayed_as_their_shoppers(
    config, fake, tmp_path
) -> None:
    db, out = str(tmp_path / "live.db"), tmp_path / "week.jsonl"
    await _live_traffic(config, fake, db)
    result = CliRunner().invoke(app, ["log", "export-replay", "live", str(out), "--db", db,
                                      "--since", "2000-01-01"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "wrote 3 turns (2 conversations)" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["message"], x.get("turn"), x["user"]) for x in lines] == [
        ("Do you have rain jackets?", 1, "ana"),
        ("Which of those is cheapest?", 2, "ana"),
        ("Where is my order?", 1, "bo"),
    ]
    assert lines[0]["conversation_id"] == lines[1]["conversation_id"] == "c1"
    assert all(x["original_ms"] > 0 for x in lines)
    requests = load_requests(out)  # a valid replay set as it is
    with Store.open(db) as store:
        run_id = await run_requests(config, requests, store, providers={"local": fake},
                                    quiet=True)  # fmt: skip
        replayed = {t.request_id: t for t in store.turns(run_id)}
    for line in lines:  # each turn as the shopper who sent it
        assert replayed[line["id"]].user_id == line["user"]
        assert replayed[line["id"]].original_ms == line["original_ms"]


async def test_a_filter_that_selects_nothing_is_one_line_and_writes_nothing(
    config, fake, tmp_path
) -> None:
    db, out = str(tmp_path / "live.db"), tmp_path / "none.jsonl"
    await _live_traffic(config, fake, db)
    result = CliRunner().invoke(app, ["log", "export-replay", "live", str(out), "--db", db,
                                      "--label", "returns"])  # fmt: skip
    assert result.exit_code == 2
    assert "no turns to export with label returns" in result.output
    assert not out.exists()
    run = CliRunner().invoke(app, ["log", "export-replay", "1", str(out), "--db", db,
                                   "--since", "2026-01-01"])  # fmt: skip
    assert run.exit_code == 2 and "--since/--until select live traffic" in run.output


def test_a_bad_user_in_a_replay_line_names_the_line(tmp_path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"id": "a", "message": "hi", "user": ""}) + "\n")
    result = CliRunner().invoke(app, ["replay", str(path), "--db", str(tmp_path / "r.db")])
    assert result.exit_code == 2
    assert "set.jsonl:1" in result.output and "'user'" in result.output
