"""An answer cut at its deadline after part of it reached the shopper stays the answer.

The answer step fails closed by default, which refuses a turn with no answer. Once
tokens have reached the shopper, a failure of the answer step (here its deadline) ends
the turn ``cut`` instead: its output is what was streamed, the step's row keeps its
timeout, the steps after the answer do not run, and the next turn's history shows what
reached the shopper. A deadline before the first token still refuses the turn.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import openai
from cli_runner import chainrun
from conftest import reply_by_step
from serve_helpers import serving, sse

from chainrun.analysis.summary import latency_summary
from chainrun.chain import REFUSAL, Chain
from chainrun.config import config_from_dict
from chainrun.events import AnswerDone, TokenDelta, TurnFinished
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply, words_in_sentences

#: the compose step's deadline in these tests, s
DEADLINE_S = 1.0
#: a compose answer that takes ~4 s: its deadline cuts it after ~1 s of words (in
#: sentences: the grounding check releases whole sentences)
SLOW = FakeReply(words_in_sentences(200), ttft_s=0.01, gap_s=0.02)


def cut_config(**compose: Any):
    return config_from_dict({"steps": {"compose": {"deadline_s": DEADLINE_S, **compose}}})


def slow_compose_then(reply: FakeReply) -> FakeProvider:
    """A fake whose first compose answer is :data:`SLOW`, and every later one ``reply``."""
    script = reply_by_step()
    seen = {"compose": 0}

    def answer(req: ChatRequest) -> FakeReply:
        if "Catalogue matches" not in req.messages[-1]["content"]:
            return script(req)
        seen["compose"] += 1
        return SLOW if seen["compose"] == 1 else reply

    return FakeProvider(name="local", script=answer)


async def test_a_deadline_after_the_first_tokens_keeps_the_streamed_answer(store: Store) -> None:
    fake = slow_compose_then(FakeReply("The cheapest is the Storm Shell."))
    events: list[Any] = []
    async with Chain(cut_config(), store=store, providers={"local": fake}, kind="live") as chain:
        turn = chain.stream_turn("rain jackets?", conversation_id="c1")
        async with contextlib.aclosing(turn) as it:
            async for ev in it:
                events.append(ev)
        second = await chain.run_turn("which of those is cheapest?", conversation_id="c1")
    done = events[-1]
    assert isinstance(done, TurnFinished)
    streamed = "".join(e.text for e in events if isinstance(e, TokenDelta))
    assert streamed.startswith("w0 w1") and "w199" not in streamed
    assert done.status == "cut" and done.error_type == "timeout"
    assert done.output == streamed and done.output != REFUSAL
    assert not any(isinstance(e, AnswerDone) for e in events)  # the answer never was whole
    assert done.answer_ttft_ms is not None and done.answer_done_ms is None
    # logged honestly: the step's timeout, the turn's partial answer, measured calls
    turn = store.turns(done.run_id)[0]
    assert (turn.status, turn.output, turn.error_type) == ("cut", streamed, "timeout")
    assert turn.answer_ttft_ms == done.answer_ttft_ms
    steps = {s.step: s for s in store.steps(done.run_id) if s.turn_id == turn.id}
    assert steps["compose"].status == "failed_closed"
    assert steps["compose"].error_type == "timeout"
    assert steps["validate"].status == "skipped" and steps["critique"].status == "skipped"
    call = next(c for c in store.calls(done.run_id) if c.turn_id == turn.id)
    assert call.step == "compose" and call.error_type == "timeout"
    assert call.ttft_ms is not None and 0 < call.ttft_ms < DEADLINE_S * 1000
    # the call row keeps what arrived; the shopper got all of it up to the deadline's cut
    # (a word that arrived while the deadline fell may not have been released)
    assert call.output is not None and call.output.startswith(streamed)
    assert call.output_tokens is None  # the usage chunk never came: unknown, not 0
    # the next turn's history is what reached the shopper
    assert second.status == "ok"
    prompt = [r for r in fake.requests if "Catalogue matches" in r.messages[-1]["content"]]
    history = f"Shopper: rain jackets?\nStylist: {streamed.strip()}\n"
    assert history in prompt[1].messages[-1]["content"]
    counts = latency_summary(store, done.run_id)["turns"]
    assert counts["n_cut"] == 1 and counts["n_completed"] == 1


async def test_the_history_read_from_the_log_holds_the_cut_answer(store: Store) -> None:
    fake = slow_compose_then(FakeReply("Fine."))
    async with Chain(cut_config(), store=store, providers={"local": fake}, kind="live") as chain:
        first = await chain.run_turn("rain jackets?", conversation_id="c2")
    assert first.status == "cut" and first.output
    again = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cut_config(), store=store, providers={"local": again}, kind="live") as chain:
        await chain.run_turn("which of those is cheapest?", conversation_id="c2")
    compose = next(r for r in again.requests if "Catalogue matches" in r.messages[-1]["content"])
    assert f"Stylist: {first.output.strip()}\n" in compose.messages[-1]["content"]


async def test_a_deadline_before_any_token_still_refuses(store: Store) -> None:
    late = FakeReply("too late", ttft_s=DEADLINE_S + 1.0)
    fake = FakeProvider(name="local", script=reply_by_step({"compose": late}))
    async with Chain(cut_config(), store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("rain jackets?")
    assert done.status == "refused" and done.output == REFUSAL
    assert done.error_type == "timeout" and done.answer_ttft_ms is None


async def test_a_fail_open_answer_step_cut_mid_answer_is_cut_too(store: Store) -> None:
    fake = slow_compose_then(FakeReply("-"))
    cfg = cut_config(on_failure="open")
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("rain jackets?")
    assert done.status == "cut" and done.output and done.output.startswith("w0")
    steps = {s.step: s.status for s in store.steps(done.run_id)}
    assert steps == {"classify": "ok", "retrieve": "ok", "policy": "skipped",
                     "compose": "failed_open", "validate": "skipped", "critique": "skipped"}


def _factory(store: Store, fake: FakeProvider):
    return lambda: Chain(cut_config(), store=store, providers={"local": fake}, kind="live",
                         quiet=True)  # fmt: skip


async def test_chat_and_the_openai_face_keep_a_cut_answer(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "log.db")
    fake = FakeProvider(name="local", script=reply_by_step({"compose": SLOW}))
    async with serving(_factory(store, fake)) as (url, _):
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", f"{url}/chat",
                                     json={"message": "rain jackets?"}) as r:  # fmt: skip
                events = [ev async for ev in sse(r)]
            oai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="-", http_client=client)
            whole = await oai.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "rain jackets?"}]
            )
            chunks = [c async for c in await oai.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "rain jackets?"}],
                stream=True,
            )]  # fmt: skip
    # /chat: the tokens, no answer_done, a closing `turn` that says the answer was cut
    names = [e for e, _ in events]
    tokens = "".join(d["text"] for e, d in events if e == "token" and d["step"] == "compose")
    assert tokens.startswith("w0") and "answer_done" not in names and names[-1] == "turn"
    turn = events[-1][1]
    assert turn["status"] == "cut" and turn["error_type"] == "timeout"
    assert turn["output"] == tokens and turn["answer_ttft_ms"] is not None
    # the OpenAI-compatible face, whole: the cut text, finish_reason "length"
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content and choice.message.content.startswith("w0")
    assert choice.message.content != REFUSAL
    assert whole.model_extra["chainrun"]["status"] == "cut"
    # streamed: the chunks already sent are the answer; the last says "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks
              if c.choices and c.choices[0].finish_reason]  # fmt: skip
    assert text.startswith("w0") and REFUSAL not in text and finish == ["length"]
    assert chunks[-1].model_extra["chainrun"]["status"] == "cut"
    run_id = store.latest_run_id()
    assert run_id is not None
    statuses = [t.status for t in store.turns(run_id)]
    assert statuses == ["cut", "cut", "cut"]
    store.close()


def test_a_replay_shows_the_cut_answer_and_counts_it(tmp_path: Path) -> None:
    with LabServer("lognormal", median_ms=5, sigma=0.1, n_tokens=200, per_token_ms=40) as lab:
        cfg = tmp_path / "chainrun.toml"
        # the lab's words have no sentence end: the grounding check, which releases whole
        # sentences, would show none of them before the deadline (tests/test_grounding.py)
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n\n'
                       f"[steps.compose]\ndeadline_s = {DEADLINE_S}\n\n"
                       "[steps.compose.grounding]\nenabled = false\n")  # fmt: skip
        replay = tmp_path / "one.jsonl"
        replay.write_text(json.dumps({"id": "r1", "message": "rain jackets?"}) + "\n")
        db = tmp_path / "log.db"
        res = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db))
    assert res.returncode == 1, res.stderr  # no turn ok: a replay then exits 1
    assert "0 ok (1 cut)" in res.stdout
    assert "1 of 1 turns not ok (1 cut; failed steps in them: compose:timeout ×1)" in res.stderr
    shown = json.loads(chainrun("show", "1", "--db", str(db), "--json").stdout)
    (turn,) = shown["turns"]
    assert turn["status"] == "cut" and turn["output"] and turn["output"] != REFUSAL
    assert shown["summary"]["turns"]["n_cut"] == 1
