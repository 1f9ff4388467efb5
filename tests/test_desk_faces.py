"""The front desk through ``chainrun serve``'s faces: the conversation a chat UI's request
belongs to, its background requests, the caller's identity, the time spent before the
turn's first step, and the log away while identity needs it.

Each test names the fault it was written for (main b3856ca): the OpenAI face took
``user`` (the end user, sent by chat UIs on every request of every chat) as the
conversation, so two chats of one person were one, a "yes" in one deciding an action
asked in the other, and with identity on whoever sent a ``user`` value first owned it; a
chat UI's title request ran as a shopper turn (read as a new request it dropped the
pending action; its tools acted); the owner check ran before the turn's clock started;
a log outage with identity on made every chat an HTTP 500 while ``/readyz`` said ready.

The title requests are the bytes Open WebUI and LibreChat send, rebuilt from their public
source (cited at each).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import serving, sse
from test_confirm_actions import cart_fake, confirm_config
from test_serve_identity import AUD, EC, ISS, RSA, jwks, token
from test_tool_steps import RUNS

from chainrun.chain import Chain
from chainrun.log.store import Store
from chainrun.serve.identity import IdentitySource, JwksKeys, TokenRules, TokenVerifier

MODEL = "chainrun-shop"
ASK = "put 2 of JKT-12 in my cart"
QUESTION = "Add 2 x JKT-12 to your cart?"

#: Open WebUI's title prompt (open-webui/open-webui, backend/open_webui/config.py at
#: 00b1c6bcaa3c473e7faeb8254751b9411f2c0b91, DEFAULT_TITLE_GENERATION_PROMPT_TEMPLATE);
#: ``{{MESSAGES:END:2}}`` is the chat's last two messages as ``ROLE: content`` lines
#: (backend/open_webui/utils/misc.py, get_messages_content)
OPEN_WEBUI_TITLE = """### Task:
Generate a concise title summarizing the chat history.
### Guidelines:
- The title should clearly represent the main theme or subject of the conversation.
- Keep it short: 2-4 words is best.
- Do not use emojis, quotation marks, or special formatting.
- Write the title in the chat's primary language; default to English if multilingual.
- Prioritize accuracy over creativity.
- Your entire response must consist solely of the JSON object, without any introductory or concluding text.
- The output must be a single, raw JSON object, without any markdown code fences or other encapsulating text.
- Ensure no conversational text, affirmations, or explanations precede or follow the raw JSON output, as this will cause direct parsing failure.
### Output:
JSON format: { "title": "your concise title here" }
### Examples:
- { "title": "Stock Trends" },
- { "title": "Chocolate Chip Cookies" },
- { "title": "Music Streaming" },
- { "title": "Remote Work" }
### Chat History:
<chat_history>
{{MESSAGES:END:2}}
</chat_history>"""  # noqa: E501


def open_webui_title(chat_id: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The body and headers of Open WebUI's title request for the chat ``chat_id``: one
    user message with the prompt, not streamed, ``max_completion_tokens`` 1000
    (backend/open_webui/routers/tasks.py, generate_title); its ``metadata`` (the chat id,
    the task) is removed before it leaves for an OpenAI connection, which gets the user
    and chat as headers when ENABLE_FORWARD_USER_INFO_HEADERS is on
    (backend/open_webui/routers/openai.py, get_headers_and_cookies)."""
    chat = f"USER: {ASK}\nASSISTANT: {QUESTION}"
    body = {"model": MODEL, "stream": False, "max_completion_tokens": 1000,
            "messages": [{"role": "user",
                          "content": OPEN_WEBUI_TITLE.replace("{{MESSAGES:END:2}}", chat)}]}
    return body, {"X-OpenWebUI-User-Id": "owui-user-1", "X-OpenWebUI-Chat-Id": chat_id}


def librechat_title(user: str) -> dict[str, Any]:
    """LibreChat's title request (its agents' completion method): the prompt of
    danny-avila/agents src/utils/title.ts at d8751a6ab077f9bb9b4fd66a7d55587c512751ac
    (defaultCompletionPrompt) with the chat as
    ``User: {input}\\nAI: {output}`` (src/run.ts, generateTitle), sent with the
    LibreChat user's id as ``user`` (danny-avila/LibreChat#6341)."""
    prompt = ("Provide a concise, 5-word-or-less title for the conversation, using title case "
              f"conventions. Only return the title itself.\n\nConversation:\nUser: {ASK}\n"
              f"AI: {QUESTION}")  # fmt: skip
    return {"model": MODEL, "user": user, "messages": [{"role": "user", "content": prompt}]}


