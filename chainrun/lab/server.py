"""The latency lab server: an OpenAI-compatible chat-completions endpoint with known latency.

Routes (all JSON unless said otherwise)::

    POST /v1/chat/completions   stream=true: SSE of chat.completion.chunk objects, then
                                "data: [DONE]"; stream=false: one chat.completion
    POST /v1/responses          the Responses API (typed events; see lab/responses.py)
    POST /openai/deployments/{name}/chat/completions?api-version=...
    POST /openai/responses?api-version=...
                                Azure OpenAI's URL shape (``api-key`` header or a
                                bearer token; see lab/azure.py)
    GET  /v1/models             one model, "chainrun-lab"
    GET  /health                {"status": "ok", "scenario": {...}}
    GET  /admin/requests        list of per-request records (see RequestRecord)
    POST /admin/reset           forget the records, restart the RNG from the seed
    POST /admin/scenario        serve another scenario (body: a Scenario as JSON); resets

Timing of a stream: headers at once, then the role-only frame (when the scenario
says so, as llama.cpp does), then the planned TTFT, then one token every
``token_interval_ms``; the last content chunk carries the finish_reason. A
non-streamed answer is sent after TTFT + tokens x token interval.

Client disconnects are detected from the ASGI ``http.disconnect`` message (which
:class:`~chainrun.lab.sse.SSEBytesResponse` turns into a cancellation of the token
generator), so a record shows
when a hedging loser closed its stream and that generation stopped there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import os
import random
import resource
import socket
import sys
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive

from chainrun.errors import UserInputError
from chainrun.eventloop import uvicorn_loop
from chainrun.lab.scenarios import Plan, Planner, Scenario, content_key, load_scenario
from chainrun.lab.sse import SSEBytesResponse
from chainrun.netlisten import listening_socket

MODEL_ID = "chainrun-lab"

#: Words the deterministic answers are made of (chosen by a hash of the request).
_WORDS = (
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


class LabState:
    """The server's mutable state: scenario, planner, records, clock origin."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.planner = Planner(scenario)
        self.records: list[RequestRecord] = []
        self.t0 = time.monotonic()
        self._counter = 0

    def now(self) -> float:
        """Seconds since the server started."""
        return time.monotonic() - self.t0

    def next_id(self) -> str:
        self._counter += 1
        return f"chatcmpl-lab{self._counter:06d}"

    def reset(self) -> None:
        self.records.clear()
        self.planner.reset()


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": kind}}
    return JSONResponse(body, status_code=status, headers=headers)


