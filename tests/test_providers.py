"""Provider plumbing without a server: the factory, the key reader, the error mapping, the
Responses event accumulator. HTTP is faked with a real transport (``httpx2.MockTransport``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx2
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from chainrun.config import ProviderConfig, config_from_dict
from chainrun.errors import (
    ConfigError,
    ProviderError,
    ProviderStatusError,
    ProviderTimeout,
    ProviderUnavailable,
)
from chainrun.providers import ChatRequest, ChatStream, OpenAICompatProvider, open_provider
from chainrun.providers.openai_client import (
    AzureTarget,
    build_client,
    map_openai_error,
    read_api_key,
    retry_after_s,
)
from chainrun.providers.responses import (
    ResponseEvents,
    ResponseFailed,
    ResponsesProvider,
    response_params,
)
from chainrun.retrieval.embeddings import OpenAIEmbedder

_EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def event(kind: str, **data: Any) -> Any:
    """A typed Responses event, parsed by the openai package's own models."""
    return _EVENTS.validate_python({"type": kind, "sequence_number": 0, **data})


def response_obj(status: str = "in_progress", **fields: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": "gpt-x",
        "output": [],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        **fields,
    }


USAGE = {
    "input_tokens": 12,
    "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 20},
    "total_tokens": 42,
}


def mock_http(handler: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))


# ------------------------------------------------------------------ key reader, errors


def test_read_api_key_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINRUN_TEST_KEY", "sk-1")
    monkeypatch.delenv("CHAINRUN_MISSING_KEY", raising=False)
    assert read_api_key("CHAINRUN_TEST_KEY", field="providers.x.api_key_env") == "sk-1"
    assert read_api_key(None, field="providers.x.api_key_env") is None
    with pytest.raises(ConfigError, match=r"^providers\.x\.api_key_env: .*CHAINRUN_MISSING_KEY"):
        read_api_key("CHAINRUN_MISSING_KEY", field="providers.x.api_key_env")


def _status_error(status: int, headers: dict[str, str]) -> openai.APIStatusError:
    request = httpx2.Request("POST", "http://x/v1/chat/completions")
    response = httpx2.Response(
        status, headers=headers, request=request, json={"error": {"message": "slow down"}}
    )
    return openai.APIStatusError("slow down", response=response, body=None)


def test_retry_after_in_both_rfc_9110_forms_and_milliseconds() -> None:
    now = datetime(2026, 12, 2, 7, 0, 0, tzinfo=UTC)
    assert retry_after_s({"retry-after": "Wed, 02 Dec 2026 07:00:30 GMT"}, now=now) == 30.0
    assert retry_after_s({"retry-after": "30"}, now=now) == 30.0
    assert retry_after_s({"retry-after-ms": "250"}, now=now) == 0.25
    # a broken retry-after-ms falls back to Retry-After
    assert retry_after_s({"retry-after-ms": "nan", "retry-after": "2"}, now=now) == 2.0
    for odd in ("-5", "nan", "inf", "1e12", "soon", ""):
        assert retry_after_s({"retry-after": odd}, now=now) is None, odd


def test_error_mapping_keeps_retry_after() -> None:
    err = map_openai_error(_status_error(429, {"retry-after-ms": "1500"}), name="p", where="u")
    assert isinstance(err, ProviderStatusError)
    assert err.status == 429 and err.retry_after_s == 1.5 and err.error_type == "http_429"
    err = map_openai_error(_status_error(503, {"retry-after": "2"}), name="p", where="u")
    assert isinstance(err, ProviderStatusError) and err.retry_after_s == 2.0
    date = {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}  # long past: retry now
    err = map_openai_error(_status_error(503, date), name="p", where="u")
    assert isinstance(err, ProviderStatusError) and err.retry_after_s == 0.0
    request = httpx2.Request("POST", "http://x")
    timeout = map_openai_error(openai.APITimeoutError(request), name="p", where="u")
    assert isinstance(timeout, ProviderTimeout)
    down = map_openai_error(openai.APIConnectionError(request=request), name="p", where="u")
    assert isinstance(down, ProviderUnavailable) and str(down) == "cannot reach provider 'p' at u"
    # a stream that broke after it started reached the server: not "cannot reach"
    broke = map_openai_error(
        openai.APIConnectionError(request=request), name="p", where="u", streaming=True
    )
    assert type(broke) is ProviderError and "stream failed" in str(broke)


async def test_embeddings_client_keeps_retry_after() -> None:
    """The embeddings client maps errors through the same function (it used to drop it)."""

    def limited(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            429, headers={"retry-after": "3"}, json={"error": {"message": "rate limited"}}
        )

    client = build_client(
        base_url="http://embed.test/v1", api_key=None, http_client=mock_http(limited)
    )
    embedder = OpenAIEmbedder("http://embed.test/v1", "m", client=client)
    with pytest.raises(ProviderStatusError) as info:
        await embedder.embed(["a"])
    await embedder.aclose()
    assert info.value.status == 429 and info.value.retry_after_s == 3.0


