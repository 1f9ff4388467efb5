"""Compatibility with the real client libraries shops use, through ``chainrun serve``.

Each client is run against the serve app on loopback (the latency lab as the model
server, a real HTTP server in a subprocess): streamed and not, its usage, an error, a
cancel and a two-turn chat with its prompt-cache state, on the Chat Completions face and
the Responses face. The Python clients (openai-python, LangChain's ``ChatOpenAI``,
LiteLLM) come from the ``test`` extra; the JavaScript ones (openai-node, the Vercel AI
SDK) from ``tests/clients/package.json`` (``npm ci`` there, as ``.ci/run`` does): each
case runs a script there with node (``tests/clients/*.mjs``) that prints what the client
saw as one JSON line, and this module asserts on it and on the server's log. A case
whose client is not installed is skipped naming what to install (under ``CI`` it fails).

The client section of ``docs/reference/compatibility.md`` is made from the results of
this module's run (:func:`section`: each case, its client's version, and whether it
works): ``CHAINRUN_WRITE_COMPATIBILITY=1 python -m pytest tests/test_compatibility.py``
writes it; without that, the last test fails while the page lists other cases, or
another result for a case that ran.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.metadata
import json
import os
import shutil
import warnings
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic.warnings import PydanticDeprecationWarning
from serve_helpers import serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "compatibility.md"
MODEL = "chainrun-shop"
#: the JavaScript clients: package.json, package-lock.json, the scripts and (after
#: ``npm ci``) node_modules
CLIENTS = ROOT / "tests" / "clients"
#: each client's packages, as the page names their versions: (registry, name)
PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "openai-python": (("pypi", "openai"),),
    "LangChain ChatOpenAI": (("pypi", "langchain-openai"),),
    "LiteLLM": (("pypi", "litellm"),),
    "openai-node": (("npm", "openai"),),
    "AI SDK, @ai-sdk/openai-compatible": (("npm", "ai"), ("npm", "@ai-sdk/openai-compatible")),
    "AI SDK, default openai(model)": (("npm", "ai"), ("npm", "@ai-sdk/openai")),
}
#: each case's result in this run: (client, API, what) -> "works", "fails" or
#: "not run: why" (:func:`test_client` records it, :func:`section` writes it)
RESULTS: dict[tuple[str, str, str], str] = {}


def version(registry: str, name: str) -> str | None:
    """The installed version of a PyPI distribution or an npm package under
    :data:`CLIENTS` (None: not installed)."""
    if registry == "pypi":
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None
    manifest = CLIENTS / "node_modules" / name / "package.json"
    if not manifest.is_file():
        return None
    return str(json.loads(manifest.read_text(encoding="utf-8"))["version"])


def missing(why: str) -> None:
    """Skip the case naming what to install; under ``CI`` (``.ci/run`` installs every
    client) a missing client is a failure."""
    if os.environ.get("CI"):
        raise AssertionError(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    """Answers in a few ms; records each request's messages and prompt_cache_key."""
    with LabServer("fast", n_tokens=6, per_token_ms=1, record_bodies=True) as lab:
        yield lab


@pytest.fixture(scope="module")
def slow_lab() -> Iterator[LabServer]:
    """40 tokens 25 ms apart: long enough to leave mid-answer."""
    with LabServer("fast", n_tokens=40, per_token_ms=25) as lab:
        yield lab


