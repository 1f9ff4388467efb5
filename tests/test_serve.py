"""``chainrun serve``: /chat over SSE, health and readiness, the bearer token, the
OpenAI-compatible face with the real ``openai`` client, and client disconnects.

The app runs under a real uvicorn on loopback; the model server is the in-process fake
or the latency lab (a real HTTP server in a subprocess).
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import reply_by_step
from log_backends import BACKENDS, open_log
from serve_helpers import JSON_TYPE, chat, serving, sse

from chainrun.chain import Chain
from chainrun.config import ChainConfig, config_from_dict
from chainrun.desk.conversations import derived_conversation_id
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.serve.chat import BadRequest, parse_chat_body
from chainrun.serve.openai_face import InvalidRequest, parse_completion_request


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """These tests run on both log backends (SQLite in memory, a PostgreSQL schema)."""
    with open_log(request.param) as s:
        yield s


STATIC = Path(__file__).resolve().parents[1] / "chainrun" / "serve" / "static"


def fake_factory(config: ChainConfig, store: Store, fake: FakeProvider) -> Callable[[], Chain]:
    return lambda: Chain(config, store=store, providers={"local": fake}, kind="live", quiet=True)


def lab_factory(
    lab: LabServer, store: Store, steps: dict[str, object] | None = None
) -> Callable[[], Chain]:
    cfg = config_from_dict({"providers": {"local": {"base_url": lab.base_url}},
                            "steps": steps or {}})  # fmt: skip
    return lambda: Chain(cfg, store=store, kind="live", quiet=True)


#: the answer released token by token: the grounding check releases whole sentences, and
#: the lab's one-sentence answer would reach the client only once it was all generated
#: (nothing left in flight to cancel when the client leaves "mid-answer")
TOKEN_BY_TOKEN = {"compose": {"grounding": {"enabled": False}}}


@pytest.fixture(scope="module")
def slow_lab() -> Iterator[LabServer]:
    """Every call streams 40 tokens 25 ms apart (about 1 s): long enough to leave mid-answer."""
    with LabServer("fast", n_tokens=40, per_token_ms=25) as lab:
        yield lab


@pytest.fixture(scope="module")
def quick_lab() -> Iterator[LabServer]:
    with LabServer("lognormal", median_ms=5, sigma=0.3, n_tokens=8, per_token_ms=1) as lab:
        yield lab


# -- /chat ----------------------------------------------------------------------------------
async def test_chat_streams_steps_tokens_and_a_logged_turn(config, store, fake) -> None:
    async with (
        serving(fake_factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        events = await chat(client, "waterproof jacket under 100?", conversation_id="conv-1")
        again = await chat(client, "and in blue?", conversation_id="conv-1")
    names = [e for e, _ in events]
    assert names[0] == "turn_started" and names[-1] == "turn"
    steps = [d for e, d in events if e == "step"]
    # every step but the policy step (a product question: the catalogue route)
    routed = sorted(set(config.order) - {"policy"})
    assert sorted(d["step"] for d in steps if d["phase"] == "started") == routed
    finished = {d["step"]: d for d in steps if d["phase"] == "finished"}
    assert finished["compose"]["ttft_ms"] > 0 and finished["compose"]["output_tokens"] > 0
    assert finished["compose"]["n_attempts"] == 1 and finished["compose"]["hedge_fired"] is False
    for d in finished.values():
        assert d["started_ms"] >= 0 and d["duration_ms"] >= 0
    text = "".join(d["text"] for e, d in events if e == "token" and d["step"] == "compose")
    turn = events[-1][1]
    assert turn["status"] == "ok" and turn["output"] == text
    assert turn["conversation_id"] == "conv-1" and turn["answer_ttft_ms"] > 0
    assert turn["answer_done_ms"] >= turn["answer_ttft_ms"]
    # the live offsets are the chain's own: the logged summary agrees with them
    for s in turn["steps"]:
        assert s["started_ms"] == finished[s["step"]]["started_ms"]
    logged = {s["step"]: s for s in turn["steps"]}
    assert logged["validate"]["post_answer"] and not logged["compose"]["post_answer"]
    # retrieve routes on the label: it starts once classify (no model call) has ended
    classify, retrieve = logged["classify"], logged["retrieve"]
    assert retrieve["started_ms"] >= classify["started_ms"] + classify["duration_ms"] - 0.5
    assert logged["policy"]["status"] == "skipped"
    # the summary is what the log holds: steps in order, one attempt per model step
    assert [s["step"] for s in turn["steps"]] == list(config.order)
    assert [len(s["attempts"]) for s in turn["steps"]] == [0, 0, 0, 1, 1, 1]
    calls = store.calls(turn["run_id"])
    assert turn["usage"]["input_tokens"] == sum(c.input_tokens for c in calls[:3])
    assert turn["usage"]["output_tokens"] == sum(c.output_tokens for c in calls[:3])
    # one chain, one run of kind live, every turn logged once with its conversation id
    rows = store.turns(turn["run_id"])
    assert [r.id for r in rows] == [turn["turn_id"], again[-1][1]["turn_id"]]
    assert {r.conversation_id for r in rows} == {"conv-1"}
    run = store.get_run(turn["run_id"])
    assert run.kind == "live" and run.status == "complete"  # closed at shutdown


async def test_chat_without_conversation_id_gets_one(config, store, fake) -> None:
    async with (
        serving(fake_factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        events = await chat(client, "hello")
    conv = events[0][1]["conversation_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", conv) and events[-1][1]["conversation_id"] == conv


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        (b"[1]", "body"),
        (b"{}", "message"),
        (b'{"message": "  "}', "message"),
        (b'{"message": 3}', "message"),
        (json.dumps({"message": "x" * 8001}).encode(), "message"),
        (b'{"message": "hi", "conversation_id": 5}', "conversation_id"),
    ],
)
def test_bad_chat_body_names_the_field(body: bytes, field: str) -> None:
    with pytest.raises(BadRequest, match=rf"^{field}: expected"):
        parse_chat_body(body)


async def test_bad_body_is_400_and_nothing_logged(config, store, fake) -> None:
    async with (
        serving(fake_factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        r = await client.post("/chat", content=b'{"message": ""}', headers=JSON_TYPE)
    assert r.status_code == 400 and r.json() == {"error": {
        "message": "message: expected a non-empty string", "type": "invalid_request_error",
        "param": "message", "code": "invalid_value"}}  # fmt: skip
    assert store.log.scalar("select count(*) from turns") == 0


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"message": "hi", "extra": 1},
         "extra: unknown field; expected message, conversation_id, confirm, deny"),
        ({"message": "hi", "conversationId": "c1"},
         "conversationId: unknown field (did you mean 'conversation_id'?); expected message, "
         "conversation_id, confirm, deny"),
    ],
)  # fmt: skip
async def test_an_unknown_chat_key_is_400_naming_it_and_nothing_logged(
    config, store, fake, body, said
) -> None:
    """A typo such as ``conversationId`` used to be dropped: the turn ran in a new
    conversation without a word."""
    async with (
        serving(fake_factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        r = await client.post("/chat", json=body)
    param = next(k for k in body if k != "message")
    assert r.status_code == 400 and r.json() == {"error": {
        "message": said, "type": "invalid_request_error", "param": param,
        "code": "invalid_value"}}  # fmt: skip
    assert store.log.scalar("select count(*) from turns") == 0


async def test_health_ready_and_the_page(config, store, fake) -> None:
    async with (
        serving(fake_factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = await client.get("/readyz")
        page = await client.get("/")
        js = await client.get("/static/chat.js")
    assert ready.status_code == 200 and ready.json()["steps"] == list(config.order)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert js.status_code == 200 and "sseEvents" in js.text


def test_page_loads_nothing_from_elsewhere_and_inserts_text_only() -> None:
    for f in STATIC.iterdir():
        text = f.read_text(encoding="utf-8")
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), f.name  # no CDN
        assert not re.search(r"url\(\s*[\"']?(https?:)?//", text), f.name
    js = (STATIC / "chat.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js


async def test_readyz_is_503_until_the_providers_answer(config, store, fake) -> None:
    down = config_from_dict({"providers": {"local": {"base_url": "http://127.0.0.1:9/v1",
                                                     "connect_timeout_s": 0.2}}})  # fmt: skip
    tries: list[int] = []
    checked = asyncio.Event()  # the third try waits until the test has seen the 503s

    class HeldOpen(Chain):
        async def open(self) -> None:
            await checked.wait()
            await super().open()

    def factory() -> Chain:
        tries.append(1)
        if len(tries) < 3:  # port 9 (discard) refuses: the preflight fails
            return Chain(down, store=store, kind="live", quiet=True)
        return HeldOpen(config, store=store, providers={"local": fake}, kind="live",
                        quiet=True)  # fmt: skip

    async with (
        serving(factory, wait_ready=False, retry_s=0.3) as (url, state),
        httpx.AsyncClient(base_url=url) as client,
    ):
        for _ in range(200):  # until a preflight has failed (0.05 s apart, 10 s at most)
            r = await client.get("/readyz")
            if "ProviderUnavailable" in r.text:
                break
            await asyncio.sleep(0.05)
        assert r.status_code == 503 and "ProviderUnavailable" in r.json()["detail"]
        busy = await client.post("/chat", json={"message": "hi"})
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        # one error shape on both faces (it was {"error": "not ready", "detail": ...})
        oai = await client.post("/v1/chat/completions", json={
            "model": "chainrun-shop", "messages": [{"role": "user", "content": "hi"}]})
        for r in (busy, oai):
            err = r.json()["error"]
            assert r.status_code == 503 and err["code"] == "not_ready", r.text
            assert err["type"] == "server_error" and "ProviderUnavailable" in err["message"]
        checked.set()
        await asyncio.wait_for(state.wait_ready(), 10)
        assert (await client.get("/readyz")).status_code == 200
        events = await chat(client, "hi")
    assert events[-1][1]["status"] == "ok" and len(tries) == 3


async def test_an_unexpected_error_opening_the_chain_is_said_and_retried(
    config, store, fake, caplog: pytest.LogCaptureFixture
) -> None:
    """An open that fails with an error that is not chainrun's (the catalogue's SQLite
    file locked by another worker creating it) is said with its traceback, shown by
    /readyz and retried: it used to end the opener silently, and /readyz said "starting:
    the providers have not answered their preflight yet" for as long as the process ran."""
    tries: list[int] = []
    checked = asyncio.Event()  # the retry waits until /readyz has been seen saying the error

    class LockedOnce(Chain):
        async def open(self) -> None:
            tries.append(1)
            if len(tries) == 1:
                raise sqlite3.OperationalError("database is locked")
            await checked.wait()
            await super().open()

    def factory() -> Chain:
        return LockedOnce(config, store=store, providers={"local": fake}, kind="live",
                          quiet=True)  # fmt: skip

    async with (
        serving(factory, wait_ready=False, retry_s=0.5) as (url, state),
        httpx.AsyncClient(base_url=url) as client,
    ):
        for _ in range(200):  # until the first open has failed (0.05 s apart, 10 s at most)
            r = await client.get("/readyz")
            if "OperationalError" in r.text or r.status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert r.status_code == 503 and "OperationalError: database is locked" in r.text, r.text
        checked.set()
        await asyncio.wait_for(state.wait_ready(), 10)
        assert (await client.get("/readyz")).status_code == 200
        events = await chat(client, "hi")
    assert events[-1][1]["status"] == "ok" and len(tries) == 2
    said = [r for r in caplog.records if "database is locked" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "ERROR" and said[0].exc_info is not None


async def test_bearer_token(config, store, fake) -> None:
    async with (
        serving(fake_factory(config, store, fake), token="s3cret") as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/")).status_code == 200
        denied = await client.post("/chat", json={"message": "hi"})
        wrong = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        models = await client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
        # the scheme's name in any case (RFC 9110 section 11.1); the token exactly
        lower = await client.get("/v1/models", headers={"Authorization": "bearer s3cret"})
        case = await client.get("/v1/models", headers={"Authorization": "Bearer S3CRET"})
        oai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
        async with oai:
            done = await oai.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "hi"}]
            )
    assert denied.status_code == 401 and wrong.status_code == 401 and case.status_code == 401
    assert lower.status_code == 200
    assert denied.json()["error"]["code"] == "invalid_api_key"
    assert models.json()["data"][0]["id"] == "chainrun-shop"
    assert done.choices[0].message.content


