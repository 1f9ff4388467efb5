"""Adapter for OpenAI's Responses API (``POST /v1/responses``) over the ``openai`` SDK.

The request (:func:`response_params`): system messages become ``instructions``, the
other messages ``input`` (tool calls and results as ``function_call`` and
``function_call_output`` items, tools as function tools); ``reasoning_effort`` is sent
as ``reasoning={"effort": ...}`` (with ``"summary"`` when the step asks for a reasoning
summary), the token cap as ``max_output_tokens`` (visible plus reasoning tokens), a JSON Schema as
``text={"format": {"type": "json_schema", ...}}``. The Responses API has no ``stop``
and no ``seed``, so they are not sent: a chain step that sets them is refused before
any call (:mod:`chainrun.config.capabilities`); the eval grader's pinned seed goes unsent there.

The stream is typed SSE events (``openai.types.responses``), turned into the same
normalised :class:`~chainrun.timing.Chunk` objects as Chat Completions so that the
same :class:`~chainrun.timing.StreamTimer` measures both (:class:`ResponseEvents`, a
pure accumulator):

- ``response.output_text.delta`` → content; ``response.reasoning_summary_text.delta``
  and ``response.reasoning_text.delta`` → reasoning. These are the chunks: TTFT is the
  first of them, chunk gaps are the gaps between them (``response.created``,
  ``response.in_progress`` and the other bookkeeping events are no tokens: their
  bytes and the response's model and id ride on the next chunk).
- The terminal ``response.completed`` (finish reason ``stop``) or ``response.incomplete``
  (``incomplete_details.reason``; ``max_output_tokens`` → ``length``) is one more
  chunk carrying the usage: ``input_tokens``, ``input_tokens_details.cached_tokens``,
  ``output_tokens`` (includes reasoning) and ``output_tokens_details.reasoning_tokens``.
- A ``function_call`` output item (``response.output_item.added``: its ``call_id`` and
  ``name``) and its ``response.function_call_arguments.delta`` pieces are tool-call
  chunks, indexed by ``output_index``; an answer that called a function completes with
  finish reason ``tool_calls``.
- ``response.failed`` and ``error`` events raise :class:`ResponseFailed` with the
  server's message. A stream that ends without a terminal event is truncated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai

from chainrun.errors import ProviderError
from chainrun.providers.base import ChatRequest
from chainrun.providers.openai_client import OpenAIClientProvider
from chainrun.timing import Chunk, ToolCallDelta, Usage

#: ``incomplete_details.reason`` → the Chat Completions finish reason of the same meaning
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}

_CONTENT_EVENTS = frozenset({"response.output_text.delta", "response.refusal.delta"})
_REASONING_EVENTS = frozenset(
    {"response.reasoning_summary_text.delta", "response.reasoning_text.delta"}
)


class ResponseFailed(ProviderError):
    """The server ended a Responses stream with ``response.failed`` or an ``error`` event.

    Attributes:
        code: the server's error code (e.g. ``server_error``), when it sent one.
        param: the request parameter the error names, when it named one.
    """

    error_type = "response_failed"

    def __init__(self, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


def input_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Responses ``input`` for Chat Completions messages (system ones go to
    ``instructions``): an assistant message's ``tool_calls`` become ``function_call``
    items, a ``tool`` message a ``function_call_output`` (OpenAI API reference,
    "Function calling")."""
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer"):
            continue
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"),
                          "output": m.get("content") or ""})  # fmt: skip
            continue
        calls = m.get("tool_calls") if role == "assistant" else None
        if m.get("content") or not calls:
            items.append({"role": role, "content": m.get("content") or ""})
        for c in calls or ():
            fn = c.get("function") or {}
            items.append({"type": "function_call", "call_id": c.get("id"),
                          "name": fn.get("name"),
                          "arguments": fn.get("arguments") or ""})  # fmt: skip
    return items


