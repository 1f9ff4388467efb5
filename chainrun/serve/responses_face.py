"""The Responses API face: the whole chain as one model of OpenAI's Responses API.

Route::

    POST /v1/responses    stream=false: one response object
                          stream=true:  SSE of typed events, ending at response.completed

Clients whose default is the Responses API (the AI SDK's ``openai(model)``, OpenAI's
Agents SDK, the ``openai`` SDK's ``client.responses.create``) set their base URL to
``http://HOST:PORT/v1`` and the served model id (default ``chainrun-shop``). Shapes
follow the OpenAI API reference, "Create a model response" and "Streaming events", and
the ``openai`` SDK's ``openai.types.responses`` types. A turn goes through the same
front desk (:mod:`chainrun.desk`), checks and log as on the other faces.

What is taken from the request:

* ``input``: a string (the shopper's message), or a list of input items: messages
  (``{"role", "content"}``, with or without ``"type": "message"``; ``content`` a string
  or ``input_text`` / ``output_text`` parts), read as the Chat Completions face reads
  ``messages`` (:func:`chainrun.conversations.read_thread`: the last ``user`` message is
  the one the turn answers, earlier ones with the ``assistant`` messages after them are
  the history). ``reasoning`` items are skipped; any other item (a function call, an
  item reference) is refused 400 naming it. ``instructions``: like a system message,
  it reaches no step (the chain's steps have their own system texts) but is part of the
  chat's opening.
* **The conversation**: ``previous_response_id`` continues the chat that response
  ended: its conversation (the response id carries it) and its thread as this process
  keeps it (:class:`ResponseThreads`: the turns up to and including that response),
  then any earlier turns ``input`` holds. A response this process does not hold (after
  a restart, on another worker) continues from the chain's own record of the
  conversation (its memory, else the run log). Without it, as on the Chat Completions
  face: ``metadata.conversation_id``, else the conversation header, else one derived
  from the chat's opening (``instructions`` and the first user message) and the caller,
  with the client's thread (a client that sends the whole thread each time, as the AI
  SDK does, keeps one conversation and one prompt cache).
* ``user`` / ``safety_identifier`` (the end user), ``prompt_cache_key`` (the prompt
  cache's hint), ``stream``: as on the Chat Completions face.
* Refused with 400 ``unsupported_parameter`` when set to anything but the harmless
  value: ``tools`` (``[]``), ``tool_choice`` (``"none"``, ``"auto"``), ``text.format``
  (``{"type": "text"}``), ``background`` (``false``), ``conversation``,
  ``prompt`` (:data:`REFUSED_PARAMETERS`). Any other field (``temperature``,
  ``max_output_tokens``, ``reasoning``, ``store``, ``include``, ``truncation``...) is
  taken without effect: the steps' settings are the chain's config.

What comes back: a response object ``{id, object: "response", created_at, status,
model, output: [{type: "message", id, role: "assistant", status, content: [{type:
"output_text", text, annotations: []}]}], usage: {input_tokens, input_tokens_details:
{cached_tokens}, output_tokens, output_tokens_details: {reasoning_tokens},
total_tokens}, previous_response_id, instructions, ...}`` and the ``chainrun`` extra
field (the turn summary of :func:`chainrun.serve.turns.turn_summary`; streamed, the
``answer_done`` summary of the Chat Completions face). Usage counts are integers: a
count no call reported is 0 there, and ``chainrun.usage.unknown_calls`` says how many
calls did not report. ``status``: ``completed``; ``incomplete`` with
``incomplete_details.reason`` ``content_filter`` for a turn the chain refused (its
refusal text is the output) or ``max_output_tokens`` for an answer cut at its step's
deadline (the part sent is the output). A turn that failed (a provider down) is a 502
error object, or, streamed, ``response.failed`` with ``error`` ``{code:
"server_error", message}``; a turn the server cancelled as it stopped is a 503 (code
``cancelled``) or that event.

Streamed (``text/event-stream``, each event's ``data`` a JSON object with its ``type``
and ``sequence_number``, no ``[DONE]``): ``response.created``,
``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` (the answer as it
streams), ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``, then ``response.completed`` (or
``response.incomplete``) with the whole response and its usage. As on the Chat
Completions face the stream ends at the answer: once nothing pending can refuse it,
the checks after it finish on the server, and the usage covers the calls until the
answer. A request refused before its turn runs is its HTTP status and error object,
streamed or not; closing the stream early cancels the turn.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.messages import read_thread
from chainrun.desk import Received, TurnRequest
from chainrun.desk.background import BackgroundRequests
from chainrun.desk.conversations import MAX_HINT_CHARS
from chainrun.serve.chat import MAX_CONVERSATION_ID_CHARS
from chainrun.serve.disconnect import run_until_disconnected
from chainrun.serve.errors import (
    JSONBody,
    NotJSON,
    error_response,
    not_ready,
    read_json,
    refusal_body,
    refusal_response,
)
from chainrun.serve.faces import (
    InvalidRequest,
    check_body,
    check_texts,
    failed_response,
    failure,
    flag,
    text_field,
    whole_turn,
)
from chainrun.serve.intake import Asked, turn_request
from chainrun.serve.sse import sse_event, sse_response
from chainrun.serve.turns import TurnRunner, WireEvent, opened

__all__ = ["REFUSED_PARAMETERS", "ResponseThreads", "ResponsesRequest", "conversation_of",
           "new_response_id", "parse_responses_request", "responses"]  # fmt: skip

#: Request parameters that would change what the answer is, which the face does not
#: honour: each maps to (the values it accepts as harmless, why not); set to anything
#: else, a 400 ``unsupported_parameter`` naming it. ``docs/guides/serving.md`` lists them.
REFUSED_PARAMETERS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tools": (lambda v: v == [], "the chain's tools are its config ([tools.NAME])"),
    "tool_choice": (lambda v: v in ("none", "auto"), "the chain's tools are its config"),
    "text": (lambda v: isinstance(v, dict) and v.get("format", {"type": "text"})
             == {"type": "text"},
             "the answer's format is the chain's config (the answer step's json_schema)"),
    "background": (lambda v: v is False, "a turn is answered while the request waits"),
    "conversation": (lambda v: False, "continue a chat with previous_response_id"),
    "prompt": (lambda v: False, "the chain's prompts are its config"),
}  # fmt: skip

#: the response id's prefix and its random part's length (hex digits), before the
#: conversation id in hex
_PREFIX, _RANDOM = "resp_", 32
#: the item types of ``input`` taken as messages, and those skipped
_MESSAGE_TYPES, _SKIPPED_TYPES = ("message",), ("reasoning",)
_ROLES = ("user", "assistant", "system", "developer")
#: the content parts of an input message whose text is taken
_TEXT_PARTS = ("input_text", "output_text")


def new_response_id(conversation_id: str) -> str:
    """A new response id of a turn of ``conversation_id``: ``resp_``, 32 random hex digits
    and the conversation id's UTF-8 in hex (so a later ``previous_response_id`` names its
    conversation on any worker, after a restart too)."""
    return _PREFIX + uuid.uuid4().hex + conversation_id.encode().hex()


def conversation_of(response_id: str) -> str | None:
    """The conversation a response id of :func:`new_response_id` names (None: it is no
    such id)."""
    if not response_id.startswith(_PREFIX):
        return None
    tail = response_id[len(_PREFIX) + _RANDOM:]
    try:
        conversation = bytes.fromhex(tail).decode()
    except ValueError:
        return None
    return conversation or None


class ResponseThreads:
    """Each response's thread, as this process answered it: the chat's turns up to and
    including the response's, by response id (the least recently used dropped first past
    ``max_responses``), so that ``previous_response_id`` continues it."""

    def __init__(self, max_responses: int = 4096) -> None:
        self.max_responses = max_responses
        self._threads: OrderedDict[str, tuple[HistoryTurn, ...]] = OrderedDict()

    def put(self, response_id: str, thread: tuple[HistoryTurn, ...]) -> None:
        """Keep ``thread`` (oldest first) as ``response_id``'s."""
        self._threads[response_id] = thread
        self._threads.move_to_end(response_id)
        while len(self._threads) > self.max_responses:
            self._threads.popitem(last=False)

    def get(self, response_id: str) -> tuple[HistoryTurn, ...] | None:
        """``response_id``'s thread (None: not held here)."""
        thread = self._threads.get(response_id)
        if thread is not None:
            self._threads.move_to_end(response_id)
        return thread