def _words(messages: Any, n: int) -> list[str]:
    rng = random.Random(content_key(messages))
    return [("" if i == 0 else " ") + rng.choice(_WORDS) for i in range(n)]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": 0},
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _sleep_unless_disconnected(receive: Receive, seconds: float | None) -> bool:
    """Wait ``seconds`` (None: forever); True when the client disconnected first."""
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({watcher}, timeout=seconds)
        return watcher in done
    finally:
        if not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def _chat_completions(request: Request, *, deployment: str | None = None) -> Response:
    lab: LabState = request.app.state.lab
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "request body is not JSON", "invalid_request_error")
    # the planned TTFT counts from the moment the whole request is in (as a real server's
    # work can start no earlier); tokens due while the loop lagged are then sent at once
    arrived = asyncio.get_running_loop().time()
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return _error(400, "'messages' must be a list", "invalid_request_error")

    stream = bool(body.get("stream"))
    messages = body["messages"]
    attempt_header = request.headers.get("x-chainrun-attempt")
    attempt = int(attempt_header) if attempt_header and attempt_header.isdigit() else None
    plan = lab.planner.plan(messages, _max_tokens(body), attempt)
    model = deployment or str(body.get("model") or MODEL_ID)
    rec = RequestRecord(
        id=lab.next_id(),
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
    )
    lab.records.append(rec)

    if plan.fault == "rate_limit":
        retry = lab.scenario.faults.retry_after_s
        rec.status_code = 429
        rec.finished_at = lab.now()
        # Retry-After is whole seconds (RFC 9110); retry-after-ms carries the exact value
        headers = {"Retry-After": str(math.ceil(retry)), "retry-after-ms": f"{retry * 1000:g}"}
        if not lab.scenario.faults.retry_after:
            headers = {}
        return _error(429, "lab: rate limited", "rate_limit_exceeded", headers)
    if plan.fault == "reject":
        rej = lab.scenario.faults.reject
        assert rej is not None
        rec.status_code = rej.status
        rec.finished_at = lab.now()
        err = {"message": rej.message, "type": "invalid_request_error", "param": rej.param,
               "code": rej.code}  # fmt: skip
        return JSONResponse({"error": err}, status_code=rej.status)
    if plan.fault == "server_error":
        rec.status_code = 500
        rec.finished_at = lab.now()
        return _error(500, "lab: injected server error", "server_error")
    if plan.fault == "hang":
        await _sleep_unless_disconnected(request.receive, None)
        rec.disconnected = True
        rec.disconnected_at = rec.finished_at = lab.now()
        return Response(status_code=499)  # never reaches the client, which has gone

    prompt_tokens = max(1, len(content_key(messages)) // 4)
    usage = None if plan.fault == "no_usage" else _usage(prompt_tokens, plan.tokens)
    if not stream:
        text = "".join(_words(messages, plan.tokens))
        return await _complete(request, lab, rec, plan, model, usage, text, arrived)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    rec.status_code = 200
    events = _stream_events(
        lab,
        rec,
        plan,
        model,
        _words(messages, plan.tokens),
        usage if include_usage else None,
        arrived,
    )
    return SSEBytesResponse(events, headers={"x-lab-request-id": rec.id})


async def _complete(
    request: Request,
    lab: LabState,
    rec: RequestRecord,
    plan: Plan,
    model: str,
    usage: dict[str, Any] | None,
    text: str,
    arrived: float,
) -> Response:
    total_s = (plan.ttft_ms + plan.tokens * plan.token_interval_ms) / 1000.0
    total_s -= asyncio.get_running_loop().time() - arrived
    if await _sleep_unless_disconnected(request.receive, max(0.0, total_s)):
        rec.disconnected = True
        rec.disconnected_at = rec.finished_at = lab.now()
        return Response(status_code=499)
    now = lab.now()
    rec.first_token_at = rec.finished_at = now
    rec.tokens_sent = plan.tokens
    rec.completed = True
    rec.status_code = 200
    rec.finish_reason = plan.finish_reason
    body = {
        "id": rec.id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                },
                "logprobs": None,
                "finish_reason": plan.finish_reason,
            }
        ],
        "usage": usage,
    }
    return JSONResponse(body, headers={"x-lab-request-id": rec.id})


