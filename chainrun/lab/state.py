"""What the lab's endpoints share: the lab's state, its per-request records, its error
bodies and its deterministic answer words."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import math
import random
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from chainrun.lab.scenarios import Plan, Planner, Scenario, WireFrame, content_key
from chainrun.lab.sse import SSEBytesResponse
from chainrun.lab.tool_calls import (
    LabToolCall,
    plan_tool_answer,
    schema_answer,
    split_fragments,
    tool_results_text,
)

MODEL_ID = "chainrun-lab"

#: Words the deterministic answers are made of (chosen by a hash of the request).
WORDS = (
    "the linen shirt runs true to size and pairs well with light chinos for warm days "
    "our denim jacket comes in three washes while the wool coat keeps its shape after "
    "many wears try a size up for a relaxed fit or check the guide for your measurements"
).split()


@dataclass
class RequestRecord:
    """What the lab did with one request (a row of ``GET /admin/requests``).

    Times ``*_at`` are in s since the server started (monotonic clock).
    ``planned_ttft_ms`` is counted from the moment the request body is in.
    ``planned_tokens`` is the answer's length after the request's max-tokens cap;
    ``tokens_sent`` counts tokens handed to the transport and stays below it for a
    stream the client closed (``disconnected``) or the lab cut (``fault``).
    ``completed``: the last frame (``[DONE]``) was handed to the transport; a client
    that closes after it is not ``disconnected``.
    ``status_code`` is None when no response was sent (a hang, or a client gone before
    a non-streamed answer was ready).
    """

    id: str
    received_at: float
    stream: bool
    model: str | None
    request_id: str | None
    attempt: str | None
    metadata: Any
    planned_ttft_ms: float
    planned_tokens: int
    fault: str | None
    status_code: int | None = None
    first_token_at: float | None = None
    tokens_sent: int = 0
    completed: bool = False
    disconnected: bool = False
    disconnected_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    #: the URL path the request came on (``/v1/chat/completions``, ``/v1/responses``,
    #: Azure's ``/openai/deployments/{name}/chat/completions``)
    route: str | None = None
    #: how an Azure-shaped request authenticated: "api-key" or "bearer" (never the secret)
    auth: str | None = None
    #: the tool the answer called (the scenario's ``[tool_calls]``); None: a text answer
    tool_call: str | None = None
    #: the request's ``cache_prompt`` (llama-server's switch; None: not sent)
    cache_prompt: bool | None = None
    #: prompt tokens served from the emulated prompt cache (None: no cache emulated)
    cached_tokens: int | None = None
    #: the request's chat messages (Responses requests turned into messages), kept only
    #: when the scenario sets ``record_bodies``
    messages: Any = None
    #: the request's ``prompt_cache_key`` (OpenAI's prompt-cache affinity; None: not sent)
    prompt_cache_key: str | None = None
    #: the request's ``id_slot`` (llama-server's slot; None: not sent)
    id_slot: int | None = None


class LabState:
    """The server's mutable state: scenario, planner, records, clock origin."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.planner = Planner(scenario)
        self.records: list[RequestRecord] = []
        self.t0 = time.monotonic()
        self._counter = 0
        #: prompts in the emulated prompt cache (content keys of their messages)
        self.cached_prompts: set[str] = set()

    def now(self) -> float:
        """Seconds since the server started."""
        return time.monotonic() - self.t0

    def next_id(self) -> str:
        self._counter += 1
        return f"chatcmpl-lab{self._counter:06d}"

    def reset(self) -> None:
        self.records.clear()
        self.planner.reset()
        self.cached_prompts.clear()

    def prompt_cache(self, messages: Any, cache_prompt: Any) -> tuple[float, int]:
        """The emulated prompt cache's answer for one request: (TTFT factor, 1 when its
        prompt was cached else 0); fills the cache unless ``cache_prompt`` is false."""
        cache = self.scenario.prompt_cache
        if cache is None or cache_prompt is False:
            return 1.0, 0
        key = content_key(messages)
        if key in self.cached_prompts:
            return cache.warm_ttft_factor, 1
        self.cached_prompts.add(key)
        return 1.0, 0