class Served:
    """One case's server: its base URL, its log and the lab behind it."""

    def __init__(self, url: str, store: Store, lab: LabServer) -> None:
        self.url, self.store, self.lab = url, store, lab
        self.client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        #: HTTP clients a case gave its client library, closed after the case
        self.http: list[httpx.AsyncClient] = []

    def turns(self) -> list[Any]:
        return self.store.turns([r.id for r in self.store.runs_of_kind("live")])

    async def logged(self, n: int) -> list[Any]:
        """The log's turns once ``n`` are there (a streamed turn is logged after its end)."""
        for _ in range(300):
            turns = self.turns()
            if len(turns) >= n:
                return turns
            await asyncio.sleep(0.02)
        raise AssertionError(f"expected {n} logged turns")

    async def node(self, script: str, *args: str) -> dict[str, Any]:
        """What ``node tests/clients/SCRIPT URL ARGS...`` saw: its last stdout line as JSON
        (the script fails on anything its client raised that the case did not expect)."""
        if shutil.which("node") is None:
            missing("node is not installed (apt-get install -y nodejs npm)")
        if not (CLIENTS / "node_modules").is_dir():
            missing("the JavaScript clients are not installed (cd tests/clients && npm ci)")
        proc = await asyncio.create_subprocess_exec(
            "node", script, self.url, *args, cwd=CLIENTS,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
        return dict(json.loads(out.decode().strip().splitlines()[-1]))

    async def one_cache(self) -> None:
        """The two turns just made went to the model with one prompt-cache key, and the
        log holds them as one conversation's turns 1 and 2."""
        keys = {r["prompt_cache_key"] for r in self.lab.requests()}
        assert len(keys) == 1 and None not in keys, keys
        t1, t2 = await self.logged(2)
        assert t1.conversation_id == t2.conversation_id and t2.turn_index == 2

    async def cancelled(self) -> None:
        """The one turn made was logged ``cancelled`` (the client's cancel reached it)."""
        (turn,) = await self.logged(1)
        assert turn.status == "cancelled"


Case = Callable[[Served], Awaitable[None]]
#: (client, API, what is tried) -> the case
CASES: dict[tuple[str, str, str], Case] = {}


def case(client: str, api: str, what: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[(client, api, what)] = fn
        return fn
    return register


USER = [{"role": "user", "content": "a rain jacket?"}]


@case("openai-python", "Chat Completions", "not streamed, usage")
async def _chat_whole(s: Served) -> None:
    done = await s.client.chat.completions.create(model=MODEL, messages=USER)  # type: ignore[arg-type]
    assert done.choices[0].message.content and done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.prompt_tokens > 0
    assert done.usage.completion_tokens > 0


@case("openai-python", "Chat Completions", "streamed, usage")
async def _chat_stream(s: Served) -> None:
    stream = await s.client.chat.completions.create(
        model=MODEL, messages=USER, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True})  # fmt: skip
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0


@case("openai-python", "Chat Completions", "an error (unknown model)")
async def _chat_error(s: Served) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        await s.client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    assert e.value.code == "model_not_found"


@case("openai-python", "Chat Completions", "a cancel (the stream closed mid-answer)")
async def _chat_cancel(s: Served) -> None:
    stream = await s.client.chat.completions.create(model=MODEL, messages=USER,  # type: ignore[arg-type]
                                                    stream=True)  # fmt: skip
    async for c in stream:
        if c.choices and c.choices[0].delta.content:
            break
    await stream.close()
    await s.cancelled()


@case("openai-python", "Chat Completions", "two turns, one prompt cache")
async def _chat_two_turns(s: Served) -> None:
    thread: list[dict[str, str]] = [*USER]
    done = await s.client.chat.completions.create(model=MODEL, messages=thread)  # type: ignore[arg-type]
    thread += [{"role": "assistant", "content": done.choices[0].message.content or ""},
               {"role": "user", "content": "in blue?"}]  # fmt: skip
    await s.client.chat.completions.create(model=MODEL, messages=thread)  # type: ignore[arg-type]
    await s.one_cache()


@case("openai-python", "Responses", "not streamed, usage")
async def _responses_whole(s: Served) -> None:
    done = await s.client.responses.create(model=MODEL, input="a rain jacket?")
    assert done.status == "completed" and done.output_text
    assert done.usage is not None and done.usage.input_tokens > 0
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens


@case("openai-python", "Responses", "streamed, usage")
async def _responses_stream(s: Served) -> None:
    stream = await s.client.responses.create(model=MODEL, input="a rain jacket?", stream=True)
    events = [e async for e in stream]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].type == "response.completed"
    assert events[-1].response.output_text == text
    assert events[-1].response.usage is not None
    assert events[-1].response.usage.input_tokens > 0


@case("openai-python", "Responses", "an error (unknown previous_response_id)")
async def _responses_error(s: Served) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        await s.client.responses.create(model=MODEL, input="x", previous_response_id="resp_x")
    assert e.value.code == "previous_response_not_found"


@case("openai-python", "Responses", "a cancel (the stream closed mid-answer)")
async def _responses_cancel(s: Served) -> None:
    stream = await s.client.responses.create(model=MODEL, input="a rain jacket?", stream=True)
    async for e in stream:
        if e.type == "response.output_text.delta":
            break
    await stream.close()
    await s.cancelled()


