"""The OpenAI-compatible face: the whole chain as one model of a Chat Completions API.

Routes::

    GET  /v1/models              {"object": "list", "data": [{"id": MODEL, ...}]}
    GET  /v1/models/{id}         {"id": MODEL, "object": "model", ...} (another id: 404)
    POST /v1/chat/completions    stream=false: one chat.completion
                                 stream=true:  SSE of chat.completion.chunk, "data: [DONE]"

A client that already speaks the API (the ``openai`` SDK, a chat UI) sets its
``base_url`` to ``http://HOST:PORT/v1`` and its model to the served model id (default
``chainrun-shop``); the bearer token, if the server has one, is its API key.

What is taken from the request: the text of the **last** ``user`` message (the message
the turn answers), the **earlier turns** from the ``messages`` before it (each earlier
``user`` message with the ``assistant`` messages after it: the turn's ``{history}``,
cut to the ``[history]`` budget; read by :func:`chainrun.conversations.read_thread`,
which documents every rule), and the conversation (:mod:`chainrun.desk.conversations`):
``metadata.conversation_id``, else the ``Conversation-Id`` header (``serve
--conversation-header`` names another, e.g. Open WebUI's ``X-OpenWebUI-Chat-Id``), else
one derived from the chat's opening (its instructions and first user message) and the
caller, so that each turn of a chat finds its conversation and two chats of one person
are two. ``user`` (and ``safety_identifier``) is the end user, as OpenAI defines it,
never a conversation: it scopes the derived id and the ``Idempotency-Key`` where no
identity is configured. The face keeps no state, as the API it copies: the history is
the client's, never the log's. A chat UI's background request (a title, tags, follow-up
suggestions generated from a chat: :mod:`chainrun.desk.background`) is answered as a
turn of its own that decides no pending action and acts on nothing. ``system`` and
``developer`` messages reach no step (the derived conversation id aside): the chain's
steps have their own system texts (config), and each step's logged prompt shows what was
sent. Sampling parameters are the chain's own (its config) and are ignored
(:data:`IGNORED_PARAMETERS`); a parameter that would change what the answer is and that
the face does not honour (:data:`REFUSED_PARAMETERS`: ``n`` other than 1, ``tools``,
``response_format`` other than text, ``logprobs``, audio) is refused with 400
``unsupported_parameter`` naming it, never answered with prose that ignores it.

**The prompt cache of a stateless chat**: a chat's turns share its conversation (the
derived id above), and the conversation is what keeps the turn's model calls on one
prompt cache (a llama-server slot, ``prompt_cache_key`` upstream:
:mod:`chainrun.providers.affinity`); the earlier turns the client sends back are
rendered as the chain's own prompts showed them where they equal turns this process
answered (:mod:`chainrun.conversations.threads`), so turn 2's prompt begins with turn
1's prompt and answer, the prefix the server has cached. The request's
``prompt_cache_key`` is taken as OpenAI defines it, a hint that requests sharing it
share a cache: it keys the turn's cache instead of the conversation, scoped by the
caller (:func:`chainrun.desk.conversations.hinted_cache_key`), and names no
conversation.

What comes back besides the answer:

* ``usage`` sums the chain's tokens over every model call of the turn, hedge copies
  included: ``prompt_tokens`` (includes cached), ``completion_tokens`` (includes
  reasoning), ``completion_tokens_details.reasoning_tokens``,
  ``prompt_tokens_details.cached_tokens``. Streamed, it rides on a last chunk with empty
  ``choices`` when ``stream_options.include_usage`` is set (as OpenAI does). A count
  that no call of the turn reported (a server that sends no ``*_details``) is null,
  never 0; one that some calls reported is their sum.
* ``chainrun``: an extra field on the completion holding the turn summary of
  :func:`chainrun.serve.turns.turn_summary` (turn id, status, per-step timings and
  attempts, ``usage.unknown_calls``: calls whose tokens the server never reported).
* **A streamed answer ends at the answer**: once the shopper has the whole answer and
  nothing pending can refuse it (the ``answer_done`` event of
  :mod:`chainrun.serve.turns`), the chunk with ``finish_reason`` ``stop``, the usage
  chunk and ``[DONE]`` are sent, and the checks after the answer (validate, critique)
  finish on the server and are logged. That chunk's ``chainrun`` is then
  ``{status: "answered", step, output, answer_ttft_ms, answer_done_ms, turn_index,
  pending, usage, conversation_id, request_id}`` (``pending``: the steps still running;
  ``request_id`` finds the turn in the log), and ``usage`` covers the calls made until
  the answer. A turn refused or failed before its answer ends as before, with the
  whole turn summary.
* ``finish_reason``: ``stop`` for an answered turn, ``content_filter`` for a turn a
  check refused (a turn refused because a step failed is an error, below); a refused
  streamed turn whose answer had already begun ends there, its ``chainrun.status`` says
  ``refused``. ``length`` for a turn whose answer was **cut**: the answer step failed
  (its deadline, a stream that broke off) after part of its answer had been sent; that
  part is the answer (``content``, or the chunks already streamed), never replaced by a
  refusal, and ``chainrun.status`` is ``cut`` with the step's ``error_type``.

An ``Idempotency-Key`` header (the IETF HTTPAPI draft's field; pass it with the
``openai`` SDK's ``extra_headers`` and its own retries carry it) makes a request sent
again return the first one's completion, running nothing a second time; a keyed turn
runs to its end when the client times out, so the retry gets it; the key reused with
another request is a 422 naming it (code ``idempotency_key_reused``), streamed or not: a
streamed response starts once the chain's turn has begun
(:func:`chainrun.serve.turns.opened`). A tool with ``confirm = true``: the answer is
chainrun's question, and the next user message of the same chat is read as the reply
(it decides only an action whose question the thread it sends shows). With ``serve
--identity-header`` the caller's identity comes from that header
(:mod:`chainrun.serve.identity`): 401 when it does not check out, 403 for a
conversation bound to another identity.

A turn that gave no answer because a step failed (it ends ``error``, or ``refused`` with
the failed step's ``error_type``: a provider down, a 500, a 429, a deadline, a broken
stream) is an HTTP error object with ``type`` ``server_error`` and ``code`` the error
type: 503 (with ``Retry-After``) for ``unavailable``, ``http_429``, ``rate_limited``
and ``circuit_open``, 504 for the deadlines, else 502. A streamed completion starts its
stream at the answer's first token or after :data:`OUTAGE_WAIT_S` (2 s; at most the
``--v1-keepalive-s`` interval), whichever is first, so that a turn failing at once gets
that status; one failing later ends its begun stream with an ``error`` object (the
``openai`` client raises ``APIError`` on it).
Closing the stream early, or disconnecting while waiting for a non-streamed answer,
cancels the turn's in-flight calls; the turn is logged ``cancelled``.
A turn the server cancels as it stops (its stop's deadline, a second Ctrl-C) is an HTTP
503 error object with code ``cancelled``, or that ``error`` object in a stream.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from chainrun.conversations.messages import message_text, read_thread
from chainrun.desk import Received
from chainrun.desk.background import BackgroundRequests
from chainrun.desk.conversations import MAX_HINT_CHARS
from chainrun.serve.chat import MAX_CONVERSATION_ID_CHARS
from chainrun.serve.disconnect import run_until_disconnected
from chainrun.serve.errors import (
    JSONBody,
    NotJSON,
    error_body,
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
    failed,
    failed_response,
    failure,
    flag,
    text_field,
    whole_turn,
)
from chainrun.serve.intake import Asked, turn_request
from chainrun.serve.sse import sse_event, sse_response
from chainrun.serve.turns import TurnRunner, WireEvent, opened, peek

#: s a streamed completion waits for its answer's first token before it starts its
#: stream, so that a turn failing at once (its server down, a 500, a 429, an open
#: breaker: each fails within this) is an HTTP error and not an error inside a 200
#: stream; a slower failure is the stream's ``error`` object
OUTAGE_WAIT_S = 2.0


@dataclass(frozen=True)
class CompletionRequest:
    """The parts of a Chat Completions request the chain uses: what is asked
    (:class:`~chainrun.serve.intake.Asked`) and how the answer is sent."""

    asked: Asked
    stream: bool
    include_usage: bool


#: Request parameters that would change what the answer is, which the face does not
#: honour: each maps to (the values it accepts as harmless, why not). A request that sets
#: one to anything else is refused with 400 ``unsupported_parameter`` naming it, never
#: answered with prose that ignores it. ``docs/guides/serving.md`` lists them (a test
#: keeps the list and this table equal).
_NO_LOGPROBS = "the chain's answer carries no log probabilities"
REFUSED_PARAMETERS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v == 1 and not isinstance(v, bool), "the chain gives one answer"),
    "tools": (lambda v: v == [], "the chain's tools are its config ([tools.NAME])"),
    "tool_choice": (lambda v: v == "none", "the chain's tools are its config"),
    "functions": (lambda v: v == [], "the chain's tools are its config"),
    "function_call": (lambda v: v == "none", "the chain's tools are its config"),
    "response_format": (
        lambda v: v == {"type": "text"},
        "the answer's format is the chain's config (the answer step's json_schema)",
    ),
    "logprobs": (lambda v: v is False, _NO_LOGPROBS),
    "top_logprobs": (lambda v: v == 0 and not isinstance(v, bool), _NO_LOGPROBS),
    "audio": (lambda v: False, "the chain answers in text"),
    "modalities": (lambda v: v == ["text"], "the chain answers in text"),
    "prediction": (lambda v: False, "predicted outputs are not supported"),
    "web_search_options": (lambda v: False, "the chain searches its own catalogue"),
}

#: Request parameters taken without effect: the chain's steps have their own settings
#: (model, sampling, caps, reasoning effort: the config), so these are ignored, as the
#: module docstring says (``metadata.conversation_id`` names the conversation, ``user``
#: and ``safety_identifier`` the end user, ``prompt_cache_key`` the prompt cache;
#: ``stream_options.include_usage`` is honoured).
IGNORED_PARAMETERS: tuple[str, ...] = (
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed",
    "presence_penalty", "frequency_penalty", "logit_bias", "reasoning_effort",
    "parallel_tool_calls", "store", "service_tier", "verbosity", "safety_identifier",
)  # fmt: skip


def parse_completion_request(
    body: Any, model_id: str, background: BackgroundRequests | None = None,
    conversation_header: str | None = None,
) -> CompletionRequest:  # fmt: skip
    """The chain's view of a ``/v1/chat/completions`` body; ``background``: the chat UIs'
    background requests to recognise (None: none); ``conversation_header``: the value of
    the request's conversation header, if any.

    Raises:
        InvalidRequest: not an object; ``model`` missing (400) or not ``model_id`` (404
            ``model_not_found``); ``messages`` holds no user message with text (unless a
            background request's prompt); the text breaks the library's rule
            (:func:`chainrun.conversations.turn_input.check_turn_input`: over
            :data:`~chainrun.conversations.turn_input.MAX_MESSAGE_CHARS` characters, a lone
            surrogate); a parameter of :data:`REFUSED_PARAMETERS` set to a value it does
            not accept (``n`` other than 1, ``tools``, ``response_format`` other than
            text, ...: 400 ``unsupported_parameter``); ``stream`` or
            ``stream_options.include_usage`` is not a JSON boolean (``"yes"`` is refused,
            not taken as true); ``stream_options`` is not an object; a conversation id
            that is no string of 1 to :data:`MAX_CONVERSATION_ID_CHARS` characters; a
            ``prompt_cache_key`` that is no string of 1 to
            :data:`~chainrun.desk.conversations.MAX_HINT_CHARS` characters.
    """
    check_body(body, model_id, REFUSED_PARAMETERS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: expected a non-empty list", "messages")
    thread = read_thread(messages)
    texts = [t for m in messages if isinstance(m, dict)
             and isinstance(t := message_text(m.get("content")), str) and t.strip()]  # fmt: skip
    kind = background.kind(texts) if background is not None else None
    text = thread.message if thread.message or kind is None else texts[-1]
    if not text or not text.strip():
        raise InvalidRequest("messages: expected a user message with text content", "messages")
    check_texts(text, thread.history, "messages")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("stream_options: expected an object", "stream_options")
    metadata = body.get("metadata")
    named = metadata.get("conversation_id") if isinstance(metadata, dict) else None
    conversation = text_field(named if named is not None else conversation_header,
                               "metadata.conversation_id", MAX_CONVERSATION_ID_CHARS)
    end_user = body.get("user") if body.get("user") is not None else body.get("safety_identifier")
    asked = Asked(
        text, conversation_id=conversation, opening=thread.opening, history=thread.history,
        end_user=text_field(end_user, "user", MAX_CONVERSATION_ID_CHARS), background=kind,
        cache_hint=text_field(body.get("prompt_cache_key"), "prompt_cache_key",
                               MAX_HINT_CHARS),
    )  # fmt: skip
    return CompletionRequest(
        asked=asked,
        stream=flag(body.get("stream"), "stream"),
        include_usage=flag((options or {}).get("include_usage"), "stream_options.include_usage"),
    )


def openai_usage(summary: dict[str, Any]) -> dict[str, Any]:
    """The turn summary's summed usage in the Chat Completions ``usage`` shape."""
    return answer_done_usage(summary["usage"])


def answer_done_usage(u: dict[str, Any]) -> dict[str, Any]:
    """A usage object of :class:`chainrun.log.rows.TurnUsage`'s JSON shape in the Chat
    Completions ``usage`` shape: every count an integer, as the API types them (a
    strictly typed client fails on null); a count no call of the turn reported is 0
    there and named in ``unreported`` (e.g. ``["prompt_tokens_details.cached_tokens"]``),
    an extension field, so that unknown still reads apart from none."""
    counts = {
        "prompt_tokens": u["input_tokens"],
        "completion_tokens": u["output_tokens"],
        "completion_tokens_details.reasoning_tokens": u["reasoning_tokens"],
        "prompt_tokens_details.cached_tokens": u["cached_input_tokens"],
    }
    n = {k: v or 0 for k, v in counts.items()}
    return {
        "prompt_tokens": n["prompt_tokens"],
        "completion_tokens": n["completion_tokens"],
        "total_tokens": n["prompt_tokens"] + n["completion_tokens"],
        "completion_tokens_details": {
            "reasoning_tokens": n["completion_tokens_details.reasoning_tokens"]},
        "prompt_tokens_details": {"cached_tokens": n["prompt_tokens_details.cached_tokens"]},
        "unreported": [k for k, v in counts.items() if v is None],
    }


def _answer_begun(answer_step: str) -> Callable[[WireEvent], bool]:
    """Whether an event is the answer's first (a token of ``answer_step``, its end) or
    the turn's end: a streamed response waits for it (:data:`OUTAGE_WAIT_S` at most)."""
    return lambda ev: ev.event in ("answer_done", "turn") or (
        ev.event == "token" and ev.data.get("step") == answer_step)


def _finish_reason(status: str) -> str:
    """``content_filter`` for a turn a check refused or replaced (a failed step's
    refusal is an error instead: :func:`failed`), ``length`` for a cut one (the
    answer ended before it was complete: the API's "the maximum number of tokens ...
    was reached" is the nearest of its reasons), else ``stop``."""
    if status in ("refused", "replaced"):
        return "content_filter"
    return "length" if status == "cut" else "stop"


def _model_object(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "chainrun"}


async def models(request: Request) -> Response:
    """``GET /v1/models``: the chain as one model."""
    model_id = request.app.state.serve.model_id
    return JSONBody({"object": "list", "data": [_model_object(model_id)]})


async def model(request: Request) -> Response:
    """``GET /v1/models/{id}``: the chain's model object, or 404 ``model_not_found``."""
    served, asked = request.app.state.serve.model_id, request.path_params["model_id"]
    if asked != served:
        return error_response(404, f"The model {asked!r} does not exist; this server serves "
                              f"{served!r}", param="model", code="model_not_found")  # fmt: skip
    return JSONBody(_model_object(served))


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions`` (see the module docstring)."""
    received = Received.now()  # the turn's clock starts here
    state = request.app.state.serve
    try:
        body = read_json(await request.body())
    except NotJSON as e:
        return error_response(400, str(e), code="invalid_json")
    try:
        req = parse_completion_request(body, state.model_id, state.background,
                                       request.headers.get(state.conversation_header))
    except InvalidRequest as e:
        return error_response(e.status, str(e), param=e.param, code=e.code)
    runner: TurnRunner | None = state.runner
    if runner is None:
        return not_ready(request)
    turn = await turn_request(request, req.asked, received)
    if isinstance(turn, Response):
        return turn
    completion_id = f"chatcmpl-{turn.request_id or uuid.uuid4().hex}"
    if req.stream:
        events, refusal = await opened(runner.stream(turn), runner.refusal_wait_s)
        if refusal is not None:  # refused before its turn ran: the status, not a stream
            return refusal_response(refusal)
        # a turn that fails at once (a server down, a 500, a 429, an open breaker) is
        # an HTTP error, as a client's retry logic expects, not a stream that says so
        # (never longer than the keep-alive interval asked for: the stream's pings begin)
        wait_s = min(OUTAGE_WAIT_S, state.v1_keepalive_s or OUTAGE_WAIT_S)
        events, read = await peek(events, wait_s, _answer_begun(runner.answer_step))
        if read and read[-1].event == "turn" and failed(read[-1].data):
            async for _ in events:  # the turn has ended: read to its end, which closes it
                pass
            return failed_response(read[-1].data)
        return sse_response(
            _chunks(events, runner.answer_step, req, completion_id, state.model_id),
            keepalive_s=state.v1_keepalive_s,
        )
    summary = await run_until_disconnected(whole_turn(runner, turn), request.is_disconnected)
    if summary is None:  # the client went away; the turn was cancelled and logged
        return Response(status_code=499)
    if "error" in summary:  # refused before it ran (a key reused with another request)
        return refusal_response(summary["error"])
    if failed(summary):
        return failed_response(summary)
    return JSONBody(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": state.model_id,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": summary["output"],
                        "refusal": None,
                    },
                    "logprobs": None,
                    "finish_reason": _finish_reason(summary["status"]),
                }
            ],
            "usage": openai_usage(summary),
            "chainrun": {"request_id": turn.request_id, **summary},
        }
    )


async def _chunks(
    events: AsyncIterator[WireEvent], answer_step: str, req: CompletionRequest,
    completion_id: str, model_id: str,
) -> AsyncIterator[ServerSentEvent]:  # fmt: skip
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> ServerSentEvent:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        doc = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model_id,
            "system_fingerprint": None,
            "choices": [choice],
            **extra,
        }
        return sse_event(json.dumps(doc))

    def usage_chunk(usage: dict[str, Any]) -> ServerSentEvent:
        doc = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
               "model": model_id, "system_fingerprint": None, "choices": [],
               "usage": usage}  # fmt: skip
        return sse_event(json.dumps(doc))

    yield chunk({"role": "assistant", "content": ""})
    sent_text = False
    started: dict[str, Any] = {}
    async for ev in events:
        if ev.event == "error":  # refused once the stream had begun (a key's long wait)
            yield sse_event(json.dumps(refusal_body(ev.data)))
            break
        if ev.event == "turn_started":
            started = ev.data
        elif ev.event == "token" and ev.data["step"] == answer_step:
            sent_text = True
            yield chunk({"content": ev.data["text"]})
        elif ev.event == "answer_done":
            # the stream ends at the answer; the turn's checks finish on the server
            done = {"status": "answered", **ev.data,
                    "conversation_id": started.get("conversation_id"),
                    "request_id": started.get("request_id")}  # fmt: skip
            if not sent_text and done["output"]:
                yield chunk({"content": done["output"]})  # a non-streamed answer step
            yield chunk({}, "stop", chainrun=done)
            if req.include_usage:
                yield usage_chunk(answer_done_usage(done["usage"]))
            break
        elif ev.event == "turn":
            summary = ev.data
            if failed(summary):
                _, message, code = failure(summary)
                body = error_body(message, "server_error", code=code)
                yield sse_event(json.dumps({**body, "chainrun": summary}))
                break
            if not sent_text and summary["output"]:
                yield chunk({"content": summary["output"]})  # e.g. the refusal text
            yield chunk({}, _finish_reason(summary["status"]), chainrun=summary)
            if req.include_usage:
                yield usage_chunk(openai_usage(summary))
    yield sse_event("[DONE]")