def librechat_classic_title(user: str, emoji: bool = False) -> dict[str, Any]:
    """LibreChat's older clients' title request: one system message, ``Please generate
    {titleInstruction}`` and the chat in ``||>`` markers (danny-avila/LibreChat,
    api/app/clients/OpenAIClient.js, titleConvo; titleInstruction from
    api/app/clients/prompts/titlePrompts.js at 924b8fee76a4609874ccf49adc390f47a0bd688b,
    or with ``emoji`` as at 07eda3502c3cb0a2f3b0d43460653b610cc92510, which ends it with
    a sentence asking for an emoji), with ``user``."""
    instruction = ("a concise, 5-word-or-less title for the conversation, using its same "
                   "language, with no punctuation. Apply title case conventions appropriate "
                   'for the language. Never directly mention the language name or the word '
                   '"title"')  # fmt: skip
    if emoji:
        instruction += (".Start the title with one emoji that fits the topic (REQUIRED), The "
                        "emoji should help communicate the subject")  # fmt: skip
    convo = f'||>User:\n"{ASK}"\n||>Response:\n"{json.dumps(QUESTION)}"'
    return {"model": MODEL, "user": user, "temperature": 0.2, "max_tokens": 16,
            "messages": [{"role": "system",
                          "content": f"Please generate {instruction}\n\n{convo}\n\n||>Title:"}]}


@pytest.fixture(autouse=True)
def _fresh_runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


def pending_rows(db: Path) -> list[tuple[str, str | None]]:
    """(status, conversation) of every call that became a pending action, in order."""
    with Store.open(db, create=False) as log:
        rows = log.log.query("select c.status, t.conversation_id from tool_calls c join turns t "
                             "on t.id = c.turn_id where c.question is not null order by c.id")
    return [(r["status"], r["conversation_id"]) for r in rows]


async def v1(client: httpx.AsyncClient, body: dict[str, Any],
             headers: dict[str, str] | None = None) -> httpx.Response:  # fmt: skip
    return await client.post("/v1/chat/completions", json={"model": MODEL, **body},
                             headers=headers or {})  # fmt: skip


async def test_two_chats_of_one_user_are_two_conversations(tmp_path: Path) -> None:
    """A chat UI sends its person's id as ``user`` in every chat: the order asked in one
    chat is not confirmed by a "yes" that opens another."""
    db = tmp_path / "log.db"
    store = Store.open(db)
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()}, quiet=True)) as (url, _):
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                asked = await v1(client, {"user": "u-1",
                                          "messages": [{"role": "user", "content": ASK}]})
                other = await v1(client, {"user": "u-1",
                                          "messages": [{"role": "user", "content": "yes"}]})
                yes = await v1(client, {"user": "u-1", "messages": [
                    {"role": "user", "content": ASK}, {"role": "assistant", "content": QUESTION},
                    {"role": "user", "content": "yes"}]})  # fmt: skip
    finally:
        store.close()
    first, second = asked.json()["chainrun"], other.json()["chainrun"]
    assert first["output"] == QUESTION and second["conversation_id"] != first["conversation_id"]
    # the other chat's "yes" decided nothing of the first's; the first chat's yes did
    assert yes.json()["chainrun"]["conversation_id"] == first["conversation_id"]
    assert len(RUNS) == 1 and yes.json()["choices"][0]["message"]["content"] == (
        "Done: two JKT-12 are in your cart.")
    assert pending_rows(db)[0] == ("confirmed", first["conversation_id"])