def response_params(request: ChatRequest) -> dict[str, Any]:
    """The ``client.responses.create`` keyword arguments for ``request`` (always streamed)."""
    system = [m["content"] for m in request.messages if m.get("role") in ("system", "developer")]
    params: dict[str, Any] = {
        "model": request.model,
        "input": input_items(request.messages),
        "stream": True,
    }
    if request.tools:
        params["tools"] = [{"type": "function", **t} for t in request.tools]
        if request.tool_choice is not None:
            params["tool_choice"] = request.tool_choice
    if system:
        params["instructions"] = "\n\n".join(system)
    if request.max_output_tokens is not None:
        params["max_output_tokens"] = request.max_output_tokens
    if request.temperature is not None:
        params["temperature"] = request.temperature
    reasoning: dict[str, Any] = {}
    if request.reasoning_effort is not None:
        reasoning["effort"] = request.reasoning_effort
    if request.reasoning_summary is not None:
        reasoning["summary"] = request.reasoning_summary
    if reasoning:
        params["reasoning"] = reasoning
    if request.json_schema is not None:
        params["text"] = {
            "format": {"type": "json_schema", "name": "answer", "schema": request.json_schema}
        }
    if request.headers:
        params["extra_headers"] = request.headers
    return params


def _usage(u: Any) -> Usage | None:
    if u is None:
        return None
    out_details = getattr(u, "output_tokens_details", None)
    in_details = getattr(u, "input_tokens_details", None)
    return Usage(
        input_tokens=getattr(u, "input_tokens", None),
        output_tokens=getattr(u, "output_tokens", None),
        reasoning_tokens=getattr(out_details, "reasoning_tokens", None),
        cached_input_tokens=getattr(in_details, "cached_tokens", None),
    )


class ResponseEvents:
    """Turns Responses stream events into chunks (pure: no I/O).

    Feed each event with :meth:`on_event` (and the bytes it took on the wire); it
    returns the :class:`Chunk` to time, or None for a bookkeeping event.

    Raises (from :meth:`on_event`):
        ResponseFailed: a ``response.failed`` or ``error`` event.
    """

    def __init__(self, provider_name: str) -> None:
        self.name = provider_name
        self._model: str | None = None
        self._id: str | None = None
        self._pending_bytes = 0
        self.events = 0
        #: a function_call item was seen: the answer's finish reason is "tool_calls"
        self._called = False

    def _chunk(self, nbytes: int, **fields: Any) -> Chunk:
        chunk = Chunk(
            model=self._model, response_id=self._id, nbytes=self._pending_bytes + nbytes, **fields
        )
        self._pending_bytes = 0
        return chunk

    def on_event(self, event: Any, nbytes: int = 0) -> Chunk | None:
        """The chunk for one event (None: not a token, finish or usage event)."""
        self.events += 1
        kind = getattr(event, "type", None)
        response = getattr(event, "response", None)
        if response is not None:
            self._model = getattr(response, "model", None) or self._model
            self._id = getattr(response, "id", None) or self._id
        if kind in _CONTENT_EVENTS:
            return self._chunk(nbytes, content=event.delta)
        if kind in _REASONING_EVENTS:
            return self._chunk(nbytes, reasoning=event.delta)
        if kind == "response.output_item.added":
            item = getattr(event, "item", None)
            if getattr(item, "type", None) == "function_call":
                self._called = True
                delta = ToolCallDelta(
                    index=int(getattr(event, "output_index", 0) or 0),
                    id=getattr(item, "call_id", None) or None,
                    name=getattr(item, "name", None) or None,
                    arguments=getattr(item, "arguments", None) or "",
                )
                return self._chunk(nbytes, tool_calls=(delta,))
        if kind == "response.function_call_arguments.delta":
            delta = ToolCallDelta(index=int(getattr(event, "output_index", 0) or 0),
                                  arguments=getattr(event, "delta", None) or "")  # fmt: skip
            return self._chunk(nbytes, tool_calls=(delta,))
        if kind == "response.completed":
            usage = _usage(getattr(response, "usage", None))
            finish = "tool_calls" if self._called else "stop"
            return self._chunk(nbytes, finish_reason=finish, usage=usage)
        if kind == "response.incomplete":
            details = getattr(response, "incomplete_details", None)
            reason = getattr(details, "reason", None) or "incomplete"
            return self._chunk(
                nbytes,
                finish_reason=INCOMPLETE_REASONS.get(reason, reason),
                usage=_usage(getattr(response, "usage", None)),
            )
        if kind == "response.failed":
            err = getattr(response, "error", None)
            code = getattr(err, "code", None)
            message = getattr(err, "message", None) or "response failed"
            raise ResponseFailed(
                f"{self.name}: response failed ({code or 'no code'}): {message}",
                code=code,
                param=getattr(err, "param", None),
            )
        if kind == "error":
            code = getattr(event, "code", None)
            raise ResponseFailed(
                f"{self.name}: error event ({code or 'no code'}): "
                f"{getattr(event, 'message', None) or 'no message'}",
                code=code,
                param=getattr(event, "param", None),
            )
        self._pending_bytes += nbytes
        return None


