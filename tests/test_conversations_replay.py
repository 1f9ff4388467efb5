"""Replays of conversations: the file's conversation fields, turns in order with the
chain's own earlier answers as history, conversations side by side, a fixed history,
a resumed run continuing from its answered turns, and the shipped conversation set."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import reply_by_step

from chainrun.config import config_from_dict
from chainrun.conversations import HistoryTurn
from chainrun.errors import InputFileError
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.replay.resume import answered_history
from chainrun.replay.run import conversations_of, load_requests, run_requests

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "replays" / "conversations.jsonl"


def _write(tmp_path: Path, lines: list[dict]) -> Path:
    p = tmp_path / "set.jsonl"
    p.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return p


def _compose_prompts(fake: FakeProvider) -> list[str]:
    return [r.messages[-1]["content"] for r in fake.requests
            if "Catalogue matches" in r.messages[-1]["content"]]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ({"id": "a", "message": "m", "turn": 1}, "field 'turn' needs a 'conversation_id'"),
        ({"id": "a", "message": "m", "conversation_id": "c", "turn": 0},
         "field 'turn' must be an int >= 1, got 0"),
        ({"id": "a", "message": "m", "conversation_id": "c", "turn": 1, "history": "x"},
         "field 'history' must be a list"),
        ({"id": "a", "message": "m", "conversation_id": "c", "turn": 1,
          "history": [{"message": "", "answer": "x"}]},
         "field 'history[0].message': expected a non-empty string"),
        ({"id": "a", "message": "m", "conversation_id": "c", "turn": 1,
          "history": [{"message": "q", "reply": "x"}]},
         "field 'history[0]': expected an object with 'message' and 'answer' only"),
    ],
)  # fmt: skip
def test_bad_conversation_line_is_one_line_naming_it(tmp_path, line, problem) -> None:
    path = _write(tmp_path, [line])
    with pytest.raises(InputFileError) as e:
        load_requests(path)
    assert str(e.value).startswith(f"{path}:1: {problem}")


def test_a_turn_twice_in_a_conversation_is_refused(tmp_path) -> None:
    path = _write(tmp_path, [
        {"id": "a", "message": "m", "conversation_id": "c", "turn": 1},
        {"id": "b", "message": "m", "conversation_id": "c", "turn": 1},
    ])  # fmt: skip
    with pytest.raises(InputFileError, match=r":2: conversation 'c' has turn 1 twice \(first on"):
        load_requests(path)


def test_lines_group_into_conversations_in_turn_order(tmp_path) -> None:
    path = _write(tmp_path, [
        {"id": "b2", "message": "m", "conversation_id": "b", "turn": 2},
        {"id": "solo", "message": "m"},
        {"id": "b1", "message": "m", "conversation_id": "b", "turn": 1},
        {"id": "a1", "message": "m", "conversation_id": "a", "turn": 1},
    ])  # fmt: skip
    groups = conversations_of(load_requests(path))
    assert [[r.id for r in g] for g in groups] == [["b1", "b2"], ["solo"], ["a1"]]


def test_shipped_conversation_set() -> None:
    requests = load_requests(SHIPPED)
    groups = [g for g in conversations_of(requests) if g[0].turn is not None]
    assert len(groups) >= 8 and all(2 <= len(g) <= 4 for g in groups)
    assert all([r.turn for r in g] == list(range(1, len(g) + 1)) for g in groups)


async def test_replay_runs_turns_in_order_with_the_chains_own_answers(tmp_path) -> None:
    answers = iter(f"Answer number {i}." for i in range(100))

    def script(req: ChatRequest) -> FakeReply:
        if "Catalogue matches" in req.messages[-1]["content"]:
            return FakeReply(next(answers), ttft_s=0.01, gap_s=0.001)
        return reply_by_step()(req)

    fake = FakeProvider(name="local", script=script)
    store = Store.open(tmp_path / "log.db")
    run_id = await run_requests(config_from_dict({}), load_requests(SHIPPED), store,
                                providers={"local": fake}, concurrency=4)  # fmt: skip
    turns = store.turns(run_id)
    by_conv: dict[str, list] = defaultdict(list)
    for t in turns:
        by_conv[t.conversation_id].append(t)
    assert len(by_conv) == 10
    for conv, ts in by_conv.items():
        ts.sort(key=lambda t: t.turn_index)
        assert [t.request_id for t in ts] == [f"{conv}-{i}" for i in range(1, len(ts) + 1)]
        for before, after in itertools.pairwise(ts):  # a turn starts once the last ended
            end = datetime.fromisoformat(before.started_at).timestamp() + before.duration_ms / 1e3
            assert datetime.fromisoformat(after.started_at).timestamp() >= end - 0.002
    # conversations ran side by side: two turns of different conversations overlapped
    def span(t: Any) -> tuple[float, float]:
        start = datetime.fromisoformat(t.started_at).timestamp()
        return start, start + t.duration_ms / 1e3

    assert any(
        span(a)[0] < span(b)[1] and span(b)[0] < span(a)[1]
        for a, b in itertools.combinations(turns, 2)
        if a.conversation_id != b.conversation_id
    )
    # turn 2's answer prompt holds turn 1's message and the chain's own answer to it
    rain = {t.turn_index: t for t in by_conv["rain-jackets"]}
    prompt = next(p for p in _compose_prompts(fake) if p.endswith(
        "Shopper: Which of those is cheapest?\nStylist:"))  # fmt: skip
    assert f"Shopper: Do you have rain jackets?\nStylist: {rain[1].output}\n" in prompt
    store.close()


async def test_a_line_with_history_replaces_the_runs_own(tmp_path, fake) -> None:
    path = _write(tmp_path, [
        {"id": "x1", "conversation_id": "x", "turn": 1, "message": "Do you have boots?"},
        {"id": "x2", "conversation_id": "x", "turn": 2, "message": "Which is cheapest?",
         "history": [{"message": "Do you sell scarves?", "answer": "Yes, silk ones."}]},
        {"id": "x3", "conversation_id": "x", "turn": 3, "message": "In blue?"},
    ])  # fmt: skip
    store = Store.open(":memory:")
    await run_requests(config_from_dict({}), load_requests(path), store, providers={"local": fake})
    prompts = _compose_prompts(fake)
    second = next(p for p in prompts if "Which is cheapest?\nStylist:" in p)
    assert second.startswith("Shopper: Do you sell scarves?\nStylist: Yes, silk ones.\n\n")
    assert "boots" not in second
    third = next(p for p in prompts if "In blue?\nStylist:" in p)
    # the fixed context, then the second turn as its prompt showed it and its answer
    assert third.startswith(second + " ")
    store.close()


async def test_a_resumed_run_continues_from_its_answered_turns(tmp_path, fake) -> None:
    path = _write(tmp_path, [
        {"id": "y1", "conversation_id": "y", "turn": 1, "message": "Do you have boots?"},
        {"id": "y2", "conversation_id": "y", "turn": 2, "message": "Which is cheapest?"},
    ])  # fmt: skip
    requests = load_requests(path)
    store = Store.open(tmp_path / "log.db")
    run_id = await run_requests(config_from_dict({}), requests[:1], store,
                                providers={"local": fake})  # fmt: skip
    earlier = answered_history(store, run_id)
    first = store.turns(run_id)[0]
    shown = next(s for s in store.steps(run_id) if s.step == "retrieve").output
    assert shown is not None  # with the products turn 1 showed (a follow-up's search)
    assert earlier == {"y": [HistoryTurn("Do you have boots?", first.output,
                                         tuple(json.loads(shown)))]}  # fmt: skip
    fake.requests.clear()
    await run_requests(config_from_dict({}), requests[1:], store, providers={"local": fake},
                       run_id=run_id, earlier=earlier)  # fmt: skip
    (prompt,) = [p for p in _compose_prompts(fake) if "Which is cheapest?" in p]
    assert prompt.startswith(f"Shopper: Do you have boots?\nStylist: {first.output}\n\n")
    assert [t.turn_index for t in store.turns(run_id)] == [1, 2]
    store.close()


async def test_a_follow_ups_products_shown_before_are_named_not_repeated(tmp_path, fake) -> None:
    """The rain-jacket conversation of the shipped set: the follow-up searches among the
    products the first turn showed, which the history already holds line for line, so
    its prompt names them by id; each prompt still begins with the one before."""
    path = _write(tmp_path, [
        {"id": "j1", "conversation_id": "j", "turn": 1, "message": "Do you have rain jackets?"},
        {"id": "j2", "conversation_id": "j", "turn": 2, "message": "Which of those is cheapest?"},
    ])  # fmt: skip
    store = Store.open(":memory:")
    await run_requests(config_from_dict({}), load_requests(path), store, providers={"local": fake})
    first, second = _compose_prompts(fake)
    assert second.startswith(first + " ")
    this_turn = second[len(first):]
    ids = [line[3:].split("]")[0] for line in first.splitlines() if line.startswith("- [")]
    again = [ln for ln in this_turn.splitlines() if ln.startswith("- as above: ")]
    assert len(again) == 1, this_turn  # the products shown before: one line of ids
    assert ids and sorted(again[0].removeprefix("- as above: ").split(", ")) == sorted(ids)
    assert "| jackets |" not in this_turn  # no product line repeated
