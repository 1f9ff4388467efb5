"""Both faces of ``chainrun serve`` as a client reads their bytes: OpenAI's SSE framing
(every event ends in ``\\n\\n``), keep-alive comments only where asked, and request
parameters the OpenAI face does not honour refused by name, never answered with prose."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from serve_helpers import serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.serve.openai_face import (
    IGNORED_PARAMETERS,
    REFUSED_PARAMETERS,
    InvalidRequest,
    parse_completion_request,
)

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": "chainrun-shop", "messages": [{"role": "user", "content": "a rain jacket?"}]}


@pytest.fixture(scope="module")
def slow_lab() -> Iterator[LabServer]:
    """First token after ~300 ms, then 6 tokens: long enough for a 50 ms keep-alive."""
    with LabServer("lognormal", median_ms=300, sigma=0, n_tokens=6, per_token_ms=2) as lab:
        yield lab


def _factory(lab: LabServer, store: Store):  # type: ignore[no-untyped-def]
    cfg = config_from_dict({"providers": {"local": {"base_url": lab.base_url}}})
    return lambda: Chain(cfg, store=store, kind="live", quiet=True)


def _split_on_blank_lines(raw: bytes) -> list[bytes]:
    """What a client that splits the body on ``\\n\\n`` reads (several OpenAI clients do)."""
    return [part for part in raw.split(b"\n\n") if part.strip()]


async def _raw(client: httpx.AsyncClient, path: str, body: dict) -> bytes:
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        return await r.aread()


async def test_both_faces_frame_events_as_openai_does(slow_lab: LabServer, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "log.db")
    async with (
        serving(_factory(slow_lab, store), chat_keepalive_s=None) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        v1 = await _raw(client, "/v1/chat/completions", {**BASE, "stream": True})
        chat = await _raw(client, "/chat", {"message": "a rain jacket?"})
    store.close()
    for raw in (v1, chat):
        assert b"\r" not in raw  # no \r\n line ends anywhere
        assert raw.endswith(b"\n\n")
    events = _split_on_blank_lines(v1)
    # every piece a \n\n-splitting client reads is one whole `data:` event
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events)
    assert events[-1] == b"data: [DONE]"
    assert len(events) >= 4  # role, several content chunks, the finish chunk, [DONE]
    chat_events = _split_on_blank_lines(chat)
    assert all(re.fullmatch(rb"event: \w+\ndata: .+", e, re.S) for e in chat_events)
    assert chat_events[0].startswith(b"event: turn_started")
    assert chat_events[-1].startswith(b"event: turn")


async def test_keepalive_comments_only_where_asked(slow_lab: LabServer, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "log.db")
    async with (
        serving(_factory(slow_lab, store), chat_keepalive_s=0.05) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        v1 = await _raw(client, "/v1/chat/completions", {**BASE, "stream": True})
        chat = await _raw(client, "/chat", {"message": "a rain jacket?"})
    async with (
        serving(_factory(slow_lab, store), v1_keepalive_s=0.05) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        v1_asked = await _raw(client, "/v1/chat/completions", {**BASE, "stream": True})
    store.close()
    assert b"\n:" not in b"\n" + v1  # the OpenAI face sends no comment line by default
    assert re.search(rb"(^|\n): ping", chat)  # /chat keeps its keep-alives (configurable)
    assert re.search(rb"(^|\n): ping", v1_asked)


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("response_format", {"type": "json_object"}),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
        ("n", 2),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "required"),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("modalities", ["text", "audio"]),
    ],
)
def test_parameters_the_face_does_not_honour_are_refused_by_name(param: str, value: object) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_completion_request({**BASE, param: value}, "chainrun-shop")
    assert (e.value.param, e.value.status, e.value.code) == (param, 400, "unsupported_parameter")


def test_harmless_values_and_ignored_parameters_are_taken() -> None:
    harmless = {
        "n": 1, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
        "logprobs": False, "modalities": ["text"], "temperature": 0.2, "seed": 7,
    }  # fmt: skip
    assert parse_completion_request({**BASE, **harmless}, "chainrun-shop").asked.message


async def test_response_format_through_the_real_client_is_a_400(
    slow_lab: LabServer, tmp_path: Path
) -> None:
    """The real ``openai`` client sees ``BadRequestError`` naming ``response_format``, and
    no turn runs (nothing is logged)."""
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(slow_lab, store)) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            for stream in (False, True):
                with pytest.raises(openai.BadRequestError) as e:
                    await client.chat.completions.create(
                        model="chainrun-shop", messages=BASE["messages"], stream=stream,
                        response_format={"type": "json_object"},
                    )  # fmt: skip
                assert e.value.param == "response_format"
                assert e.value.code == "unsupported_parameter"
    assert store.turns(store.latest_run_id() or 0) == []
    store.close()


def test_the_serving_guide_lists_every_refused_and_ignored_parameter() -> None:
    guide = (ROOT / "docs" / "guides" / "serving.md").read_text()
    for name in (*REFUSED_PARAMETERS, *IGNORED_PARAMETERS):
        assert f"`{name}`" in guide, name