#: a response object with the fields servers send (each typed field's model is built by
#: the SDK the first time it parses a value for it)
_SAMPLE_RESPONSE: dict[str, Any] = {
    "id": "warm", "object": "response", "created_at": 0, "status": "in_progress",
    "model": "warm", "output": [], "parallel_tool_calls": False, "tool_choice": "auto",
    "tools": [], "error": None, "incomplete_details": None, "usage": None,
    "instructions": None, "metadata": {}, "temperature": 1.0, "top_p": 1.0,
    "max_output_tokens": None, "previous_response_id": None, "truncation": "disabled",
    "text": {"format": {"type": "text"}}, "reasoning": {"effort": None, "summary": None},
    "user": None, "service_tier": "default", "store": True,
}  # fmt: skip

#: one event of each kind a Responses stream sends, for :func:`warm_sdk` (the SDK builds
#: each union member's model the first time it parses one)
_SAMPLE_EVENTS: tuple[dict[str, Any], ...] = (
    {"type": "response.created", "sequence_number": 0, "response": _SAMPLE_RESPONSE},
    {"type": "response.in_progress", "sequence_number": 1, "response": _SAMPLE_RESPONSE},
    {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
     "item": {"type": "message", "id": "m", "status": "in_progress", "role": "assistant",
              "content": []}},
    {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
     "item": {"type": "reasoning", "id": "r", "summary": []}},
    {"type": "response.content_part.added", "sequence_number": 3, "output_index": 0,
     "content_index": 0, "item_id": "m",
     "part": {"type": "output_text", "text": "", "annotations": []}},
    {"type": "response.reasoning_summary_part.added", "sequence_number": 3, "output_index": 0,
     "summary_index": 0, "item_id": "r", "part": {"type": "summary_text", "text": ""}},
    {"type": "response.reasoning_summary_text.delta", "sequence_number": 4, "output_index": 0,
     "summary_index": 0, "item_id": "r", "delta": "w"},
    {"type": "response.output_text.delta", "sequence_number": 4, "output_index": 0,
     "content_index": 0, "item_id": "m", "delta": "w", "logprobs": []},
    {"type": "response.output_text.done", "sequence_number": 5, "output_index": 0,
     "content_index": 0, "item_id": "m", "text": "w", "logprobs": []},
    {"type": "response.content_part.done", "sequence_number": 6, "output_index": 0,
     "content_index": 0, "item_id": "m",
     "part": {"type": "output_text", "text": "w", "annotations": []}},
    {"type": "response.output_item.done", "sequence_number": 7, "output_index": 0,
     "item": {"type": "message", "id": "m", "status": "completed", "role": "assistant",
              "content": [{"type": "output_text", "text": "w", "annotations": []}]}},
    {"type": "response.completed", "sequence_number": 8, "response": {
        **_SAMPLE_RESPONSE, "status": "completed",
        "output": [{"type": "reasoning", "id": "r", "summary": [
                        {"type": "summary_text", "text": "w"}]},
                   {"type": "message", "id": "m", "status": "completed",
                    "role": "assistant", "content": [
                        {"type": "output_text", "text": "w", "annotations": []}]}],
        "usage": {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": 2}}},
    {"type": "response.incomplete", "sequence_number": 8, "response": {
        **_SAMPLE_RESPONSE, "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"}}},
)  # fmt: skip


@functools.cache
def warm_event_models() -> None:
    """Let the SDK build its models for the stream-event union once per process.

    The first event of each kind the SDK parses costs CPU once (measured on this
    project's 2-core machine, openai 3.57: ``construct_type`` of a ``response.created``
    event 0.999 s the first time, under 1 ms after; 12 ms for the first
    ``response.output_item.added``). Paid inside a call, it would land in that call's
    TTFT and chunk gaps. Best effort: it uses the SDK's private parser and does nothing
    if that moved.
    """
    with contextlib.suppress(Exception):
        from openai._models import construct_type
        from openai.types.responses import ResponseStreamEvent

        for value in _SAMPLE_EVENTS:
            construct_type(type_=ResponseStreamEvent, value=value)


@functools.cache
def _warm_request_path() -> None:
    """The SDK's one-off work on the request side, once per process: the import of its
    ``responses`` resource (the client's ``responses`` attribute imports it lazily:
    0.47 s measured on a loaded 2-core machine) and the type tables of its request
    transform. Best effort, as :func:`warm_event_models`."""
    with contextlib.suppress(Exception):
        import openai.resources.responses  # noqa: F401
        from openai._utils import maybe_transform
        from openai.types.responses import response_create_params

        sample = response_params(ChatRequest(
            model="warm", messages=[{"role": "system", "content": "s"},
                                    {"role": "user", "content": "u"}],
            max_output_tokens=1, temperature=0.0, reasoning_effort="low",
            reasoning_summary="auto", json_schema={"type": "object"},
        ))  # fmt: skip
        maybe_transform(sample, response_create_params.ResponseCreateParamsStreaming)


def warm_sdk() -> None:
    """All of the SDK's one-off set-up for a Responses call (request side and event
    models), once per process; blocking (call it in a worker thread)."""
    _warm_request_path()
    warm_event_models()


class ResponsesProvider(OpenAIClientProvider):
    """A Responses API provider (``api = "responses"``) backed by the ``openai`` SDK.

    Constructor arguments and errors: see
    :class:`~chainrun.providers.openai_client.OpenAIClientProvider`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._preparing: asyncio.Future[None] | None = None

    #: False until :meth:`prepare` has run: :class:`~chainrun.providers.base.ChatStream`
    #: then awaits it before it starts a call's clock
    prepared = False

    async def prepare(self) -> None:
        """The SDK's one-off set-up (:func:`warm_sdk`, in a worker thread, once per
        process) and this client's ``responses`` resource, so that no call's timings
        carry them: :class:`~chainrun.providers.base.ChatStream` awaits this before it
        starts the first call's clock. Concurrent first calls share one warm-up."""
        if self.prepared:
            return
        if self._preparing is None:
            self._preparing = asyncio.ensure_future(asyncio.to_thread(warm_sdk))
        await asyncio.shield(self._preparing)
        _ = self.client.responses  # the per-client resource object (cheap once imported)
        self.prepared = True

    async def check(self) -> None:
        """The preflight check, plus :meth:`prepare` (the SDK's one-off set-up).

        Raises:
            ProviderUnavailable: cannot connect.
        """
        await self.prepare()
        await super().check()

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        """Stream ``request``; yields normalised chunks; the response is closed in ``finally``.

        Raises:
            ProviderUnavailable: cannot connect.
            ProviderTimeout: the HTTP client timed out.
            ProviderStatusError: an HTTP error status (``retry_after_s`` from its headers).
            ResponseFailed: a ``response.failed`` or ``error`` event.
            ProviderError: the stream failed after it started.
        """
        params = response_params(request)
        key = self.prompt_cache_key(request)
        if key is not None:  # the Responses API's own parameter, sent whatever the SDK's age
            params["extra_body"] = {"prompt_cache_key": key}
        stream = await self._send(self.client.responses.create, params)
        events = ResponseEvents(self.name)
        try:
            seen = 0
            async for event in stream:
                total = stream.response.num_bytes_downloaded
                chunk = events.on_event(event, nbytes=total - seen)
                seen = total
                if chunk is not None:
                    yield chunk
        except (openai.APIError, httpx2.HTTPError) as e:
            raise self._error(e, streaming=True) from e
        finally:
            await stream.close()