async def test_chat_adapter_status_error_keeps_retry_after() -> None:
    def limited(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            429, headers={"retry-after-ms": "250"}, json={"error": {"message": "rate limited"}}
        )

    for cls in (OpenAICompatProvider, ResponsesProvider):
        provider = cls("p", "http://chat.test/v1", http_client=mock_http(limited))
        stream = ChatStream(
            provider, ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])
        )
        with pytest.raises(ProviderStatusError) as info:
            await stream.collect()
        await stream.aclose()
        await provider.aclose()
        assert info.value.retry_after_s == 0.25


# ------------------------------------------------------------------ factory


async def test_open_provider_closes_an_unreachable_provider_and_says_where() -> None:
    cfg = ProviderConfig(base_url="http://127.0.0.1:9/v1", api="responses")
    with pytest.raises(
        ProviderUnavailable, match=r"cannot reach provider 'r' at http://127\.0\.0\.1:9"
    ):
        await open_provider("r", cfg)


async def test_open_provider_missing_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHAINRUN_NO_SUCH_KEY", raising=False)
    cfg = ProviderConfig(base_url="http://127.0.0.1:9/v1", api_key_env="CHAINRUN_NO_SUCH_KEY")
    with pytest.raises(ConfigError, match=r"providers\.openai\.api_key_env"):
        await open_provider("openai", cfg)
    azure = ProviderConfig(
        kind="azure",
        endpoint="http://127.0.0.1:9",
        api_version="2024-10-21",
        entra_token_env="CHAINRUN_NO_SUCH_KEY",
    )
    with pytest.raises(ConfigError, match=r"providers\.az\.entra_token_env"):
        await open_provider("az", azure)


def test_azure_config_is_checked_field_by_field() -> None:
    def build(**azure: Any) -> None:
        config_from_dict({"providers": {"local": {}, "az": azure}})

    build(
        kind="azure",
        endpoint="https://r.openai.azure.com",
        api_version="2024-10-21",
        api_key_env="AZURE_OPENAI_API_KEY",
    )
    with pytest.raises(ConfigError, match=r"providers\.az: endpoint: required for kind = 'azure'"):
        build(kind="azure", api_version="2024-10-21", api_key_env="K")
    with pytest.raises(ConfigError, match="needs api_key_env or entra_token_env"):
        build(kind="azure", endpoint="https://r.openai.azure.com", api_version="2024-10-21")
    with pytest.raises(ConfigError, match=r"providers\.az: deployment: only for kind = 'azure'"):
        build(deployment="gpt")
    with pytest.raises(ConfigError, match=r"base_url: kind 'azure' takes endpoint"):
        build(
            kind="azure",
            base_url="http://x/v1",
            endpoint="https://r",
            api_version="v",
            api_key_env="K",
        )


async def test_azure_client_builds_deployment_urls_with_key_or_entra_token() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(500, json={"error": {"message": "stop here"}})

    targets = [
        (AzureTarget("https://res.openai.azure.com", "2024-10-21", "dep1"), "k-1"),
        (AzureTarget("https://res.openai.azure.com", "2024-10-21", None, "tok-1"), None),
    ]
    for target, key in targets:
        client = build_client(
            base_url=None, api_key=key, http_client=mock_http(handler), azure=target
        )
        with pytest.raises(openai.APIStatusError):
            await client.chat.completions.create(model="gpt-4o", messages=[])
        await client.close()
    key_req, token_req = seen
    assert str(key_req.url) == (
        "https://res.openai.azure.com/openai/deployments/dep1/"
        "chat/completions?api-version=2024-10-21"
    )
    assert key_req.headers["api-key"] == "k-1" and "authorization" not in key_req.headers
    # without a configured deployment the request's model names it
    assert "/openai/deployments/gpt-4o/chat/completions" in str(token_req.url)
    assert token_req.headers["authorization"] == "Bearer tok-1"


# ------------------------------------------------------------------ Responses request/events


def test_response_params_map_the_request() -> None:
    req = ChatRequest(
        model="gpt-5-mini",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        max_output_tokens=300,
        temperature=None,
        reasoning_effort="minimal",
        reasoning_summary="auto",
        json_schema={"type": "object"},
        headers={"x-request-id": "r1"},
    )
    params = response_params(req)
    assert params == {
        "model": "gpt-5-mini",
        "input": [{"role": "user", "content": "hi"}],
        "stream": True,
        "instructions": "Be brief.",
        "max_output_tokens": 300,
        "reasoning": {"effort": "minimal", "summary": "auto"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}},
        "extra_headers": {"x-request-id": "r1"},
    }
    assert "reasoning" not in response_params(ChatRequest(model="m", messages=[]))