def test_serve_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "CHAINRUN_SERVE_TOKEN"}
    proc = subprocess.run(
        [sys.executable, "-m", "chainrun", "serve", "--host", "0.0.0.0",
         "--db", str(tmp_path / "x.db")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "CHAINRUN_SERVE_TOKEN" in proc.stderr
    assert not (tmp_path / "x.db").exists()


# -- the OpenAI-compatible face -------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param", "status"),
    [
        ({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}, "model", 404),
        # no model: a 400 naming the field (it was 404 "The model None does not exist")
        ({"messages": [{"role": "user", "content": "x"}]}, "model", 400),
        ({"model": "m", "messages": []}, "messages", 400),
        ({"model": "m", "messages": [{"role": "system", "content": "x"}]}, "messages", 400),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n", 400),
    ],
)
def test_completion_request_refusals(body: dict, param: str, status: int) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_completion_request(body, "m")
    assert e.value.param == param and e.value.status == status


def test_completion_request_takes_the_last_user_text() -> None:
    req = parse_completion_request({
        "model": "m", "stream": True, "stream_options": {"include_usage": True},
        "metadata": {"conversation_id": "c9"},
        "messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                     {"role": "user", "content": [{"type": "text", "text": "second"}]}],
    }, "m")  # fmt: skip
    assert (req.asked.message, req.asked.conversation_id, req.stream, req.include_usage) == (
        "second", "c9", True, True)  # fmt: skip


async def test_openai_client_streamed_and_not_with_summed_usage(quick_lab, tmp_path) -> None:
    store = Store.open(tmp_path / "log.db")
    async with serving(lab_factory(quick_lab, store)) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            models = await client.models.list()
            whole = await client.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "a rain jacket?"}],
                user="shopper-7",
            )  # fmt: skip
            stream = await client.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "a rain jacket?"}],
                stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [c async for c in stream]
        for _ in range(500):  # the streamed turn ends at its answer; its checks go on
            if len(list(store.db.table("turns").rows)) == 2:
                break
            await asyncio.sleep(0.02)
    assert [m.id for m in models.data] == ["chainrun-shop"]
    # not streamed: the chain's answer, usage summed over the logged calls of the turn
    extra = whole.model_extra["chainrun"]
    assert whole.choices[0].message.content == extra["output"] and extra["status"] == "ok"
    assert whole.choices[0].finish_reason == "stop"
    calls = [c for c in store.calls(extra["run_id"]) if c.turn_id == extra["turn_id"]]
    assert len(calls) == 3  # compose, validate, critique: classify calls no model
    assert whole.usage.prompt_tokens == sum(c.input_tokens for c in calls)
    assert whole.usage.completion_tokens == sum(c.output_tokens for c in calls)
    assert whole.usage.completion_tokens_details.reasoning_tokens == 0
    assert whole.usage.prompt_tokens_details.cached_tokens == 0
    assert [s["step"] for s in extra["steps"]] == ["classify", "retrieve", "policy", "compose",
                                                     "validate", "critique"]  # fmt: skip
    # streamed: the deltas make the answer; the stream ends at the answer (its finish
    # chunk says what is still running); usage last, of the calls made until the answer
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    summary = finish[0].model_extra["chainrun"]
    assert text == summary["output"] and text and summary["status"] == "answered"
    assert {"validate", "critique"} <= set(summary["pending"])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    turns = store.turns(extra["run_id"])
    (streamed,) = [t for t in turns if t.request_id == summary["request_id"]]
    assert streamed.status == "ok" and streamed.output == text  # the checks finished after
    calls = [c for c in store.calls(extra["run_id"]) if c.turn_id == streamed.id
             and c.step not in summary["pending"]]  # fmt: skip
    assert chunks[-1].usage.prompt_tokens == sum(c.input_tokens for c in calls)
    assert chunks[-1].usage.completion_tokens == sum(c.output_tokens for c in calls)
    # ``user`` is the end user, never the conversation: each chat's conversation is
    # derived from its opening and its caller (the same message from another end user:
    # another conversation)
    assert turns[0].conversation_id == derived_conversation_id("~shopper-7", ["a rain jacket?"])
    assert turns[1].conversation_id == derived_conversation_id("", ["a rain jacket?"])
    store.close()