async def _stream_events(
    lab: LabState,
    rec: RequestRecord,
    plan: Plan,
    model: str,
    words: list[str],
    usage: dict[str, Any] | None,
    start: float,
) -> AsyncGenerator[bytes, None]:
    """The SSE body: role frame, TTFT, tokens on an absolute schedule, usage, [DONE].

    Tokens due at the same moment (the loop fell behind, or a zero interval) are
    written in one send, each still its own chunk: this keeps hundreds of concurrent
    streams cheap without changing what the client parses.
    """
    loop = asyncio.get_running_loop()
    head = json.dumps(
        {
            "id": rec.id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
    )[:-1]
    role_only = lab.scenario.faults.role_only_first_frame

    faults = lab.scenario.faults
    on_finish = usage if faults.usage_on_finish else None

    def chunk(delta: dict[str, Any], finish: str | None = None, with_usage: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        tail = (
            f',"system_fingerprint":null,"choices":[{json.dumps(choice)}],'
            f'"usage":{json.dumps(with_usage)}}}'
        )
        return f"data: {head}{tail}\n\n".encode()

    # the common frame (a content-only delta, no finish, no usage) from two constant
    # halves around the word: the same bytes as chunk({"content": word}), without
    # encoding the frame's constant parts again for every token
    before, after = chunk({"content": ""}).rsplit(b'""', 1)

    def content_chunk(word: str) -> bytes:
        return before + json.dumps(word).encode() + after

    try:
        if role_only:
            yield chunk({"role": "assistant", "content": None})
        if plan.fault == "headers_only":
            await asyncio.Event().wait()  # until the client disconnects (cancelled then)
        n_send = plan.tokens if plan.cut_after is None else plan.cut_after
        err = faults.stream_error if plan.fault == "stream_error" else None
        if err is not None:
            n_send = min(n_send, err.after_tokens)
        first_due = start + plan.ttft_ms / 1000.0
        interval = plan.token_interval_ms / 1000.0
        pause_s = plan.pause_ms / 1000.0
        i = 0
        while i < n_send:
            due = first_due + i * interval
            if plan.pause_after is not None and i >= plan.pause_after:
                due += pause_s
            now = loop.time()
            if due > now:
                await asyncio.sleep(due - now)
                now = loop.time()
            j = n_send if interval <= 0 else min(n_send, i + 1 + int((now - due) / interval))
            if plan.pause_after is not None and i < plan.pause_after:
                j = min(j, plan.pause_after)  # never batch tokens across the pause
            parts = []
            for t in range(i, j):
                last = plan.cut_after is None and err is None and t == plan.tokens - 1
                if last or (t == 0 and not role_only):
                    delta: dict[str, Any] = {"content": words[t]}
                    if t == 0 and not role_only:
                        delta = {"role": "assistant", "content": words[t]}
                    parts.append(
                        chunk(
                            delta, plan.finish_reason if last else None, on_finish if last else None
                        )
                    )
                else:
                    parts.append(content_chunk(words[t]))
                if t == 0 and plan.fault == "malformed_sse":
                    parts.append(b"data: {not json\n\n")
            if rec.first_token_at is None:
                rec.first_token_at = lab.now()
            rec.tokens_sent = j
            yield b"".join(parts)
            i = j
        if err is not None:
            body = json.dumps({"code": err.code, "message": err.message, "type": "server_error"})
            if err.style == "event":  # as llama-server does
                yield f"error: {body}\n\ndata: [DONE]\n\n".encode()
            else:
                yield f'data: {{"error": {body}}}\n\n'.encode()
            rec.finished_at = lab.now()
            return
        if plan.cut_after is not None:
            # cut: the body just ends, with no finish_reason, usage or [DONE]
            rec.finished_at = lab.now()
            return
        rec.finish_reason = plan.finish_reason
        if usage is not None and on_finish is None:
            final = {
                "id": rec.id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "system_fingerprint": None,
                "choices": [],
                "usage": usage,
            }
            yield f"data: {json.dumps(final)}\n\n".encode()
        # The last frame: the stream is complete once it is handed over. A client that
        # closes right after reading it, before this generator resumes from the yield (a
        # busy loop), is no disconnect (under saturation most streams ended that way).
        rec.completed = True
        rec.finished_at = lab.now()
        yield b"data: [DONE]\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        # SSEBytesResponse cancels (or closes) this generator when the client disconnects
        if not rec.completed:
            rec.disconnected = True
            rec.disconnected_at = rec.finished_at = lab.now()
        raise


async def _models(request: Request) -> Response:
    return JSONResponse(
        {
            "object": "list",
            "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "chainrun"}],
        }
    )


async def _health(request: Request) -> Response:
    lab: LabState = request.app.state.lab
    return JSONResponse({"status": "ok", "scenario": lab.scenario.model_dump(mode="json")})


async def _admin_requests(request: Request) -> Response:
    lab: LabState = request.app.state.lab
    return JSONResponse([asdict(r) for r in lab.records])


async def _admin_reset(request: Request) -> Response:
    lab: LabState = request.app.state.lab
    lab.reset()
    return JSONResponse({"ok": True})


async def _admin_scenario(request: Request) -> Response:
    lab: LabState = request.app.state.lab
    try:
        scenario = Scenario.model_validate(await request.json())
    except (ValueError, ValidationError) as e:
        return _error(400, f"not a scenario: {e}", "invalid_request_error")
    lab.scenario = scenario
    lab.planner = Planner(scenario)
    lab.reset()
    return JSONResponse({"ok": True, "scenario": scenario.name})


def create_app(scenario: Scenario) -> Starlette:
    """The lab as an ASGI app serving ``scenario`` (routes in this module's docstring)."""
    from chainrun.lab.azure import azure_chat_completions, azure_responses
    from chainrun.lab.responses import responses

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route(
                "/openai/deployments/{deployment}/chat/completions",
                azure_chat_completions,
                methods=["POST"],
            ),
            Route("/openai/responses", azure_responses, methods=["POST"]),
            Route("/v1/models", _models, methods=["GET"]),
            Route("/health", _health, methods=["GET"]),
            Route("/admin/requests", _admin_requests, methods=["GET"]),
            Route("/admin/reset", _admin_reset, methods=["POST"]),
            Route("/admin/scenario", _admin_scenario, methods=["POST"]),
        ]
    )
    app.state.lab = LabState(scenario)
    return app


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise UserInputError(f"the lab serves on loopback only (127.0.0.1, ::1); got host {host!r}")