@case("openai-python", "Responses", "two turns (previous_response_id), one prompt cache")
async def _responses_two_turns(s: Served) -> None:
    first = await s.client.responses.create(model=MODEL, input="a rain jacket?")
    await s.client.responses.create(model=MODEL, input="in blue?", previous_response_id=first.id)
    await s.one_cache()


def _langchain(s: Served, api: str, model: str = MODEL) -> Any:
    """LangChain's ``ChatOpenAI`` on the face of ``api`` (``use_responses_api`` for the
    Responses face), usage asked for on streams."""
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        missing("langchain-openai is not installed (pip install -e '.[test]')")
    s.http.append(httpx.AsyncClient())  # closed after the case (LangChain keeps its own open)
    return ChatOpenAI(base_url=f"{s.url}/v1", api_key="x", model=model,  # type: ignore[arg-type]
                      max_retries=0, stream_usage=True, http_async_client=s.http[-1],
                      use_responses_api=api == "Responses")  # fmt: skip


def _usage_metadata(message: Any) -> None:
    u = message.usage_metadata
    assert u is not None and u["input_tokens"] > 0 and u["output_tokens"] > 0, u
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"], u


def _langchain_cases(api: str) -> None:
    """Registers the five cases of LangChain's ``ChatOpenAI`` on one API."""

    @case("LangChain ChatOpenAI", api, "not streamed, usage")
    async def whole(s: Served) -> None:
        done = await _langchain(s, api).ainvoke("a rain jacket?")
        assert done.text
        if api == "Responses":
            assert done.response_metadata["status"] == "completed", done.response_metadata
        else:
            assert done.response_metadata["finish_reason"] == "stop", done.response_metadata
        _usage_metadata(done)

    @case("LangChain ChatOpenAI", api, "streamed, usage")
    async def stream(s: Served) -> None:
        whole: Any = None
        async for chunk in _langchain(s, api).astream("a rain jacket?"):
            whole = chunk if whole is None else whole + chunk
        assert whole is not None and whole.text
        _usage_metadata(whole)

    @case("LangChain ChatOpenAI", api, "an error (unknown model)")
    async def error(s: Served) -> None:
        with pytest.raises(openai.NotFoundError) as e:  # LangChain raises the openai client's
            await _langchain(s, api, "gpt-4o").ainvoke("a rain jacket?")
        assert e.value.code == "model_not_found"

    @case("LangChain ChatOpenAI", api, "a cancel (the stream closed mid-answer)")
    async def cancel(s: Served) -> None:
        stream = _langchain(s, api).astream("a rain jacket?")
        async for chunk in stream:
            if chunk.text:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        await s.cancelled()

    @case("LangChain ChatOpenAI", api, "two turns, one prompt cache")
    async def two_turns(s: Served) -> None:
        llm = _langchain(s, api)
        first = await llm.ainvoke([("user", "a rain jacket?")])
        await llm.ainvoke([("user", "a rain jacket?"), first, ("user", "in blue?")])
        await s.one_cache()


for _api in ("Chat Completions", "Responses"):
    _langchain_cases(_api)


