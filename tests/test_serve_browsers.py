"""What a page on another origin can do with ``chainrun serve`` and ``chainrun review``,
as a browser sends it (httpx here; a real Chromium in test_serve_browser.py), and the
shapes every response has: the one error object on every route, ``x-request-id``.

Before: ``/chat`` and ``/v1/chat/completions`` read a form post (``enctype=text/plain``,
no preflight) as JSON, so a page on another origin could make a turn through a
shopper's browser (and place an order); neither server checked ``Host``; there was no
CORS at all; unknown routes answered text/plain; no response had a request id.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from log_backends import BACKENDS, open_log
from serve_helpers import JSON_TYPE, fake_chain, n_turns, serving, sse

from chainrun.config import ChainConfig
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider
from chainrun.serve.browsers import allowed_hosts, host_name

SHOP = "https://shop.example"
ELSEWHERE = "https://evil.example"
BODY = {"message": "a rain jacket?"}
V1 = {"model": "chainrun-shop", "messages": [{"role": "user", "content": "a rain jacket?"}]}


factory = fake_chain


async def test_a_form_post_makes_no_turn_on_either_face(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    """What an HTML form on another origin can send (text/plain, urlencoded, multipart)
    and a body with no type at all: 415 in the error shape, and no turn."""
    async with (
        serving(factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        refused = []
        for path, body in (("/chat", BODY), ("/v1/chat/completions", V1)):
            raw = json.dumps(body).encode()
            for kind in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", None):  # fmt: skip
                headers = {"Content-Type": kind} if kind else {}
                refused.append(await client.post(path, content=raw, headers=headers))
        ok = await client.post("/chat", content=json.dumps(BODY).encode(),
                               headers={"Content-Type": "application/json; charset=utf-8"})
    for r in refused:
        assert r.status_code == 415, r.text
        assert r.json()["error"]["code"] == "unsupported_media_type"
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert ok.status_code == 200
    assert n_turns(store) == 1  # the JSON one alone


async def test_a_host_the_server_is_not_is_refused(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    """DNS rebinding: a name the attacker controls pointed at 127.0.0.1 sends its own
    name as Host; the server answers only to its own names."""
    hosts = allowed_hosts("127.0.0.1")
    assert hosts is not None
    async with serving(factory(config, store, fake), allowed_hosts=hosts) as (url, _):
        port = url.rsplit(":", 1)[1]
        async with httpx.AsyncClient(base_url=url) as client:
            rebound = await client.post("/chat", json=BODY,
                                        headers={"Host": f"rebound.example:{port}"})
            page = await client.get("/", headers={"Host": f"rebound.example:{port}"})
            fine = [(await client.get("/healthz", headers={"Host": f"{h}:{port}"})).status_code
                    for h in ("localhost", "127.0.0.1", "[::1]")]  # fmt: skip
    assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "invalid_host"
    assert page.status_code == 400
    assert fine == [200, 200, 200]
    assert n_turns(store) == 0


def test_allowed_hosts() -> None:
    assert host_name("[::1]:8000") == "::1" and host_name("Shop.Example:443") == "shop.example"
    assert host_name("localhost") == "localhost"
    assert allowed_hosts("0.0.0.0") is None  # any: beyond loopback a token guards it
    assert allowed_hosts("0.0.0.0", ["chat.shop.example"]) == ("chat.shop.example",)
    assert allowed_hosts("10.0.0.5", ["*.shop.example"]) == ("10.0.0.5", "*.shop.example")
    assert set(allowed_hosts("::1") or ()) == {"::1", "localhost", "127.0.0.1"}


async def test_without_cors_origins_no_page_elsewhere_may_read_or_preflight(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    async with (
        serving(factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        pre = await client.options("/chat", headers={
            "Origin": SHOP, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})  # fmt: skip
        r = await client.get("/v1/models", headers={"Origin": SHOP})
    assert "access-control-allow-origin" not in pre.headers
    assert pre.status_code == 405 and pre.json()["error"]["code"] == "method_not_allowed"
    assert "access-control-allow-origin" not in r.headers


async def test_cors_origin_answers_its_preflight_and_its_stream(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    async with (
        serving(factory(config, store, fake), cors_origins=[SHOP]) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        pre = await client.options("/v1/chat/completions", headers={
            "Origin": SHOP, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers":
                "authorization, content-type, idempotency-key, conversation-id"})  # fmt: skip
        other = await client.options("/chat", headers={
            "Origin": ELSEWHERE, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})  # fmt: skip
        async with client.stream("POST", "/chat", json=BODY, headers={"Origin": SHOP}) as r:
            events = [e async for e in sse(r)]
            streamed = r.headers
        async with client.stream("POST", "/chat", json=BODY,
                                 headers={"Origin": ELSEWHERE}) as r:  # fmt: skip
            _ = [e async for e in sse(r)]
            elsewhere = r.headers
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == SHOP
    allowed = pre.headers["access-control-allow-headers"].lower()
    for h in ("authorization", "content-type", "idempotency-key", "conversation-id"):
        assert h in allowed
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert streamed["access-control-allow-origin"] == SHOP
    assert "x-request-id" in streamed["access-control-expose-headers"].lower()
    assert events[-1][0] == "turn"
    assert "access-control-allow-origin" not in elsewhere


async def test_every_response_has_a_request_id_and_every_error_the_shape(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    async with (
        serving(factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        health = await client.get("/healthz")
        missing = await client.get("/v1/nothing")
        static_missing = await client.get("/static/nothing.js")
        embeddings = await client.post("/v1/embeddings", json={"input": "hi"})
        wrong_method = await client.get("/chat")
        model = await client.get("/v1/models/chainrun-shop")
        no_model = await client.get("/v1/models/gpt-4o")
        async with client.stream("POST", "/chat", json=BODY) as r:
            events = [e async for e in sse(r)]
            chat_id = r.headers["x-request-id"]
        done = await client.post("/v1/chat/completions", json=V1)
    for r in (health, missing, static_missing, embeddings, wrong_method, model, no_model, done):
        assert len(r.headers["x-request-id"]) == 32, r.headers
    for r, status, code in ((missing, 404, "unknown_url"), (static_missing, 404, "unknown_url"),
                            (embeddings, 404, "unknown_url"),
                            (wrong_method, 405, "method_not_allowed"),
                            (no_model, 404, "model_not_found")):  # fmt: skip
        assert r.status_code == status and r.headers["content-type"] == "application/json"
        error = r.json()["error"]
        assert error["code"] == code and error["type"] == "invalid_request_error", error
    assert "GET /v1/nothing" in missing.json()["error"]["message"]
    assert wrong_method.headers["allow"] == "POST"
    assert model.json() == {"id": "chainrun-shop", "object": "model", "created": 0,
                            "owned_by": "chainrun"}  # fmt: skip
    # a turn's request id in the log is its response's
    assert events[0][0] == "turn_started" and events[0][1]["request_id"] == chat_id
    rid = done.headers["x-request-id"]
    assert done.json()["id"] == f"chatcmpl-{rid}"
    assert done.json()["chainrun"]["request_id"] == rid
    assert {t.request_id for t in store.turns(store.latest_run_id() or 0)} >= {chat_id, rid}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", ["/chat", "/v1/chat/completions"])
async def test_bad_input_is_a_400_in_the_shape(
    config: ChainConfig, fake: FakeProvider, path: str, backend: str
) -> None:
    """1,000 nested arrays in a 2 KB body was a RecursionError (500); a NUL character a
    PostgreSQL ``DataError`` (500) where SQLite kept it: both logs refuse it alike now."""
    nested = b'{"message": "hi", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    if path != "/chat":
        nested = b'{"model": "chainrun-shop", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    nul_bodies = ([{"message": "a\x00b"}, {"message": "hi", "conversation_id": "c\x00"}]
                  if path == "/chat" else
                  [{**V1, "messages": [{"role": "user", "content": "a\x00b"}]},
                   {**V1, "user": "u\x00"}, {**V1, "metadata": {"conversation_id": "c\x00"}}])
    with open_log(backend) as store:
        async with (
            serving(factory(config, store, fake)) as (url, _),
            httpx.AsyncClient(base_url=url) as client,
        ):
            deep = await client.post(path, content=nested, headers=JSON_TYPE)
            nuls = [await client.post(path, json=b) for b in nul_bodies]
            ok = await client.post(path, json=BODY if path == "/chat" else V1)
        await store.flush()
        turns = n_turns(store)
    assert deep.status_code == 400, deep.text
    assert "nested too deeply" in deep.json()["error"]["message"]
    for r in nuls:
        assert r.status_code == 400, r.text
        assert "NUL character" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"], r.text
    assert ok.status_code == 200 and turns == 1  # the good one alone


async def test_the_review_page_takes_no_form_post_nor_another_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from chainrun.review.app import create_review_app

    class Session:
        def __init__(self) -> None:
            self.judged: list[object] = []

        def state(self) -> dict[str, object]:
            return {"item": None}

        def judge(self, body: object) -> dict[str, object]:
            self.judged.append(body)
            return self.state()

    session = Session()
    app = create_review_app(session)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9") as client:
        form = await client.post("/api/judge", content=b'{"request_id": "r", "choice": "left"}',
                                 headers={"Content-Type": "text/plain"})
        rebound = await client.post("/api/judge", json={"request_id": "r", "choice": "left"},
                                    headers={"Host": "rebound.example:9"})
        deep = await client.post("/api/judge", content=b"[" * 1000 + b"]" * 1000,
                                 headers=JSON_TYPE)
        ok = await client.post("/api/judge", json={"request_id": "r", "choice": "left"})
    assert form.status_code == 415 and rebound.status_code == 400
    assert deep.status_code == 400 and "nested too deeply" in deep.text
    assert ok.status_code == 200 and len(session.judged) == 1


def _held_back_price() -> FakeProvider:
    """The answer step writes a price; what the shopper sees of it is the tokens."""
    from conftest import reply_by_step

    from chainrun.providers.fake import FakeReply

    return FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("The Storm Shell is $12.", ttft_s=0.002)}))  # fmt: skip


@pytest.mark.parametrize("token", [None, "t0ken"])
async def test_a_shoppers_stream_carries_no_step_output_nor_check_reasons(
    config: ChainConfig, store: Store, token: str | None
) -> None:
    """By default /chat streams the answer as released, products, actions, the answer's
    end and the turn; the steps' raw outputs and the checks' reasons only to the
    operator: ``--step-events``, or ``Chainrun-Events: steps`` with the bearer token."""
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        serving(fake_chain(config, store, _held_back_price()), token=token,
                step_events=False) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30, headers=auth) as client,
    ):
        async with client.stream("POST", "/chat", json=BODY,
                                 headers={"Chainrun-Events": "steps"}) as r:  # fmt: skip
            asked = [e async for e in sse(r)]
        async with client.stream("POST", "/chat", json=BODY) as r:
            shopper = [e async for e in sse(r)]
    kinds = {e for e, _ in shopper}
    assert kinds <= {"turn_started", "token", "products", "action", "answer_done", "turn"}
    assert {"turn_started", "turn"} <= kinds
    assert all(d["step"] == "compose" for e, d in shopper if e == "token")
    assert not any(e in ("step", "grounding", "tool") for e, _ in shopper)
    # with the token, the header is the operator's switch; without one it is not taken
    operator = {e for e, _ in asked}
    assert ("step" in operator) == bool(token), operator


def test_an_origin_that_is_none_is_one_line_and_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cli_runner import chainrun

    res = chainrun("serve", "--port", "0", "--db", str(tmp_path / "log.db"),
                   "--cors-origin", "shop.example")  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip() == ("chainrun: error: --cors-origin: 'shop.example': expected "
                                  "scheme://host[:port] (as a browser sends Origin, no path) "
                                  "or *")  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_token_whose_sub_or_claims_hold_a_nul_is_refused_401(
    config: ChainConfig, fake: FakeProvider, backend: str
) -> None:
    """A signed token's ``sub`` with U+0000 reached the log as the user id (PostgreSQL:
    a 500); now the identity does not check out, on either log."""
    from joserfc import jwt
    from joserfc.jwk import OctKey

    from chainrun.serve.identity import IdentitySource, TokenVerifier

    secret = "s" * 32
    source = IdentitySource("X-Shopper", TokenVerifier.hs256(secret))
    key = OctKey.import_key(secret.encode())
    exp = int(time.time()) + 600
    tokens = [jwt.encode({"alg": "HS256"}, {**claims, "exp": exp}, key)
              for claims in ({"sub": "u\x00"}, {"sub": "u", "name": "a\x00"})]  # fmt: skip
    with open_log(backend) as store:
        async with (
            serving(factory(config, store, fake), identity=source) as (url, _),
            httpx.AsyncClient(base_url=url) as client,
        ):
            refused = [await client.post("/chat", json=BODY, headers={"X-Shopper": t})
                       for t in tokens]  # fmt: skip
        await store.flush()
        turns = n_turns(store)
    for r in refused:
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_identity"
        assert "NUL character" in r.json()["error"]["message"]
    assert turns == 0


def test_a_deep_body_is_refused_whatever_the_recursion_limit() -> None:
    """The depth is chainrun's own limit: a library that raised the interpreter's
    recursion limit (the parser's own) let 1,000 nested arrays through."""
    import sys

    from chainrun.serve.errors import MAX_JSON_DEPTH, NotJSON, read_json

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        with pytest.raises(NotJSON, match="nested too deeply"):
            read_json(b"[" * 1000 + b"]" * 1000)
    finally:
        sys.setrecursionlimit(old)
    ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert read_json(ok) is not None


async def test_the_responses_face_refuses_a_deep_body_as_the_others_do(
    config: ChainConfig, store: Store, fake: FakeProvider
) -> None:
    nested = b'{"model": "chainrun-shop", "input": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    async with (
        serving(factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        deep = await client.post("/v1/responses", content=nested, headers=JSON_TYPE)
    assert deep.status_code == 400, deep.text
    assert deep.json()["error"]["code"] == "invalid_json"
    assert "nested too deeply" in deep.json()["error"]["message"]
