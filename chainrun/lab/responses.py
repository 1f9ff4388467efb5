"""The lab's Responses API route: ``POST /v1/responses`` (and Azure's ``/openai/responses``).

Same scenarios, plans and faults as Chat Completions (:mod:`chainrun.lab.server`): the
request's ``instructions`` and ``input`` are turned back into chat ``messages``, so a
request carries the same work (``work_noise``) and gets the same words on both APIs.

A stream sends typed SSE events (``event:`` and ``data:`` lines, each with a
``sequence_number``) in the documented order, and no ``[DONE]``::

    response.created, response.in_progress                      at once
    [reasoning item]  response.output_item.added
      [summary asked] response.reasoning_summary_part.added,
                      response.reasoning_summary_text.delta x S,
                      response.reasoning_summary_text.done,
                      response.reasoning_summary_part.done
                      response.output_item.done
    response.output_item.added, response.content_part.added     (the message)
    response.output_text.delta x N                              one per token
    response.output_text.done, response.content_part.done, response.output_item.done
    response.completed | response.incomplete (reason max_output_tokens)

Timing: the planned TTFT, then the scenario's ``reasoning_tokens`` R (hidden reasoning,
one token interval each; skipped when the request's ``reasoning.effort`` is "none"),
then the text tokens, one interval apart. When the request asks for a summary
(``reasoning.summary``), S = min(R, ``reasoning_summary_tokens``) summary deltas are
spread over the reasoning phase, the first at the TTFT; without one, nothing visible
arrives before the text. R counts in ``usage.output_tokens`` and
``output_tokens_details.reasoning_tokens`` and against ``max_output_tokens``.
Faults: 429/500 before the stream, hang, cut (the body ends with no terminal event),
no_usage (the terminal event's ``usage`` is null). A scenario's ``[tool_calls]``
(:mod:`chainrun.lab.tool_calls`) answers a request offering tools with a
``function_call`` item instead of the message: ``response.output_item.added``, its
arguments in ``response.function_call_arguments.delta`` pieces (one token interval
apart), ``.done``, ``response.output_item.done``, ``response.completed``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chainrun.lab.scenarios import content_key
from chainrun.lab.sse import SSEBytesResponse
from chainrun.lab.state import (
    MODEL_ID,
    LabState,
    RequestRecord,
    error_response,
    failed_before_answer,
    planned_answer,
    read_json_body,
    record_request,
    sleep_unless_disconnected,
    wire_response,
)
from chainrun.lab.tool_calls import LabToolCall


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Chat ``messages`` equivalent to a Responses request (None: ``input`` is malformed)."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    raw = body.get("input")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    if not isinstance(raw, list):
        return None
    for item in raw:
        if isinstance(item, dict) and item.get("type") in ("function_call",
                                                           "function_call_output"):
            messages.append(dict(item))  # a tool call and its result (tool rounds)
            continue
        if not isinstance(item, dict) or "role" not in item:
            return None
        messages.append({"role": item["role"], "content": item.get("content")})
    return messages


def _usage(prompt: int, text: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": text + reasoning,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + text + reasoning,
    }


def _response(rec: RequestRecord, model: str, status: str, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rec.id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": [],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "usage": None,
    }
    out.update(fields)
    return out


async def responses(request: Request) -> Response:
    """``POST /v1/responses``: plan the request as a chat one, then play it as events."""
    lab: LabState = request.app.state.lab
    read = await read_json_body(request)
    if isinstance(read, Response):
        return read
    body, arrived = read
    messages = messages_of(body) if isinstance(body, dict) else None
    if messages is None:
        problem = "'input' must be a string or a list of messages"
        return error_response(400, problem, "invalid_request_error")
    sc = lab.scenario
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    n_reason = 0 if reasoning.get("effort") == "none" else sc.reasoning_tokens
    cap = body.get("max_output_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        cap = None
    text_cap = None if cap is None else max(1, cap - n_reason)
    plan = lab.planner.plan(messages, text_cap)
    model = str(body.get("model") or MODEL_ID)
    rec = record_request(lab, request, body, plan, model=model, stream=bool(body.get("stream")),
                         record_id=lab.next_id().replace("chatcmpl-", "resp_"),
                         messages=messages)  # fmt: skip
    if rec.stream and sc.wire is not None:
        return wire_response(lab, rec, arrived)
    failed = await failed_before_answer(lab, rec, plan, request)
    if failed is not None:
        return failed

    prompt_tokens = max(1, len(content_key(messages)) // 4)
    plan, words, call = planned_answer(lab, rec, body, messages, plan, text_cap)
    usage = None if plan.fault == "no_usage" else _usage(prompt_tokens, plan.tokens, n_reason)
    n_summary = min(n_reason, sc.reasoning_summary_tokens) if reasoning.get("summary") else 0
    if not rec.stream:
        interval = plan.token_interval_ms
        total_s = (plan.ttft_ms + (n_reason + plan.tokens) * interval) / 1000.0
        total_s -= asyncio.get_running_loop().time() - arrived
        if await sleep_unless_disconnected(request.receive, max(0.0, total_s)):
            rec.disconnected = True
            rec.disconnected_at = rec.finished_at = lab.now()
            return Response(status_code=499)
        rec.first_token_at = rec.finished_at = lab.now()
        rec.tokens_sent = plan.tokens
        rec.completed = True
        rec.status_code = 200
        rec.finish_reason = plan.finish_reason
        text = "".join(words)
        output = ([_call_item(rec, call, "completed")] if call is not None
                  else [_message_item(rec, text, "completed")])  # fmt: skip
        return JSONResponse(_final(rec, model, plan.finish_reason, usage, output))
    rec.status_code = 200
    events = _events(lab, rec, plan, model, words, usage, n_reason, n_summary, arrived, call)
    return SSEBytesResponse(events, headers={"x-lab-request-id": rec.id})


def _message_item(rec: RequestRecord, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {
        "type": "message",
        "id": f"msg_{rec.id}",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(rec: RequestRecord, call: LabToolCall, status: str,
               arguments: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {"type": "function_call", "id": f"fc_{rec.id}", "call_id": call.call_id,
            "name": call.name, "arguments": call.arguments if arguments is None else arguments,
            "status": status}  # fmt: skip


def _final(
    rec: RequestRecord,
    model: str,
    finish: str,
    usage: dict[str, Any] | None,
    output: list[dict[str, Any]],
) -> dict[str, Any]:
    if finish == "length":
        return _response(
            rec,
            model,
            "incomplete",
            output=output,
            usage=usage,
            incomplete_details={"reason": "max_output_tokens"},
        )
    return _response(rec, model, "completed", output=output, usage=usage)


async def _events(
    lab: LabState,
    rec: RequestRecord,
    plan: Any,
    model: str,
    words: list[str],
    usage: dict[str, Any] | None,
    n_reason: int,
    n_summary: int,
    start: float,
    call: LabToolCall | None = None,
) -> AsyncGenerator[bytes, None]:
    """The SSE body, each event sent at its planned time (absolute schedule, as chat)."""
    loop = asyncio.get_running_loop()
    seq = 0

    def ev(kind: str, **data: Any) -> bytes:
        nonlocal seq
        payload = json.dumps({"type": kind, "sequence_number": seq, **data})
        seq += 1
        return f"event: {kind}\ndata: {payload}\n\n".encode()

    interval = plan.token_interval_ms / 1000.0
    t_ttft = start + plan.ttft_ms / 1000.0
    t_text = t_ttft + n_reason * interval
    n_send = plan.tokens if plan.cut_after is None else plan.cut_after
    msg_index = 1 if n_reason else 0
    item_id = f"msg_{rec.id}"

    async def at(due: float) -> None:
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    try:
        yield ev("response.created", response=_response(rec, model, "in_progress"))
        yield ev("response.in_progress", response=_response(rec, model, "in_progress"))
        summary = ""
        if n_reason:
            rs_id = f"rs_{rec.id}"
            yield ev(
                "response.output_item.added",
                output_index=0,
                item={"type": "reasoning", "id": rs_id, "summary": []},
            )
            if n_summary:
                part = {"item_id": rs_id, "output_index": 0, "summary_index": 0}
                yield ev(
                    "response.reasoning_summary_part.added",
                    **part,
                    part={"type": "summary_text", "text": ""},
                )
                step = n_reason / n_summary
                for k in range(n_summary):
                    await at(t_ttft + k * step * interval)
                    delta = ("" if k == 0 else " ") + f"thinking{k + 1}"
                    summary += delta
                    if rec.first_token_at is None:
                        rec.first_token_at = lab.now()
                    yield ev("response.reasoning_summary_text.delta", **part, delta=delta)
                yield ev("response.reasoning_summary_text.done", **part, text=summary)
                yield ev(
                    "response.reasoning_summary_part.done",
                    **part,
                    part={"type": "summary_text", "text": summary},
                )
            await at(t_text)
            done_summary = [{"type": "summary_text", "text": summary}] if summary else []
            yield ev(
                "response.output_item.done",
                output_index=0,
                item={"type": "reasoning", "id": rs_id, "summary": done_summary},
            )
        if call is not None:  # a function call: its arguments in pieces, then done
            fc = {"item_id": f"fc_{rec.id}", "output_index": msg_index}
            yield ev("response.output_item.added", output_index=msg_index,
                     item=_call_item(rec, call, "in_progress", arguments=""))  # fmt: skip
            for i, piece in enumerate(words[:n_send]):
                await at(t_text + i * interval)
                if rec.first_token_at is None:
                    rec.first_token_at = lab.now()
                rec.tokens_sent = i + 1
                yield ev("response.function_call_arguments.delta", **fc, delta=piece)
            if plan.cut_after is not None:
                rec.finished_at = lab.now()
                return
            yield ev("response.function_call_arguments.done", **fc, arguments=call.arguments)
            item = _call_item(rec, call, "completed")
            yield ev("response.output_item.done", output_index=msg_index, item=item)
            final = _final(rec, model, "stop", usage, [item])
            rec.finish_reason = "tool_calls"
            rec.completed = True
            rec.finished_at = lab.now()
            yield ev("response.completed", response=final)
            return
        where = {"item_id": item_id, "output_index": msg_index, "content_index": 0}
        yield ev(
            "response.output_item.added",
            output_index=msg_index,
            item=_message_item(rec, None, "in_progress"),
        )
        yield ev(
            "response.content_part.added",
            **where,
            part={"type": "output_text", "text": "", "annotations": []},
        )
        i = 0
        while i < n_send:
            due = t_text + i * interval
            await at(due)
            now = loop.time()
            j = n_send if interval <= 0 else min(n_send, i + 1 + int((now - due) / interval))
            batch = b"".join(
                ev("response.output_text.delta", **where, delta=words[t], logprobs=[])
                for t in range(i, j)
            )
            if rec.first_token_at is None:
                rec.first_token_at = lab.now()
            rec.tokens_sent = j
            yield batch
            i = j
        if plan.cut_after is not None:
            rec.finished_at = lab.now()  # cut: no done events, no terminal event
            return
        text = "".join(words)
        yield ev("response.output_text.done", **where, text=text, logprobs=[])
        yield ev(
            "response.content_part.done",
            **where,
            part={"type": "output_text", "text": text, "annotations": []},
        )
        item = _message_item(rec, text, "completed")
        yield ev("response.output_item.done", output_index=msg_index, item=item)
        output = [item]
        if n_reason:
            output.insert(
                0,
                {
                    "type": "reasoning",
                    "id": f"rs_{rec.id}",
                    "summary": [{"type": "summary_text", "text": summary}] if summary else [],
                },
            )
        final = _final(rec, model, plan.finish_reason, usage, output)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        rec.finish_reason = plan.finish_reason
        # the last event: complete once handed over (see the Chat Completions stream)
        rec.completed = True
        rec.finished_at = lab.now()
        yield ev(kind, response=final)
    except (asyncio.CancelledError, GeneratorExit):
        if not rec.completed:
            rec.disconnected = True
            rec.disconnected_at = rec.finished_at = lab.now()
        raise