def _litellm() -> Any:
    """LiteLLM as a client (``litellm.acompletion``, the ``openai/`` provider), its model
    cost map read from its own package (it fetches one from GitHub otherwise)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError:
        missing("litellm is not installed (pip install -e '.[test]')")
    litellm.suppress_debug_info = True
    return litellm


async def _litellm_call(s: Served, model: str = MODEL, **options: Any) -> Any:
    return await _litellm().acompletion(
        model=f"openai/{model}", api_base=f"{s.url}/v1", api_key="x", num_retries=0,
        **{"messages": USER, **options},
    )  # fmt: skip


@case("LiteLLM", "Chat Completions", "not streamed, usage")
async def _litellm_whole(s: Served) -> None:
    done = await _litellm_call(s)
    assert done.choices[0].message.content and done.choices[0].finish_reason == "stop"
    assert done.usage.prompt_tokens > 0 and done.usage.completion_tokens > 0


@case("LiteLLM", "Chat Completions", "streamed, usage")
async def _litellm_stream(s: Served) -> None:
    stream = await _litellm_call(s, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = getattr(chunks[-1], "usage", None)
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0


@case("LiteLLM", "Chat Completions", "an error (unknown model)")
async def _litellm_error(s: Served) -> None:
    litellm = _litellm()
    with pytest.raises(litellm.NotFoundError) as e:
        await _litellm_call(s, "gpt-4o")
    assert e.value.status_code == 404 and "does not exist" in e.value.message  # its text only


@case("LiteLLM", "Chat Completions", "a cancel (the stream closed mid-answer)")
async def _litellm_cancel(s: Served) -> None:
    stream = await _litellm_call(s, stream=True)
    async for c in stream:
        if c.choices and c.choices[0].delta.content:
            break
    await stream.aclose()
    await s.cancelled()


@case("LiteLLM", "Chat Completions", "two turns, one prompt cache")
async def _litellm_two_turns(s: Served) -> None:
    first = await _litellm_call(s)
    thread = [*USER, {"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "in blue?"}]  # fmt: skip
    await _litellm_call(s, messages=thread)
    await s.one_cache()


#: the JavaScript clients' cases: (client, API) -> (script, its API argument, the path
#: the client must have asked for, the error code the error case gets)
NODE_CASES = {
    ("openai-node", "Chat Completions"):
        ("openai_node.mjs", "chat", "/v1/chat/completions", "model_not_found"),
    ("openai-node", "Responses"):
        ("openai_node.mjs", "responses", "/v1/responses", "previous_response_not_found"),
    ("AI SDK, @ai-sdk/openai-compatible", "Chat Completions"):
        ("ai_sdk.mjs", "compatible", "/v1/chat/completions", "model_not_found"),
    ("AI SDK, default openai(model)", "Responses"):
        ("ai_sdk.mjs", "openai", "/v1/responses", "model_not_found"),
}  # fmt: skip


def _node_cases(client: str, api: str) -> None:
    """Registers the five cases of one JavaScript client on one API (:data:`NODE_CASES`)."""
    script, arg, path, code = NODE_CASES[(client, api)]

    def usage_of(seen: dict[str, Any]) -> None:
        u = seen["usage"]
        assert u["input"] > 0 and u["output"] > 0 and u["total"] == u["input"] + u["output"], u

    @case(client, api, "not streamed, usage")
    async def whole(s: Served) -> None:
        seen = await s.node(script, arg, "whole")
        assert seen["text"] and seen["paths"] == [path], seen
        assert seen.get("finish", "stop") == "stop", seen
        assert seen.get("status", "completed") == "completed", seen  # openai-node's Responses
        usage_of(seen)

    @case(client, api, "streamed, usage")
    async def stream(s: Served) -> None:
        seen = await s.node(script, arg, "stream")
        assert seen["text"] and seen["paths"] == [path] and not seen.get("error"), seen
        assert seen.get("finish", "stop") == "stop"
        if "last" in seen:  # openai-node's Responses events
            assert seen["last"] == "response.completed" and seen["done"] == seen["text"], seen
        usage_of(seen)

    what = ("an error (unknown previous_response_id)" if "previous" in code
            else "an error (unknown model)")  # fmt: skip

    @case(client, api, what)
    async def error(s: Served) -> None:
        seen = await s.node(script, arg, "error")
        assert seen["status"] == 404, seen
        if "code" in seen:  # openai-node's APIError
            assert seen["code"] == code and len(seen["requestId"] or "") == 32, seen
        else:  # the AI SDK's APICallError: the body as the server sent it
            assert json.loads(seen["body"])["error"]["code"] == code, seen

    @case(client, api, "a cancel (the stream closed mid-answer)")
    async def cancel(s: Served) -> None:
        seen = await s.node(script, arg, "cancel")
        assert seen["text"], seen
        await s.cancelled()

    two = ("two turns (previous_response_id), one prompt cache"
           if script == "openai_node.mjs" and api == "Responses"
           else "two turns, one prompt cache")  # fmt: skip

    @case(client, api, two)
    async def two_turns(s: Served) -> None:
        seen = await s.node(script, arg, "two-turns")
        assert all(seen["texts"]) and seen["paths"] == [path, path], seen
        usage_of(seen)
        await s.one_cache()


for _client, _api in NODE_CASES:
    _node_cases(_client, _api)


@pytest.mark.parametrize("key", list(CASES), ids=[" / ".join(k) for k in CASES])
async def test_client(key: tuple[str, str, str], lab, slow_lab, tmp_path) -> None:
    cancel = key[2].startswith("a cancel")
    used = slow_lab if cancel else lab
    used.reset()
    # a cancel needs the answer token by token (the grounding check releases sentences)
    steps = {"compose": {"grounding": {"enabled": False}}} if cancel else {}
    cfg = config_from_dict({"providers": {"local": {"base_url": used.base_url,
                                                    "prompt_cache": "key"}},
                            "steps": steps})  # fmt: skip
    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(cfg, store=store, kind="live", quiet=True)) as (url, _):
            served = Served(url, store, used)
            async with served.client:
                with warnings.catch_warnings():
                    # what pydantic says of LiteLLM's own types as LiteLLM reads a
                    # stream (raised as errors here, they would fail its stream)
                    warnings.filterwarnings("ignore", "Item .* `ReadOnly` qualifier",
                                            UserWarning)  # fmt: skip
                    warnings.filterwarnings("ignore", category=PydanticDeprecationWarning)
                    try:
                        await CASES[key](served)
                    finally:
                        for http in served.http:
                            await http.aclose()
                        if key[0] == "LiteLLM":  # its cached clients, bound to this loop
                            await _litellm().close_litellm_async_clients()
                            _litellm().in_memory_llm_clients_cache.flush_cache()
    except pytest.skip.Exception as e:
        RESULTS[key] = f"not run: {e.msg}"
        raise
    except BaseException:
        RESULTS[key] = "fails"
        raise
    finally:
        store.close()
    RESULTS[key] = "works"


START, END = "<!-- clients: generated -->\n", "\n<!-- end of clients -->"
#: the first line of the section: how it was made (the date filled in)
MADE = ("Made on {date} by `CHAINRUN_WRITE_COMPATIBILITY=1 python -m pytest "
        "tests/test_compatibility.py`, with the clients' versions installed then.")
HEADER = "| client | version | API | tried | result |"


def rows(section_text: str) -> dict[tuple[str, str, str], tuple[str, str]]:
    """A section's table: (client, API, tried) -> (version, result)."""
    out = {}
    for line in section_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and line.startswith("| ") and line != HEADER:
            client, ver, api, what, result = cells
            out[(client, api, what)] = (ver, result)
    return out