@dataclass(frozen=True)
class ResponsesRequest:
    """The parts of a ``/v1/responses`` request the chain uses.

    Attributes:
        asked: what is asked (:class:`~chainrun.serve.intake.Asked`).
        stream: the answer as events.
        instructions: the request's ``instructions``, echoed in the response.
        previous_response_id: the response this one continues (None: none).
        metadata: the request's ``metadata``, echoed.
    """

    asked: Asked
    stream: bool
    instructions: str | None = None
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None


def _input_messages(raw: Any) -> list[dict[str, Any]]:
    """``input`` as Chat Completions messages (see the module text).

    Raises:
        InvalidRequest: not a string or a list; an item that is no message.
    """
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("input: expected a string or a non-empty list of items", "input")
    out = []
    for i, item in enumerate(raw):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind in _SKIPPED_TYPES:
            continue
        if kind not in _MESSAGE_TYPES or item.get("role") not in _ROLES:
            raise InvalidRequest(f"input[{i}]: expected a message with a role ({', '.join(_ROLES)}"
                                 f"), got {json.dumps(kind)}", "input")  # fmt: skip
        content = item.get("content")
        if isinstance(content, list):
            content = [{"type": "text", "text": p.get("text")} for p in content
                       if isinstance(p, dict) and p.get("type") in _TEXT_PARTS]
        out.append({"role": item["role"], "content": content})
    return out