def test_events_become_chunks_ttft_at_the_first_delta_not_at_created() -> None:
    acc = ResponseEvents("p")
    bookkeeping = [
        event("response.created", response=response_obj()),
        event("response.in_progress", response=response_obj()),
        event(
            "response.output_item.added",
            output_index=0,
            item={"type": "reasoning", "id": "rs", "summary": []},
        ),
        event(
            "response.reasoning_summary_part.added",
            item_id="rs",
            output_index=0,
            summary_index=0,
            part={"type": "summary_text", "text": ""},
        ),
    ]
    assert [acc.on_event(e, nbytes=100) for e in bookkeeping] == [None] * 4
    first = acc.on_event(
        event(
            "response.reasoning_summary_text.delta",
            item_id="rs",
            output_index=0,
            summary_index=0,
            delta="thinking",
        ),
        nbytes=50,
    )
    assert first is not None and first.reasoning == "thinking" and first.has_token
    assert first.nbytes == 450  # the bookkeeping events' bytes ride on the first chunk
    assert first.model == "gpt-x" and first.response_id == "resp_1"
    text = acc.on_event(
        event(
            "response.output_text.delta",
            item_id="m",
            output_index=1,
            content_index=0,
            delta="Hello",
            logprobs=[],
        ),
        nbytes=60,
    )
    assert text is not None and text.content == "Hello" and text.nbytes == 60
    done = acc.on_event(
        event("response.completed", response=response_obj("completed", usage=USAGE))
    )
    assert done is not None and done.finish_reason == "stop" and done.usage is not None
    u = done.usage
    assert (u.input_tokens, u.output_tokens, u.reasoning_tokens, u.cached_input_tokens) == (
        12,
        30,
        20,
        4,
    )


def test_incomplete_is_length_and_missing_usage_stays_unknown() -> None:
    acc = ResponseEvents("p")
    chunk = acc.on_event(
        event(
            "response.incomplete",
            response=response_obj(
                "incomplete", incomplete_details={"reason": "max_output_tokens"}, usage=None
            ),
        )
    )
    assert chunk is not None and chunk.finish_reason == "length" and chunk.usage is None
    other = acc.on_event(
        event(
            "response.incomplete",
            response=response_obj("incomplete", incomplete_details={"reason": "content_filter"}),
        )
    )
    assert other is not None and other.finish_reason == "content_filter"


def test_failed_and_error_events_raise_with_the_servers_message() -> None:
    acc = ResponseEvents("p")
    failed = event(
        "response.failed",
        response=response_obj(
            "failed", error={"code": "server_error", "message": "The model crashed"}
        ),
    )
    with pytest.raises(
        ResponseFailed, match=r"response failed \(server_error\): The model crashed"
    ):
        acc.on_event(failed)
    err = event(
        "error",
        code="unsupported_value",
        param="reasoning.effort",
        message="Unsupported value: 'minimal'",
    )
    with pytest.raises(ResponseFailed) as info:
        acc.on_event(err)
    assert info.value.param == "reasoning.effort" and info.value.error_type == "response_failed"
    assert "Unsupported value: 'minimal'" in str(info.value)


def _sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': i, **d})}\n\n".encode()
        for i, (kind, d) in enumerate(events)
    )


async def test_responses_adapter_over_a_mock_transport() -> None:
    """The adapter through the real SDK: events parsed, failed stream raised, body closed."""
    seen: list[dict[str, Any]] = []
    body_ok = _sse(
        ("response.created", {"response": response_obj()}),
        (
            "response.output_text.delta",
            {"item_id": "m", "output_index": 0, "content_index": 0, "delta": "Hi", "logprobs": []},
        ),
        (
            "response.output_text.delta",
            {
                "item_id": "m",
                "output_index": 0,
                "content_index": 0,
                "delta": " there",
                "logprobs": [],
            },
        ),
        ("response.completed", {"response": response_obj("completed", usage=USAGE)}),
    )
    body_failed = _sse(
        ("response.created", {"response": response_obj()}),
        (
            "response.failed",
            {"response": response_obj("failed", error={"code": "server_error", "message": "boom"})},
        ),
    )

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        body = body_failed if "fail" in request.content.decode() else body_ok
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    provider = ResponsesProvider("r", "http://resp.test/v1", http_client=mock_http(handler))
    ok = ChatStream(provider, ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}]))
    await ok.collect()
    await ok.aclose()
    t = ok.timer
    assert t.text == "Hi there" and t.finish_reason == "stop" and t.n_chunks == 3
    assert t.usage is not None and t.usage.reasoning_tokens == 20 and not t.truncated
    assert seen[0]["input"] == [{"role": "user", "content": "hi"}] and seen[0]["stream"] is True
    bad = ChatStream(
        provider, ChatRequest(model="m", messages=[{"role": "user", "content": "fail"}])
    )
    with pytest.raises(ResponseFailed, match="boom"):
        await bad.collect()
    await bad.aclose()
    await provider.aclose()
