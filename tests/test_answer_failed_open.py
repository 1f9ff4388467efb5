"""An answer step that fails open before any of its answer reached the shopper ends the
turn ``error``.

Failing open lets an answer through unchecked; when the step that fails is the one that
writes the answer, there is nothing to let through. Such a turn (an HTTP 400 from the
server, a connection that broke, a deadline before the first token) ends with status
``error`` and the step's error type, no output, and the steps after the answer are not
run; every face says so (the log, the replay's lines, ``chainrun show``, serve's
``/chat`` and the OpenAI-compatible face). A fail-open answer step cut after some of its
text reached the shopper stays ``cut`` (tests/test_answer_cut.py).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_runner import chainrun
from conftest import reply_by_step
from serve_helpers import serving, sse

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import ProviderConnectionLost, ProviderStatusError
from chainrun.events import AnswerDone, TokenDelta, TurnFinished
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import Faults
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply

#: the compose step's deadline in these tests, s
DEADLINE_S = 0.5
HTTP_400 = FakeReply("", error=ProviderStatusError("local: HTTP 400: bad history", 400))


def open_compose(**compose: Any) -> Any:
    """The default chain, its compose step failing open (as a step a user writes does)."""
    return config_from_dict({"steps": {"compose": {
        "on_failure": "open", "deadline_s": DEADLINE_S, **compose}}})  # fmt: skip


async def collect(chain: Chain, message: str) -> tuple[TurnFinished, list[Any]]:
    events: list[Any] = []
    async with contextlib.aclosing(chain.stream_turn(message)) as it:
        async for ev in it:
            events.append(ev)
    done = events[-1]
    assert isinstance(done, TurnFinished)
    return done, events


@pytest.mark.parametrize(("reply", "error_type"), [
    (HTTP_400, "http_400"),
    (FakeReply("", error=ProviderConnectionLost("local: connection reset")), "connection_lost"),
    (FakeReply("too late", ttft_s=DEADLINE_S + 1.0), "timeout"),
])  # fmt: skip
async def test_a_fail_open_answer_step_with_no_answer_ends_the_turn_error(
    store: Store, reply: FakeReply, error_type: str
) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({"compose": reply}))
    async with Chain(open_compose(), store=store, providers={"local": fake}) as chain:
        done, events = await collect(chain, "rain jackets?")
    assert (done.status, done.error_type, done.output) == ("error", error_type, None)
    assert done.answer_ttft_ms is None and done.answer_done_ms is None
    assert not any(isinstance(e, TokenDelta | AnswerDone) for e in events)
    (turn,) = store.turns(done.run_id)
    assert (turn.status, turn.error_type, turn.output) == ("error", error_type, None)
    steps = {s.step: (s.status, s.error_type) for s in store.steps(done.run_id)}
    assert steps["compose"] == ("failed_open", error_type)
    # the checks of the answer had nothing to judge: not run, no model call made for them
    assert steps["validate"] == ("skipped", None) and steps["critique"] == ("skipped", None)
    assert all("Catalogue matches" in r.messages[-1]["content"] for r in fake.requests)


async def test_an_answer_held_back_by_a_guard_and_failed_open_is_no_answer(store: Store) -> None:
    """The answer's first tokens were held back by an input guard still running when the
    step ran out of time: none reached the shopper, so the turn has no answer either."""
    slow = FakeReply(" ".join(f"w{i}" for i in range(100)), ttft_s=0.01, gap_s=0.02)
    late_guard = FakeReply("safe", ttft_s=DEADLINE_S + 1.0)

    def script(req: ChatRequest) -> FakeReply:
        if "Verdict:" in req.messages[-1]["content"]:
            return late_guard
        return reply_by_step({"compose": slow})(req)

    cfg = config_from_dict({
        "order": ["guard", "classify", "retrieve", "policy", "compose", "validate", "critique"],
        "steps": {"guard": {"kind": "guard", "prompt": "User: {message}\nVerdict:",
                            "on_missing_verdict": "open", "deadline_s": 5.0},
                  "compose": {"on_failure": "open", "deadline_s": DEADLINE_S}},
    })  # fmt: skip
    fake = FakeProvider(name="local", script=script)
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done, events = await collect(chain, "rain jackets?")
    assert not any(isinstance(e, TokenDelta) for e in events)
    assert (done.status, done.error_type, done.output) == ("error", "timeout", None)
    steps = {s.step: s.status for s in store.steps(done.run_id)}
    assert steps["compose"] == "failed_open" and steps["guard"] == "cancelled"


def _factory(store: Store) -> Any:
    fake = FakeProvider(name="local", script=reply_by_step({"compose": HTTP_400}))
    return lambda: Chain(open_compose(), store=store, providers={"local": fake}, kind="live",
                         quiet=True)  # fmt: skip


async def test_chat_and_the_openai_face_say_the_turn_failed(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "log.db")
    body = {"model": "chainrun-shop", "messages": [{"role": "user", "content": "rain jackets?"}]}
    async with serving(_factory(store)) as (url, _):
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", f"{url}/chat",
                                     json={"message": "rain jackets?"}) as r:  # fmt: skip
                events = [ev async for ev in sse(r)]
            whole = await client.post(f"{url}/v1/chat/completions", json=body)
            streamed = await client.post(f"{url}/v1/chat/completions",
                                         json={**body, "stream": True})  # fmt: skip
    store.close()
    # /chat: no token, no answer_done; the closing `turn` says error with the step's type
    names = [e for e, _ in events]
    assert "token" not in names and "answer_done" not in names and names[-1] == "turn"
    turn = events[-1][1]
    assert (turn["status"], turn["error_type"], turn["output"]) == ("error", "http_400", None)
    compose = next(s for s in turn["steps"] if s["step"] == "compose")
    assert (compose["status"], compose["error_type"]) == ("failed_open", "http_400")
    # the OpenAI-compatible face, whole: an error, not an empty 200 completion
    assert whole.status_code == 502, whole.text
    assert whole.json()["error"] == {"message": "the chain failed: http_400",
                                     "type": "server_error", "param": None,
                                     "code": "http_400"}  # fmt: skip
    # streamed: it failed at once, before its stream began: the same error, as a status
    # (one failing later ends its begun stream with that object: tests/test_serve.py)
    assert streamed.status_code == 502, streamed.text
    assert streamed.json() == whole.json()


def test_a_replay_and_show_count_the_turn_as_errored(tmp_path: Path) -> None:
    """Over real HTTP: the lab answers every call with a 400 that names no parameter (no
    configuration mistake: the step's on_failure decides)."""
    with LabServer("fast") as lab:
        lab.set_scenario(Scenario(name="fault", faults=Faults(reject={
            "p": 1.0, "status": 400, "param": None, "code": None, "message": "bad history"})))
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n\n'
                       '[steps.compose]\non_failure = "open"\n')  # fmt: skip
        replay = tmp_path / "one.jsonl"
        replay.write_text(json.dumps({"id": "r1", "message": "rain jackets?"}) + "\n")
        db = tmp_path / "log.db"
        res = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db))
    assert res.returncode == 1, res.stderr  # no turn ok: a replay then exits 1
    assert "0 ok (1 errored)" in res.stdout
    assert ("1 of 1 turns not ok (1 error; failed steps in them: compose:http_400 ×1)"
            in res.stderr)  # fmt: skip
    assert "ok turns answered with a step failed open" not in res.stderr
    shown = json.loads(chainrun("show", "1", "--db", str(db), "--json").stdout)
    (turn,) = shown["turns"]
    assert (turn["status"], turn["error_type"], turn["output"]) == ("error", "http_400", None)
    assert shown["summary"]["turns"]["n_errored"] == 1
    text = chainrun("show", "1", "--db", str(db)).stdout
    assert "turn 1 (r1) error (http_400) " in text and "\n  < (no answer)\n" in text, text
