"""Chat Completions stream bytes straight into chainrun's chunks: a pure parser (no I/O).

The ``openai`` client turns every SSE event of a stream into a ``ChatCompletionChunk``
(its SSE decoder line by line, ``json.loads``, then pydantic ``construct_type``), and
chainrun then read that model into its own :class:`~chainrun.timing.Chunk`. At 1,000
streams in flight that per-chunk path was about a third of the event loop (py-spy,
benchmarks/README.md "Scale in one process"). :class:`ChatSSEParser` reads the response
bytes as they arrive (the request itself, auth, retries-of-nothing and HTTP status
errors still go through the ``openai`` client) and builds each Chunk from the JSON dict.

What it keeps, exactly as the SDK path did (tests/test_chat_sse.py compares the two):

- SSE framing per the WHATWG event-stream rules: lines end in CR, LF or CRLF (a CRLF
  split across two reads is one line end), ``data:`` lines of one event are joined with
  LF, one space after the colon is dropped, ``:`` lines are comments, ``event``/``id``/
  ``retry`` and unknown fields are ignored; an event ends at a blank line. An event with
  no data line is not dispatched (the standard's rule; the SDK's decoder dispatched
  one after an ``id:`` line and its empty data then failed as JSON).
- ``data: [DONE]`` ends the stream.
- llama-server's non-standard ``error: {...}`` field is the event's data as
  ``{"error": ...}`` (as :class:`~chainrun.providers.openai_client._ErrorFieldDecoder`
  does for the SDK path); an event whose JSON has a truthy ``error`` raises
  :class:`~chainrun.errors.StreamError` with the server's message and code (the SDK's
  ``APIError`` mapped by :func:`~chainrun.providers.openai_client.map_openai_error`:
  the same text).
- data that is not JSON (or not UTF-8, or not a JSON object) raises
  :class:`~chainrun.errors.MalformedStream`.
- the chunk's fields: role-only first frames, ``delta.content``,
  ``delta.reasoning_content`` (llama.cpp, vLLM, DeepSeek) or ``delta.reasoning`` (only
  when text), ``finish_reason``, usage on its own chunk with empty ``choices`` or on the
  finish chunk (kept exactly: a missing count stays None, never 0), ``model``, ``id``
  and llama.cpp's ``timings`` block; ``delta.tool_calls`` pieces (:func:`tool_call_deltas`).
"""

from __future__ import annotations

import json
from typing import Any

from chainrun.errors import MalformedStream, StreamError
from chainrun.providers.openai_client import stream_error_from_body
from chainrun.timing import Chunk, ToolCallDelta, Usage, make_chunk

_loads = json.loads
DONE = object()  #: what :meth:`ChatSSEParser.feed` returns in place of ``[DONE]``