def _has_httptools() -> bool:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return False
    return True


def _raise_open_files_limit() -> None:
    # each stream holds a socket; the default soft limit can be 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def serve(
    scenario: Scenario | str,
    host: str = "127.0.0.1",
    port: int = 8090,
    *,
    port_file: str | Path | None = None,
    on_bound: Callable[[int], None] | None = None,
) -> None:
    """Serve the lab on ``host:port`` until interrupted (blocking; SIGINT/SIGTERM stop it).

    Args:
        scenario: a Scenario, or a built-in name / TOML path for :func:`load_scenario`.
        host: a loopback address (the lab never listens elsewhere).
        port: TCP port; 0 picks a free one.
        port_file: if given, the port actually bound is written there once listening
            is possible (how :class:`~chainrun.lab.LabServer` learns a port-0 choice).
        on_bound: called with the port actually bound (not 0) before serving starts
            (how ``chainrun lab serve --port 0 --json`` reports it).

    Raises:
        UserInputError: a non-loopback host, a port that cannot be bound, a bad scenario.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    _check_loopback(host)
    sock = listening_socket(host, port)
    actual = sock.getsockname()[1]
    _raise_open_files_limit()
    config = uvicorn.Config(
        create_app(scenario),
        log_level="warning",
        access_log=False,
        loop=uvicorn_loop(),  # uvloop when installed (chainrun.eventloop)
        lifespan="off",
        # httptools (a dependency) parses HTTP in C; h11 is uvicorn's pure-Python fallback
        http="httptools" if _has_httptools() else "h11",
        # no limit_concurrency: hundreds of concurrent streams are the point
        timeout_keep_alive=30,
        timeout_graceful_shutdown=1,  # a lab being stopped need not drain its streams
        backlog=2048,
    )
    server = uvicorn.Server(config)
    if port_file is not None:
        tmp = Path(f"{port_file}.tmp")
        tmp.write_text(str(actual), encoding="utf-8")
        os.replace(tmp, port_file)
    if on_bound is not None:
        on_bound(actual)
    bound_host = sock.getsockname()[0]
    shown = f"[{bound_host}]" if sock.family == socket.AF_INET6 else bound_host
    print(
        f"chainrun lab: scenario {scenario.name!r} on http://{shown}:{actual}/v1",
        file=sys.stderr,
        flush=True,
    )
    server.run(sockets=[sock])