def parse_responses_request(
    body: Any, model_id: str, background: BackgroundRequests | None = None,
    conversation_header: str | None = None, threads: ResponseThreads | None = None,
) -> ResponsesRequest:  # fmt: skip
    """The chain's view of a ``/v1/responses`` body; ``threads``: the responses this
    process holds (None: none).

    Raises:
        InvalidRequest: not an object; ``model`` missing (400) or not ``model_id`` (404
            ``model_not_found``); ``input`` neither text nor a list of messages, or
            holding no user message with text; a text over
            :data:`~chainrun.conversations.turn_input.MAX_MESSAGE_CHARS` characters or
            with a lone surrogate; a parameter of :data:`REFUSED_PARAMETERS` set to a
            value it does not accept (``unsupported_parameter``); ``stream`` not a JSON
            boolean; ``instructions`` not a string; ``previous_response_id`` that is no
            response id of this server (404 ``previous_response_not_found``); a
            conversation id, ``user`` or ``prompt_cache_key`` that is no string of
            the allowed length.
    """
    check_body(body, model_id, REFUSED_PARAMETERS)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("instructions: expected a string", "instructions")
    messages = _input_messages(body.get("input"))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    thread = read_thread(messages)
    texts = [m["content"] for m in messages if isinstance(m.get("content"), str)]
    kind = background.kind(texts) if background is not None else None
    text = thread.message if thread.message or kind is None else texts[-1]
    if not text or not text.strip():
        raise InvalidRequest("input: expected a user message with text", "input")
    check_texts(text, thread.history, "input")
    metadata = body.get("metadata")
    named = metadata.get("conversation_id") if isinstance(metadata, dict) else None
    conversation = text_field(named if named is not None else conversation_header,
                               "metadata.conversation_id", MAX_CONVERSATION_ID_CHARS)
    history: tuple[HistoryTurn, ...] | None = thread.history
    previous = text_field(body.get("previous_response_id"), "previous_response_id", 1024)
    if previous is not None:
        conversation = conversation_of(previous)
        if conversation is None or len(conversation) > MAX_CONVERSATION_ID_CHARS:
            raise InvalidRequest(f"Previous response with id {previous!r} not found.",
                                 "previous_response_id", status=404,
                                 code="previous_response_not_found")  # fmt: skip
        held = threads.get(previous) if threads is not None else None
        # not held here: the chain's own record of the conversation (memory, the log)
        history = None if held is None and not thread.history else (*(held or ()),
                                                                     *thread.history)
    end_user = body.get("user") if body.get("user") is not None else body.get("safety_identifier")
    asked = Asked(
        text, conversation_id=conversation, opening=thread.opening, history=history,
        end_user=text_field(end_user, "user", MAX_CONVERSATION_ID_CHARS), background=kind,
        cache_hint=text_field(body.get("prompt_cache_key"), "prompt_cache_key",
                               MAX_HINT_CHARS),
    )  # fmt: skip
    return ResponsesRequest(
        asked=asked, stream=flag(body.get("stream"), "stream"), instructions=instructions,
        previous_response_id=previous,
        metadata=metadata if isinstance(metadata, dict) else None,
    )  # fmt: skip