def usage_from_dict(u: Any) -> Usage | None:
    """A Chat Completions ``usage`` object as :class:`~chainrun.timing.Usage` (None: none
    sent). ``completion_tokens_details.reasoning_tokens`` is a subset of the output
    tokens and ``prompt_tokens_details.cached_tokens`` of the input (OpenAI's API
    reference); a count the server did not send stays None.

    Cached input tokens as each server family reports them: OpenAI's nested
    ``prompt_tokens_details.cached_tokens`` wins; else DeepSeek's top-level
    ``prompt_cache_hit_tokens`` (DeepSeek API docs, context caching; its companion
    ``prompt_cache_miss_tokens`` is the rest of ``prompt_tokens``).
    """
    if not isinstance(u, dict):
        return None
    details = u.get("completion_tokens_details")
    prompt_details = u.get("prompt_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None
    if cached is None:
        cached = u.get("prompt_cache_hit_tokens")
    return Usage(
        input_tokens=u.get("prompt_tokens"),
        output_tokens=u.get("completion_tokens"),
        reasoning_tokens=details.get("reasoning_tokens") if isinstance(details, dict) else None,
        cached_input_tokens=cached,
    )


def tool_call_deltas(raw: Any) -> tuple[ToolCallDelta, ...] | None:
    """A chunk's ``delta.tool_calls`` (a list of ``{"index", "id", "type", "function":
    {"name", "arguments"}}``, only ``index`` and an ``arguments`` piece after a call's
    first fragment) as :class:`~chainrun.timing.ToolCallDelta` s; None when empty.

    As servers send them: a missing ``index`` stays None (the
    :class:`~chainrun.timing.ToolCallAssembler` infers the call), and ``arguments`` sent as
    a JSON object rather than text (llama.cpp, ggml-org/llama.cpp#20198) is serialised,
    noted ``arguments_object``.

    Raises:
        MalformedStream: an entry that is not an object, or an ``index`` that is not an
            integer.
    """
    if not isinstance(raw, list):
        raise MalformedStream(f"delta.tool_calls: expected a list, got {type(raw).__name__}")
    out = []
    for i, c in enumerate(raw):
        index = c.get("index") if isinstance(c, dict) else False
        if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
            raise MalformedStream(f"delta.tool_calls[{i}]: expected an object with an index")
        fn = c.get("function") if isinstance(c.get("function"), dict) else {}
        out.append(tool_call_delta(index, c.get("id"), fn.get("name"), fn.get("arguments")))
    return tuple(out) or None


def tool_call_delta(index: int | None, id_: Any, name: Any, arguments: Any) -> ToolCallDelta:
    """One tool-call piece from its wire fields (both transports read them so): empty
    strings are None; ``arguments`` that is a JSON object or array is serialised (note
    ``arguments_object``), anything else not text is dropped."""
    notes: tuple[str, ...] = ()
    if isinstance(arguments, dict | list):
        arguments, notes = json.dumps(arguments, ensure_ascii=False), ("arguments_object",)
    return ToolCallDelta(
        index=index,
        id=id_ if isinstance(id_, str) and id_ else None,
        name=name if isinstance(name, str) and name else None,
        arguments=arguments if isinstance(arguments, str) else "",
        notes=notes,
    )


def chunk_from_dict(d: dict[str, Any], nbytes: int = 0) -> Chunk:
    """One ``chat.completion.chunk`` JSON object as a :class:`~chainrun.timing.Chunk`
    (``nbytes``: its size as received); the same fields as
    :func:`~chainrun.providers.openai_compat.normalise_chunk` reads from the SDK's model."""
    content = reasoning = role = finish = tool_calls = None
    choices = d.get("choices")
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        if delta:
            content = delta.get("content")
            role = delta.get("role")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if not isinstance(reasoning, str):
                reasoning = None
            raw_calls = delta.get("tool_calls")
            if raw_calls:
                tool_calls = tool_call_deltas(raw_calls)
        finish = choice.get("finish_reason")
    usage = d.get("usage")
    return make_chunk(
        content,
        reasoning,
        role,
        finish,
        None if usage is None else usage_from_dict(usage),
        d.get("model") or None,
        d.get("id") or None,
        d.get("timings"),
        nbytes,
        tool_calls,
    )


def _error_field(raw: bytes) -> bytes:
    """llama-server's ``error:`` field value as the data of an ``{"error": ...}`` event."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        value: Any = _loads(text)
    except ValueError:
        value = text
    if not isinstance(value, dict):
        value = {"message": str(value) or "error event without a message"}
    if "message" not in value:
        value = {**value, "message": json.dumps(value)}
    return json.dumps({"error": value}).encode()


def stream_error(name: str, error: Any) -> StreamError:
    """The :class:`~chainrun.errors.StreamError` for an in-stream ``{"error": error}``,
    worded as the SDK path words it (its ``APIError`` message, then
    :func:`~chainrun.providers.openai_client.map_openai_error`)."""
    sdk_message = None
    if isinstance(error, dict):
        sdk_message = error.get("message")
    if not sdk_message or not isinstance(sdk_message, str):
        sdk_message = "An error occurred during streaming"
    return stream_error_from_body(name, error, sdk_message)


class ChatSSEParser:
    """Feed it a Chat Completions stream's bytes as they arrive; it returns the events
    completed so far, each a :class:`~chainrun.timing.Chunk` or :data:`DONE`.

    Args:
        name: the provider's name, for error messages.

    Raises (from :meth:`feed`):
        StreamError: an event carried ``{"error": ...}`` (or an ``error:`` field).
        MalformedStream: an event's data is not a JSON object.
    """

    __slots__ = ("_data", "_name", "_rest", "_skip_lf")

    def __init__(self, name: str) -> None:
        self._name = name
        self._rest = b""  # an incomplete last line
        self._skip_lf = False  # the last read ended in CR: a leading LF completes a CRLF
        self._data: list[bytes] = []  # data lines of the event being read

    def feed(self, part: bytes, nbytes: int = 0) -> list[Any]:
        """The events completed by ``part``; the first chunk returned carries ``nbytes``
        (the bytes received since the last chunk), any others 0."""
        if self._skip_lf:
            self._skip_lf = False
            if part[:1] == b"\n":
                part = part[1:]
        buf = self._rest + part if self._rest else part
        if not buf:
            return []
        last = buf[-1]
        if last == 10 or last == 13:  # LF or CR: every line is complete
            self._rest = b""
            self._skip_lf = last == 13
        else:
            cut = max(buf.rfind(b"\n"), buf.rfind(b"\r"))
            if cut < 0:
                self._rest = buf
                return []
            # a CR at the cut is no half CRLF: an LF after it would be the later cut
            self._rest = buf[cut + 1 :]
            buf = buf[: cut + 1]
        out: list[Any] = []
        data = self._data
        for line in buf.splitlines():
            if not line:
                if data:
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    data.clear()
                    out.append(self._event(payload, nbytes if not out else 0))
                    if out[-1] is DONE:
                        return out
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value[:1] == b" " else value)
            elif line.startswith(b"error:"):
                data.append(_error_field(line[6:]))
            # comments (":"), event, id, retry and unknown fields: nothing to keep
        return out

    def _event(self, payload: bytes, nbytes: int) -> Any:
        if payload.startswith(b"[DONE]"):
            return DONE
        try:
            d = _loads(payload)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise MalformedStream(f"{self._name}: malformed stream line ({e})") from e
        if type(d) is not dict:
            raise MalformedStream(
                f"{self._name}: malformed stream line (expected a JSON object, got "
                f"{type(d).__name__})"
            )
        error = d.get("error")
        if error:
            raise stream_error(self._name, error)
        return chunk_from_dict(d, nbytes)