def error_response(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> Response:
    """An OpenAI-shaped error body with ``status``."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": kind}}
    return JSONResponse(body, status_code=status, headers=headers)


def answer_words(messages: Any, n: int) -> list[str]:
    rng = random.Random(content_key(messages))
    return [("" if i == 0 else " ") + rng.choice(WORDS) for i in range(n)]


def json_schema_of(body: dict[str, Any]) -> Any:
    """The JSON Schema a request asks its answer to follow (Chat Completions
    ``response_format.json_schema.schema``, Responses ``text.format.schema``), or None."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
        return fmt["json_schema"].get("schema")
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        return text["format"].get("schema")
    return None


def planned_answer(
    lab: LabState, rec: RequestRecord, body: dict[str, Any], messages: list[Any],
    plan: Plan, cap: int | None,
) -> tuple[Plan, list[str], LabToolCall | None]:  # fmt: skip
    """What the lab sends for a request, by the scenario's ``[tool_calls]``
    (:mod:`chainrun.lab.tool_calls`): a tool call (its arguments' pieces as the "tokens",
    finish reason ``tool_calls``), the tool results as text after the last round (at
    most ``cap`` words), a JSON object following the request's JSON Schema (with the
    scenario's ``schema_answers``), or the plan's words. ``rec`` gets the tokens and the tool."""
    config = lab.scenario.tool_calls
    call = plan_tool_answer(body.get("tools"), messages, config)
    results = tool_results_text(messages) if config is not None else None
    if call is not None:
        assert config is not None
        words = split_fragments(call.arguments, config.fragments)
        plan = dataclasses.replace(plan, tokens=len(words), finish_reason="tool_calls")
    elif results is not None:
        words = [("" if i == 0 else " ") + w for i, w in enumerate(results.split())]
        cut = bool(cap) and len(words) > (cap or 0)
        words = (words[:cap] if cut else words) or [""]
        plan = dataclasses.replace(plan, tokens=len(words),
                                   finish_reason="length" if cut else "stop")  # fmt: skip
    elif lab.scenario.schema_answers and (
        answer := schema_answer(json_schema_of(body), messages)
    ) is not None:
        words = [("" if i == 0 else " ") + w for i, w in enumerate(answer.split(" "))]
        plan = dataclasses.replace(plan, tokens=len(words), finish_reason="stop")
    else:
        words = answer_words(messages, plan.tokens)
    rec.planned_tokens = plan.tokens
    rec.tool_call = call.name if call is not None else None
    return plan, words, call


def usage_body(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": 0},
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def max_tokens_of(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def sleep_unless_disconnected(receive: Receive, seconds: float | None) -> bool:
    """Wait ``seconds`` (None: forever); True when the client disconnected first."""
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({watcher}, timeout=seconds)
        return watcher in done
    finally:
        if not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


def record_request(
    lab: LabState,
    request: Request,
    body: dict[str, Any],
    plan: Plan,
    *,
    record_id: str,
    model: str,
    stream: bool,
    messages: Any = None,
) -> RequestRecord:
    """A new :class:`RequestRecord` for ``request`` (appended to ``lab.records``): the
    chainrun headers it carried, the planned TTFT (ms) and tokens, its fault, and with
    the scenario's ``record_bodies`` its chat ``messages``."""
    rec = RequestRecord(
        id=record_id,
        received_at=lab.now(),
        stream=stream,
        model=model,
        request_id=request.headers.get("x-request-id"),
        attempt=request.headers.get("x-chainrun-attempt"),
        metadata=body.get("metadata"),
        planned_ttft_ms=round(plan.ttft_ms, 3),
        planned_tokens=plan.tokens,
        fault=plan.fault,
        route=request.url.path,
        auth=request.scope.get("chainrun.auth"),
        messages=messages if lab.scenario.record_bodies else None,
    )
    key, slot = body.get("prompt_cache_key"), body.get("id_slot")
    rec.prompt_cache_key = key if isinstance(key, str) else None
    rec.id_slot = slot if isinstance(slot, int) and not isinstance(slot, bool) else None
    lab.records.append(rec)
    return rec


def wire_response(
    lab: LabState, rec: RequestRecord, start: float, wire: Sequence[WireFrame] | None = None
) -> Response:
    """``wire`` (default the scenario's ``wire`` frames), each sent as written at its time
    (loop seconds from ``start``, when the request was in); the record's ``finished_at``
    is set after the last frame, ``disconnected`` when the client left before it."""
    wire = lab.scenario.wire if wire is None else wire
    assert wire is not None
    frames = [(f.after_ms / 1000.0, f.data.encode()) for f in wire]
    rec.status_code = 200

    async def send() -> AsyncGenerator[bytes, None]:
        loop = asyncio.get_running_loop()
        due = start
        try:
            for after_s, data in frames:
                due += after_s
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if rec.first_token_at is None:
                    rec.first_token_at = lab.now()
                yield data
            rec.completed = True
            rec.finished_at = lab.now()
        except (asyncio.CancelledError, GeneratorExit):
            if not rec.completed:
                rec.disconnected = True
                rec.disconnected_at = rec.finished_at = lab.now()
            raise

    return SSEBytesResponse(send(), headers={"x-lab-request-id": rec.id})


def rate_limited(lab: LabState, rec: RequestRecord) -> Response:
    """The 429 of the ``rate_limit`` fault, with ``Retry-After`` (whole seconds, RFC 9110)
    and ``retry-after-ms`` (the exact value), or ``Retry-After`` as an HTTP-date alone
    (``retry_after_form``), unless the scenario leaves them out."""
    faults = lab.scenario.faults
    retry = faults.retry_after_s
    rec.status_code = 429
    rec.finished_at = lab.now()
    headers = {"Retry-After": str(math.ceil(retry)), "retry-after-ms": f"{retry * 1000:g}"}
    if faults.retry_after_form == "http_date":
        when = time.time() + math.ceil(retry) + 1  # whole seconds, rounded up
        headers = {"Retry-After": email.utils.formatdate(when, usegmt=True)}
    if not faults.retry_after:
        headers = {}
    return error_response(429, "lab: rate limited", "rate_limit_exceeded", headers)


async def read_json_body(request: Request) -> tuple[Any, float] | Response:
    """The request's JSON body and the loop time (s) it was all in (a planned TTFT counts
    from then, as a real server's work can start no earlier), or a 400 response when the
    body is not JSON."""
    try:
        body = await request.json()
    except ValueError:
        return error_response(400, "request body is not JSON", "invalid_request_error")
    return body, asyncio.get_running_loop().time()


async def failed_before_answer(
    lab: LabState, rec: RequestRecord, plan: Plan, request: Request
) -> Response | None:
    """The response of a fault that stops a request before any answer (``rate_limit``,
    ``server_error``, ``hang`` until the client goes away), recorded in ``rec``; None when
    the plan has no such fault."""
    if plan.fault == "rate_limit":
        return rate_limited(lab, rec)
    if plan.fault == "server_error":
        rec.status_code = 500
        rec.finished_at = lab.now()
        return error_response(500, "lab: injected server error", "server_error")
    if plan.fault == "hang":
        await sleep_unless_disconnected(request.receive, None)
        rec.disconnected = True
        rec.disconnected_at = rec.finished_at = lab.now()
        return Response(status_code=499)  # never reaches the client, which has gone
    return None