def responses_usage(u: dict[str, Any]) -> dict[str, Any]:
    """A usage object of :class:`chainrun.log.rows.TurnUsage`'s JSON shape in the
    Responses API's ``usage`` shape: integers, a count no call reported 0 (the
    ``chainrun`` field's ``usage.unknown_calls`` says how many calls did not report)."""
    inp, out = u.get("input_tokens") or 0, u.get("output_tokens") or 0
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": u.get("cached_input_tokens") or 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": u.get("reasoning_tokens") or 0},
        "total_tokens": inp + out,
    }


#: a turn's status (the turn summary's, or ``answered``) -> (the response's status, the
#: reason it is incomplete)
_STATUS = {"refused": ("incomplete", "content_filter"),
           "replaced": ("incomplete", "content_filter"),
           "cut": ("incomplete", "max_output_tokens")}  # fmt: skip


@dataclass
class _Shape:
    """What every response object of one request shares."""

    response_id: str
    message_id: str
    created_at: int
    model: str
    req: ResponsesRequest

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": []}] if text else []
        return {"type": "message", "id": self.message_id, "role": "assistant",
                "status": status, "content": content}  # fmt: skip

    def response(self, status: str, output: list[dict[str, Any]], *,
                 usage: dict[str, Any] | None = None, reason: str | None = None,
                 error: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
        return {
            "id": self.response_id, "object": "response", "created_at": self.created_at,
            "status": status, "error": error,
            "incomplete_details": {"reason": reason} if reason else None,
            "instructions": self.req.instructions, "max_output_tokens": None,
            "model": self.model, "output": output, "parallel_tool_calls": False,
            "previous_response_id": self.req.previous_response_id, "reasoning": None,
            "store": True, "temperature": None, "text": {"format": {"type": "text"}},
            "tool_choice": "none", "tools": [], "top_p": None, "truncation": "disabled",
            "usage": usage, "user": self.req.asked.end_user,
            "metadata": self.req.metadata or {}, **extra,
        }  # fmt: skip

    def finished(self, turn_status: str, text: str, usage: dict[str, Any],
                 summary: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        status, reason = _STATUS.get(turn_status, ("completed", None))
        item_status = "completed" if status == "completed" else "incomplete"
        return self.response(status, [self.message(text, item_status)],
                             usage=responses_usage(usage), reason=reason, chainrun=summary)


def _thread_of(turn: TurnRequest, req: ResponsesRequest, answer: str) -> tuple[HistoryTurn, ...]:
    """The chat's thread once this turn answered: its history as sent (or held), then
    this turn."""
    return (*(req.asked.history or ()), HistoryTurn(turn.message, answer))


async def responses(request: Request) -> Response:
    """``POST /v1/responses`` (see the module docstring)."""
    received = Received.now()
    state = request.app.state.serve
    threads: ResponseThreads = state.response_threads
    try:
        body = read_json(await request.body())
    except NotJSON as e:
        return error_response(400, str(e), code="invalid_json")
    try:
        req = parse_responses_request(body, state.model_id, state.background,
                                      request.headers.get(state.conversation_header),
                                      threads)  # fmt: skip
    except InvalidRequest as e:
        return error_response(e.status, str(e), param=e.param, code=e.code)
    runner: TurnRunner | None = state.runner
    if runner is None:
        return not_ready(request)
    turn = await turn_request(request, req.asked, received)
    if isinstance(turn, Response):
        return turn
    assert turn.conversation_id is not None  # turn_request names one
    shape = _Shape(new_response_id(turn.conversation_id), f"msg_{uuid.uuid4().hex}",
                   int(time.time()), state.model_id, req)  # fmt: skip
    if req.stream:
        events, refusal = await opened(runner.stream(turn), runner.refusal_wait_s)
        if refusal is not None:
            return refusal_response(refusal)
        return sse_response(_events(events, runner.answer_step, shape, turn, threads),
                            keepalive_s=state.v1_keepalive_s)  # fmt: skip
    summary = await run_until_disconnected(whole_turn(runner, turn), request.is_disconnected)
    if summary is None:
        return Response(status_code=499)
    if "error" in summary:
        return refusal_response(summary["error"])
    if summary["status"] in ("error", "cancelled"):
        return failed_response(summary)
    output = summary["output"] or ""
    threads.put(shape.response_id, _thread_of(turn, req, output))
    return JSONBody(shape.finished(summary["status"], output, summary["usage"], summary))


async def _events(
    events: AsyncIterator[WireEvent], answer_step: str, shape: _Shape, turn: TurnRequest,
    threads: ResponseThreads,
) -> AsyncIterator[ServerSentEvent]:  # fmt: skip
    sequence = 0
    at = {"item_id": shape.message_id, "output_index": 0, "content_index": 0}

    def event(kind: str, **fields: Any) -> ServerSentEvent:
        nonlocal sequence
        doc = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return sse_event(json.dumps(doc), event=kind)

    yield event("response.created", response=shape.response("in_progress", []))
    yield event("response.in_progress", response=shape.response("in_progress", []))
    yield event("response.output_item.added", output_index=0,
                item=shape.message("", "in_progress"))  # fmt: skip
    yield event("response.content_part.added", **at,
                part={"type": "output_text", "text": "", "annotations": []})  # fmt: skip
    sent: list[str] = []

    def ending(status: str, output: str, usage: dict[str, Any],
               summary: dict[str, Any]) -> list[ServerSentEvent]:  # fmt: skip
        text = "".join(sent) or output
        done = shape.finished(status, text, usage, summary)
        threads.put(shape.response_id, _thread_of(turn, shape.req, text))
        part = {"type": "output_text", "text": text, "annotations": []}
        kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
        return [event("response.output_text.done", **at, text=text, logprobs=[]),
                event("response.content_part.done", **at, part=part),
                event("response.output_item.done", output_index=0, item=done["output"][0]),
                event(kind, response=done)]  # fmt: skip

    started: dict[str, Any] = {}
    async for ev in events:
        if ev.event == "error":  # refused once the stream had begun (a key's long wait)
            error = refusal_body(ev.data)["error"]
            yield event("error", code=error["code"], message=error["message"],
                        param=error["param"])  # fmt: skip
            return
        if ev.event == "turn_started":
            started = ev.data
        elif ev.event == "token" and ev.data["step"] == answer_step:
            sent.append(ev.data["text"])
            yield event("response.output_text.delta", **at, delta=ev.data["text"], logprobs=[])
        elif ev.event == "answer_done":
            done = {"status": "answered", **ev.data,
                    "conversation_id": started.get("conversation_id"),
                    "request_id": started.get("request_id")}  # fmt: skip
            for out in ending("answered", ev.data["output"] or "", ev.data["usage"], done):
                yield out
            return
        elif ev.event == "turn":
            summary = ev.data
            if summary["status"] in ("error", "cancelled"):
                _, message, _ = failure(summary)
                error = {"code": "server_error", "message": message}
                yield event("response.failed", response=shape.response(
                    "failed", [], error=error, usage=responses_usage(summary["usage"]),
                    chainrun=summary))  # fmt: skip
                return
            for out in ending(summary["status"], summary["output"] or "", summary["usage"],
                              summary):  # fmt: skip
                yield out
            return