async def test_an_end_user_named_by_another_caller_is_not_an_owner(tmp_path: Path) -> None:
    """With identity on, Bob sending ``user: "u-ann"`` binds nothing of Ann's: her own
    chat with that ``user`` is answered (it used to be 403 from then on)."""
    store = Store.open(tmp_path / "log.db")
    body = {"user": "u-ann", "messages": [{"role": "user", "content": "hello"}]}
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()}, quiet=True),
                           identity=IdentitySource("X-Shopper")) as (url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                bob = await v1(client, body, {"X-Shopper": "u-bob"})
                ann = await v1(client, body, {"X-Shopper": "u-ann"})
    finally:
        store.close()
    assert bob.status_code == ann.status_code == 200
    assert bob.json()["chainrun"]["conversation_id"] != ann.json()["chainrun"]["conversation_id"]


@pytest.mark.parametrize("ui", ["open-webui", "librechat", "librechat-classic",
                                "librechat-classic-emoji"])
async def test_a_chat_uis_title_request_leaves_the_pending_action_pending(
    tmp_path: Path, ui: str
) -> None:
    """The chat asks "Add 2 x JKT-12 to your cart?"; the chat UI then asks the same model
    for the chat's title, in the chat's conversation as far as serve can tell (Open WebUI:
    its chat-id header, read with --conversation-header; LibreChat: the same ``user``).
    The title request is answered as a background turn: it decides no action (the action
    stays pending), asks nothing and acts on nothing; the chat's "yes" then runs the
    action once."""
    db = tmp_path / "log.db"
    store = Store.open(db)
    chat = [{"role": "user", "content": ASK}]
    headers = {"X-OpenWebUI-User-Id": "owui-user-1", "X-OpenWebUI-Chat-Id": "chat-7"}
    extra: dict[str, Any] = {} if ui == "open-webui" else {"user": "u-librechat-1"}
    options = {"conversation_header": "X-OpenWebUI-Chat-Id"} if ui == "open-webui" else {}
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()}, quiet=True),
                           **options) as (url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                asked = await v1(client, {**extra, "messages": chat}, headers)
                if ui == "open-webui":
                    body, title_headers = open_webui_title("chat-7")
                    title = await v1(client, body, title_headers)
                else:
                    title = await v1(client, librechat_title("u-librechat-1")
                                     if ui == "librechat" else librechat_classic_title(
                                         "u-librechat-1", emoji=ui.endswith("emoji")))
                before_yes = pending_rows(db)
                yes = await v1(client, {**extra, "messages": [
                    *chat, {"role": "assistant", "content": QUESTION},
                    {"role": "user", "content": "yes"}]}, headers)  # fmt: skip
            title_turn = title.json()["chainrun"]
            with Store.open(db, create=False) as log:
                logged = log.turn(title_turn["turn_id"])
    finally:
        store.close()
    conversation = asked.json()["chainrun"]["conversation_id"]
    assert title.status_code == 200 and title_turn["conversation_id"] != conversation
    assert before_yes == [("awaiting_confirmation", conversation)]  # nothing asked, nothing decided
    assert logged is not None and logged.turn.verdicts["desk"]["background"] == "title"
    assert [t["status"] for s in title_turn["steps"] for t in s["tool_calls"]] == ["not_started"]
    assert yes.json()["chainrun"]["status"] == "ok" and len(RUNS) == 1


async def test_the_time_at_the_desk_is_the_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner check waits 0.4 s on the log: the turn's logged duration holds that
    wait (``admit_ms``), as the shopper's does. It used to start after the check, so the
    log said less than the shopper waited."""
    store = Store.open(tmp_path / "log.db")
    real_bind, real_owner = store.bind_conversation, store.conversation_owner

    def slow(real: Any) -> Any:
        def call(*args: Any) -> Any:
            time.sleep(0.4)  # the log's database slow to answer
            return real(*args)
        return call

    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()}, quiet=True),
                           identity=IdentitySource("X-Shopper")) as (url, _):  # fmt: skip
            monkeypatch.setattr(store, "bind_conversation", slow(real_bind))
            monkeypatch.setattr(store, "conversation_owner", slow(real_owner))
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                sent = time.perf_counter()
                async with client.stream("POST", "/chat", json={"message": "hello",
                                         "conversation_id": "c1"},
                                         headers={"X-Shopper": "u-1"}) as r:  # fmt: skip
                    events = [ev async for ev in sse(r)]
                waited_ms = (time.perf_counter() - sent) * 1000.0
    finally:
        store.close()
    summary = events[-1][1]
    # what the shopper waited is what the log says, the HTTP round trip aside
    assert summary["status"] == "ok" and summary["duration_ms"] >= waited_ms - 150
    assert summary["admit_ms"] >= 400


async def test_the_run_made_at_the_first_turn_is_part_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first turn of a chain makes its run in the log (0.3 s here): the turn's
    duration and its answer's TTFT hold it (they used to start after it)."""
    store = Store.open(tmp_path / "log.db")
    real = store.acreate_run

    async def slow(*args: Any, **kwargs: Any) -> int:
        await asyncio.sleep(0.3)
        return await real(*args, **kwargs)

    monkeypatch.setattr(store, "acreate_run", slow)
    async with Chain(confirm_config(), store=store, providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        done = await chain.run_turn("hello")
    store.close()
    assert done.answer_ttft_ms is not None and done.answer_ttft_ms >= 300
    assert done.duration_ms >= 300 and done.admit_ms is not None and done.admit_ms >= 300


async def test_with_identity_a_log_away_is_a_503_never_a_500(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log cannot be reached past its outage wait while identity is on: each chat is
    refused 503 (``log_unavailable``, ``Retry-After``) on both faces, ``/readyz`` says
    the log is away; once it answers, ``/readyz`` is ready again by its own look (no chat
    needed: a load balancer that took the server out of rotation sends none) and chats
    are served. It used to be an HTTP 500 with a traceback while ``/readyz`` said ready;
    then ``/readyz`` kept saying away until a chat found the log back."""
    store = Store.open(tmp_path / "log.db")
    cfg = confirm_config()
    cfg = cfg.model_copy(update={"log": cfg.log.model_copy(update={"outage_wait_s": 0.3})})
    reads = ("bind_conversation", "conversation_owner", "log_nonce")
    real = {name: getattr(store, name) for name in reads}

    def away(*args: Any) -> Any:
        raise ConnectionError("the log's database cannot be reached")

    try:
        async with serving(lambda: Chain(cfg, store=store, providers={"local": cart_fake()},
                                         quiet=True),
                           identity=IdentitySource("X-Shopper")) as (url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                for name in reads:
                    monkeypatch.setattr(store, name, away)
                chat = await client.post("/chat", json={"message": "hello", "conversation_id":
                                                        "c1"}, headers={"X-Shopper": "u-1"})
                openai = await v1(client, {"messages": [{"role": "user", "content": "hi"}]},
                                  {"X-Shopper": "u-1"})  # fmt: skip
                ready_away = await client.get("/readyz")
                for name in reads:
                    monkeypatch.setattr(store, name, real[name])
                ready_back = await client.get("/readyz")  # before any chat
                back = await client.post("/chat", json={"message": "hello", "conversation_id":
                                                        "c1"}, headers={"X-Shopper": "u-1"})
    finally:
        store.close()
    for refused in (chat, openai):
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "log_unavailable"
        assert "Traceback" not in refused.text
    assert ready_away.status_code == 503 and "the run log is away" in ready_away.json()["detail"]
    assert ready_away.json()["log"]["desk"]["state"] == "away"
    assert back.status_code == 200 and '"status": "ok"' in back.text
    assert ready_back.status_code == 200 and ready_back.json()["log"]["desk"]["state"] == "ok"


async def test_with_identity_a_silent_log_is_a_503_within_the_faces_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's database is silent at the owner check (a hung server: no error for 3 s,
    then a dropped connection; the read in a worker thread, as on a PostgreSQL log, whose
    reads leave the event loop): the chat is refused HTTP 503 ``log_unavailable`` once the
    outage wait and a short look are spent (0.3 s + 1 s here), before the face's wait for
    a refusal (2 s beyond the outage wait) starts a stream. It used to wait for the
    silence, then the outage wait again after the first failure, and answer 200 with the
    refusal as the stream's ``error`` event."""
    store = Store.open(tmp_path / "log.db")
    cfg = confirm_config()
    cfg = cfg.model_copy(update={"log": cfg.log.model_copy(update={"outage_wait_s": 0.3})})

    def silent(*args: Any) -> Any:
        time.sleep(3.0)
        raise ConnectionError("server closed the connection unexpectedly")

    real_off_loop = store.off_loop

    async def off_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if fn is silent:  # a network read: in a worker thread, as Store.off_loop on PostgreSQL
            return await asyncio.to_thread(fn, *args, **kwargs)
        return await real_off_loop(fn, *args, **kwargs)

    try:
        async with serving(lambda: Chain(cfg, store=store, providers={"local": cart_fake()},
                                         quiet=True),
                           identity=IdentitySource("X-Shopper")) as (url, _):  # fmt: skip
            monkeypatch.setattr(store, "bind_conversation", silent)
            monkeypatch.setattr(store, "off_loop", off_loop)
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                sent = time.monotonic()
                chat = await client.post("/chat", json={"message": "hello", "conversation_id":
                                                        "c1"}, headers={"X-Shopper": "u-1"})
                waited_s = time.monotonic() - sent
    finally:
        store.close()
    assert chat.status_code == 503 and chat.json()["error"]["code"] == "log_unavailable"
    assert chat.headers["retry-after"] == "1"
    assert waited_s < 2.3  # within the face's wait: 2 s beyond the 0.3 s outage wait


async def test_the_responses_face_takes_the_callers_identity_too(tmp_path: Path) -> None:
    """``POST /v1/responses`` reads the identity as the other faces do: no header is 401,
    another shopper continuing Ann's chat by its ``previous_response_id`` is 403 (nothing
    of it run or logged), Ann continuing it is answered in her conversation."""
    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()}, quiet=True),
                           identity=IdentitySource("X-Shopper")) as (url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                async def responses(body: dict[str, Any], who: str | None) -> httpx.Response:
                    return await client.post("/v1/responses", json={"model": MODEL, **body},
                                             headers={"X-Shopper": who} if who else {})
                anonymous = await responses({"input": "hello"}, None)
                ann = await responses({"input": "hello"}, "u-ann")
                bob = await responses({"input": "yes", "previous_response_id":
                                       ann.json()["id"]}, "u-bob")  # fmt: skip
                again = await responses({"input": "thanks", "previous_response_id":
                                         ann.json()["id"]}, "u-ann")  # fmt: skip
        with Store.open(tmp_path / "log.db", create=False) as log:
            users = [r["user_id"] for r in log.log.query("select user_id from turns")]
    finally:
        store.close()
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_identity"
    assert ann.status_code == again.status_code == 200
    assert bob.status_code == 403 and bob.json()["error"]["code"] == "conversation_forbidden"
    assert (again.json()["chainrun"]["conversation_id"]
            == ann.json()["chainrun"]["conversation_id"])  # fmt: skip
    assert users == ["u-ann", "u-ann"]


async def test_the_responses_face_takes_an_idempotency_key_too(tmp_path: Path) -> None:
    """``POST /v1/responses`` with an ``Idempotency-Key``: sent again, the first request's
    turn comes back (nothing run again); the key with another input is 422."""
    store = Store.open(tmp_path / "log.db")
    key = {"Idempotency-Key": "k-r1"}
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()},
                                         quiet=True)) as (url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                body = {"model": MODEL, "input": "hello", "user": "u-1"}
                first = await client.post("/v1/responses", json=body, headers=key)
                again = await client.post("/v1/responses", json=body, headers=key)
                other = await client.post("/v1/responses", json={**body, "input": "bye"},
                                          headers=key)  # fmt: skip
        with Store.open(tmp_path / "log.db", create=False) as log:
            turns = log.log.query("select id from turns")
    finally:
        store.close()
    assert first.status_code == again.status_code == 200
    assert again.json()["chainrun"]["turn_id"] == first.json()["chainrun"]["turn_id"]
    assert len(turns) == 1
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"


@pytest.mark.parametrize(("key", "alg"), [(RSA, "RS256"), (EC, "ES256")])
async def test_an_identity_providers_token_is_the_shopper_on_both_faces(
    tmp_path: Path, key: Any, alg: str
) -> None:
    """serve with a provider's JWKS (a file, keys made here), its issuer and audience: a
    token it signed names the shopper (logged as the turn's user); one for another
    audience is 401."""
    (tmp_path / "jwks.json").write_text(json.dumps(jwks(RSA, EC)))
    keys = JwksKeys(str(tmp_path / "jwks.json"))
    keys.load()
    source = IdentitySource("X-Id-Token", TokenVerifier.from_jwks(keys, TokenRules(ISS, AUD)))
    now = time.time()
    good = token({"sub": "u-7", "iss": ISS, "aud": AUD, "exp": now + 300, "iat": now}, key, alg)
    other = token({"sub": "u-7", "iss": ISS, "aud": "another-api", "exp": now + 300}, key, alg)
    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()}, quiet=True),
                           identity=source) as (url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                chat = await client.post("/chat", json={"message": "hello"},
                                         headers={"X-Id-Token": good})  # fmt: skip
                openai = await v1(client, {"messages": [{"role": "user", "content": "hi"}]},
                                  {"X-Id-Token": good})  # fmt: skip
                refused = await v1(client, {"messages": [{"role": "user", "content": "hi"}]},
                                   {"X-Id-Token": other})  # fmt: skip
        with Store.open(tmp_path / "log.db", create=False) as log:
            users = [r["user_id"] for r in log.log.query("select user_id from turns")]
    finally:
        store.close()
    assert chat.status_code == openai.status_code == 200
    assert users == ["u-7", "u-7"]
    assert refused.status_code == 401 and "aud" in refused.json()["error"]["message"]