# -- disconnects ---------------------------------------------------------------------------
async def _wait_for_turns(store: Store, n: int) -> list[dict]:
    for _ in range(200):
        rows = list(store.db.table("turns").rows)
        if len(rows) >= n:
            return rows
        await asyncio.sleep(0.02)
    raise AssertionError(f"expected {n} logged turns")


def _in_flight_were_disconnected(lab: LabServer) -> list[dict]:
    records = lab.requests()
    unfinished = [r for r in records if not r["completed"]]
    assert unfinished, records
    assert all(r["disconnected"] for r in unfinished), unfinished
    return records


async def test_chat_client_gone_mid_answer_cancels_the_turn(slow_lab, tmp_path) -> None:
    slow_lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with (
        serving(lab_factory(slow_lab, store, TOKEN_BY_TOKEN)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        async with client.stream("POST", "/chat", json={"message": "a jacket?"}) as r:
            async for event, data in sse(r):
                if event == "token" and data["step"] == "compose":
                    break  # leave mid-answer: the response is closed
        (turn,) = await _wait_for_turns(store, 1)
        await asyncio.sleep(0.2)  # the lab notices the closed stream
        records = _in_flight_were_disconnected(slow_lab)
    assert turn["status"] == "cancelled"
    steps = {s.step: s for s in store.steps(turn["run_id"])}
    assert steps["compose"].status == "cancelled" and "validate" not in steps
    (compose,) = [c for c in store.calls(turn["run_id"]) if c.step == "compose"]
    assert compose.ttft_ms is not None and compose.output  # what had arrived
    # compose only: classify (off the critical path) would start after the answer, and
    # nothing runs after the client left
    assert len(records) == 1
    store.close()


async def test_openai_stream_closed_early_cancels_the_turn(slow_lab, tmp_path) -> None:
    slow_lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(lab_factory(slow_lab, store, TOKEN_BY_TOKEN)) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            stream = await client.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "a jacket?"}],
                stream=True,
            )  # fmt: skip
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    break
            await stream.close()
        (turn,) = await _wait_for_turns(store, 1)
        await asyncio.sleep(0.2)
        _in_flight_were_disconnected(slow_lab)
    assert turn["status"] == "cancelled"
    store.close()