def section(committed: dict[tuple[str, str, str], tuple[str, str]], date: str) -> str:
    """The client section of ``docs/reference/compatibility.md`` (between :data:`START`
    and :data:`END`): every case of :data:`CASES`, with its result in this run
    (:data:`RESULTS`) and its client's installed version, or as ``committed`` holds it
    for a case this run did not try."""
    lines = [MADE.format(date=date), "", HEADER, "|---|---|---|---|---|"]
    for key in CASES:
        client, api, what = key
        if key in RESULTS:
            found = [version(*pkg) for pkg in PACKAGES[client]]
            ver = ", ".join(f"{name} {v}" for (_, name), v in zip(PACKAGES[client], found,
                                                                  strict=True) if v)  # fmt: skip
            result = RESULTS[key]
        else:
            ver, result = committed.get(key, ("", "not run"))
        lines.append(f"| {client} | {ver or 'not installed'} | {api} | {what} | {result} |")
    return "\n".join(lines)


def test_the_compatibility_page_is_current() -> None:
    """Runs after :func:`test_client` (pytest keeps a module's order): the page lists
    every case, and each case this run tried has the result the page says."""
    text = PAGE.read_text(encoding="utf-8")
    assert START in text and END in text, f"{PAGE} has no client section"
    head, _, rest = text.partition(START)
    committed_text, _, tail = rest.partition(END)
    committed = rows(committed_text)
    if os.environ.get("CHAINRUN_WRITE_COMPATIBILITY") == "1":
        date = datetime.datetime.now(datetime.UTC).date().isoformat()
        PAGE.write_text(head + START + section(committed, date) + END + tail, encoding="utf-8")
        return
    hint = "run: CHAINRUN_WRITE_COMPATIBILITY=1 python -m pytest tests/test_compatibility.py"
    assert list(committed) == list(CASES), hint
    for key, result in RESULTS.items():
        if not result.startswith("not run"):
            assert committed[key][1] == result, (key, committed[key], result, hint)
