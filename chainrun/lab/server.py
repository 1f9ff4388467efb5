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
    POST /tokenize              llama-server's tokenizer route: {"content": TEXT} ->
                                {"tokens": [...]}, one id per word or punctuation mark
                                (the lab has no vocabulary; counts are what matter)
    GET  /health                {"status": "ok", "scenario": {...}}
    (a scenario's ``prompt_cache`` emulates llama-server's prompt cache and honours a
    request's ``"cache_prompt": false``; its ``wire`` frames replace planned streams)
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

import contextlib
import ipaddress
import os
import re
import resource
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chainrun.errors import UserInputError
from chainrun.lab.azure import azure_chat_completions, azure_responses
from chainrun.lab.chat_completions import chat_completions
from chainrun.lab.responses import responses
from chainrun.lab.scenarios import Planner, Scenario, load_scenario
from chainrun.lab.state import MODEL_ID, LabState, error_response
from chainrun.runtime.event_loop import uvicorn_loop
from chainrun.runtime.listen_socket import listening_socket


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
        return error_response(400, f"not a scenario: {e}", "invalid_request_error")
    lab.scenario = scenario
    lab.planner = Planner(scenario)
    lab.reset()
    return JSONResponse({"ok": True, "scenario": scenario.name})


_TOKEN = re.compile(r"\w+|[^\w\s]")


async def _tokenize(request: Request) -> Response:
    """llama-server's ``POST /tokenize`` shape: one token id per word or punctuation mark."""
    try:
        body = await request.json()
    except ValueError:
        return error_response(400, "request body is not JSON", "invalid_request_error")
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, str):
        return error_response(400, "'content' must be a string", "invalid_request_error")
    return JSONResponse({"tokens": [len(t) for t in _TOKEN.findall(content)]})


def create_app(scenario: Scenario) -> Starlette:
    """The lab as an ASGI app serving ``scenario`` (routes in this module's docstring)."""
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route(
                "/openai/deployments/{deployment}/chat/completions",
                azure_chat_completions,
                methods=["POST"],
            ),
            Route("/openai/responses", azure_responses, methods=["POST"]),
            Route("/v1/models", _models, methods=["GET"]),
            Route("/tokenize", _tokenize, methods=["POST"]),
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
        loop=uvicorn_loop(),  # uvloop when installed (chainrun.runtime.event_loop)
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
