"""The lab's Chat Completions endpoint: ``POST /v1/chat/completions``, streamed or not,
with the scenario's planned latency and faults (see :mod:`chainrun.lab.server`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chainrun.lab.scenarios import Plan, content_key
from chainrun.lab.servers import SERVER_PROFILES, reshape_stream
from chainrun.lab.sse import SSEBytesResponse
from chainrun.lab.state import (
    MODEL_ID,
    LabState,
    RequestRecord,
    error_response,
    failed_before_answer,
    max_tokens_of,
    planned_answer,
    read_json_body,
    record_request,
    sleep_unless_disconnected,
    usage_body,
    wire_response,
)
from chainrun.lab.tool_calls import LabToolCall, conversation_round


async def chat_completions(request: Request, *, deployment: str | None = None) -> Response:
    lab: LabState = request.app.state.lab
    read = await read_json_body(request)
    if isinstance(read, Response):
        return read
    body, arrived = read  # tokens due while the loop lagged are then sent at once
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return error_response(400, "'messages' must be a list", "invalid_request_error")

    stream = bool(body.get("stream"))
    messages = body["messages"]
    attempt_header = request.headers.get("x-chainrun-attempt")
    attempt = int(attempt_header) if attempt_header and attempt_header.isdigit() else None
    plan = lab.planner.plan(messages, max_tokens_of(body), attempt)
    model = deployment or str(body.get("model") or MODEL_ID)
    rec = record_request(lab, request, body, plan, record_id=lab.next_id(), model=model,
                         stream=stream, messages=messages)  # fmt: skip
    profile = SERVER_PROFILES[lab.scenario.server] if lab.scenario.server else None
    strict = lab.scenario.strict_history or (profile.strict_history if profile else None)
    refused = strict.refusal(messages) if strict is not None else None
    if refused is not None:  # a strict server's answer to what the earlier turns hold
        rec.status_code, rec.finished_at = refused[0], lab.now()
        kind = "invalid_request_error" if refused[0] < 500 else "server_error"
        return error_response(refused[0], refused[1], kind)
    if stream and lab.scenario.wire_rounds:
        by_round = lab.scenario.wire_rounds
        round_ = conversation_round(messages)[0]
        return wire_response(lab, rec, arrived, by_round[min(round_, len(by_round)) - 1])
    if stream and lab.scenario.wire is not None:
        return wire_response(lab, rec, arrived)
    cache_prompt = body.get("cache_prompt")
    rec.cache_prompt = cache_prompt if isinstance(cache_prompt, bool) else None
    factor, warm = lab.prompt_cache(messages, cache_prompt)
    if factor != 1.0:
        plan = dataclasses.replace(plan, ttft_ms=plan.ttft_ms * factor)
        rec.planned_ttft_ms = round(plan.ttft_ms, 3)

    if plan.fault == "reject":
        rej = lab.scenario.faults.reject
        assert rej is not None
        rec.status_code = rej.status
        rec.finished_at = lab.now()
        err = {"message": rej.message, "type": "invalid_request_error", "param": rej.param,
               "code": rej.code}  # fmt: skip
        return JSONResponse({"error": err}, status_code=rej.status)
    failed = await failed_before_answer(lab, rec, plan, request)
    if failed is not None:
        return failed

    prompt_tokens = max(1, len(content_key(messages)) // 4)
    plan, words, call = planned_answer(lab, rec, body, messages, plan,
                                       max_tokens_of(body))  # fmt: skip
    cached = (prompt_tokens - 1) * warm  # llama-server recomputes the last prompt token
    if lab.scenario.prompt_cache is not None:
        rec.cached_tokens = cached
    usage = None if plan.fault == "no_usage" else usage_body(prompt_tokens, plan.tokens, cached)
    if not stream:
        text = "".join(words)
        return await _complete(request, lab, rec, plan, model, usage, text, arrived, call)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    rec.status_code = 200
    events = _stream_events(
        lab,
        rec,
        plan,
        model,
        words,
        usage if include_usage else None,
        arrived,
        call,
    )
    if profile is not None:  # as that server family sends it (chainrun.lab.servers)
        events = reshape_stream(events, profile, conversation_round(messages)[0])
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
    call: LabToolCall | None = None,
) -> Response:
    total_s = (plan.ttft_ms + plan.tokens * plan.token_interval_ms) / 1000.0
    total_s -= asyncio.get_running_loop().time() - arrived
    if await sleep_unless_disconnected(request.receive, max(0.0, total_s)):
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
                    "content": None if call is not None else text,
                    "refusal": None,
                    **({"tool_calls": [{"id": call.call_id, "type": "function",
                                        "function": {"name": call.name,
                                                     "arguments": call.arguments}}]}
                       if call is not None else {}),
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
    call: LabToolCall | None = None,
) -> AsyncGenerator[bytes, None]:
    """The SSE body: role frame, TTFT, tokens on an absolute schedule, usage, [DONE].

    With a tool ``call``, the "tokens" are the pieces of its arguments: the first delta
    carries the call's index, id, type and name with the first piece, the others the
    index and a piece; the last one the finish reason ``tool_calls``.

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
        if call is not None:  # a piece of the tool call's arguments
            return chunk({"tool_calls": [{"index": 0, "function": {"arguments": word}}]})
        return before + json.dumps(word).encode() + after

    first_piece: dict[str, Any] = {}
    if call is not None:
        first_piece = {"index": 0, "id": call.call_id, "type": "function",
                       "function": {"name": call.name, "arguments": words[0]}}  # fmt: skip

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
                if call is not None and (t == 0 or last):
                    piece = first_piece if t == 0 else {
                        "index": 0, "function": {"arguments": words[t]}}
                    delta: dict[str, Any] = {"tool_calls": [piece]}
                    if t == 0 and not role_only:
                        delta = {"role": "assistant", "content": None, **delta}
                    parts.append(
                        chunk(
                            delta, plan.finish_reason if last else None, on_finish if last else None
                        )
                    )
                elif last or (t == 0 and not role_only):
                    delta = {"content": words[t]}
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