async def test_non_streamed_client_gone_cancels_the_turn(slow_lab, tmp_path) -> None:
    slow_lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with (
        serving(lab_factory(slow_lab, store)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        body = {"model": "chainrun-shop", "messages": [{"role": "user", "content": "a jacket?"}]}
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/chat/completions", json=body, timeout=0.5)
        (turn,) = await _wait_for_turns(store, 1)
        await asyncio.sleep(0.2)
        _in_flight_were_disconnected(slow_lab)
    assert turn["status"] == "cancelled"
    store.close()


async def test_an_outage_on_the_openai_face_is_an_error_not_content_filter(config, store) -> None:
    """The answer's server answered 500: the face says a server error with the step's
    type, streamed or not, never ``content_filter`` (a client's retry cannot tell that
    from a refusal)."""
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(error=__import__("chainrun").ProviderStatusError("x", status=500)),
    }))  # fmt: skip
    body = {"model": "chainrun-shop", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        serving(fake_factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        client_ = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        async with client_:
            with pytest.raises(openai.InternalServerError) as e:
                await client_.chat.completions.create(**body)  # type: ignore[call-overload]
        streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert e.value.status_code == 502
    error = e.value.body
    assert isinstance(error, dict) and error["type"] == "server_error", error
    assert error["code"] == "http_500"
    # streamed: the turn failed at once, so the status says so before any stream
    assert streamed.status_code == 502 and streamed.headers["content-type"] == "application/json"
    assert streamed.json()["error"]["type"] == "server_error"
    assert streamed.json()["error"]["code"] == "http_500"


async def test_a_later_outage_ends_the_begun_stream_with_the_error(
    config, store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after the stream began (here past the face's short wait) is the
    stream's error object with its type, then ``[DONE]``; never ``content_filter``."""
    monkeypatch.setattr("chainrun.serve.openai_face.OUTAGE_WAIT_S", 0.05)
    fake = FakeProvider(name="local", script=reply_by_step({"compose": FakeReply(
        error=__import__("chainrun").ProviderStatusError("x", status=500), ttft_s=0.3)}))
    body = {"model": "chainrun-shop", "messages": [{"role": "user", "content": "hi"}],
            "stream": True}  # fmt: skip
    async with (
        serving(fake_factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        status = r.status_code
        streamed = [d async for _, d in sse(r)]
    assert status == 200 and streamed[-1] == "[DONE]"
    assert streamed[-2]["error"]["type"] == "server_error"
    assert streamed[-2]["error"]["code"] == "http_500"
    assert "content_filter" not in json.dumps(streamed)


async def test_a_checks_refusal_on_the_openai_face_is_content_filter(config, store) -> None:
    """A check refused the turn (a card number in the message): ``content_filter``."""
    fake = FakeProvider(name="local", script=reply_by_step())
    async with serving(fake_factory(config, store, fake)) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        async with client:
            done = await client.chat.completions.create(model="chainrun-shop", messages=[
                {"role": "user", "content": "my card is 4111 1111 1111 1111"}])
    assert done.choices[0].finish_reason == "content_filter"
    assert done.model_extra["chainrun"]["status"] in ("refused", "replaced")
    assert done.model_extra["chainrun"]["error_type"] is None
