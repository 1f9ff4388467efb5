"""Timing and token capture for one streamed model call: a pure accumulator (no I/O).

Feed it ``(t, chunk)`` pairs as the chunks arrive (``t`` in s from any monotonic
clock, the same one as ``t_start``) and it yields the call's:

- **TTFT** (time to first token): from sending the request to the first chunk that
  carries content *or reasoning* text. A role-only frame with empty content (what
  llama.cpp sends first) is not a first token. OpenTelemetry GenAI:
  ``gen_ai.client.operation.time_to_first_chunk``.
  An answer that is empty because the model stopped at once gets the time of its
  finish chunk (its first token was a stop sequence that is never sent as text).
- **chunks**: a *chunk* is a streamed event that carries generated text (content or
  reasoning), a piece of a tool call, a finish reason or the usage. Events that carry
  none of these are no chunks: a role-only first frame (llama.cpp, OpenAI), Azure
  OpenAI's content-filter events (a first event with ``choices: []`` and
  ``prompt_filter_results``, an event whose choice has ``content_filter_results`` and no
  ``delta``), the Responses API's bookkeeping events. Their bytes are counted on the
  next chunk; they add no chunk and no gap. ``n_chunks`` counts chunks, and every
  figure that reads gaps uses this definition (docs: concepts/measurements.md, "Chunks").
- **chunk gaps**: the time between every two consecutive chunks, in ms (so
  ``len(chunk_gaps_ms) == n_chunks - 1``); the mean over the chunks that carry text
  is the time between tokens.
- **duration**: from sending to the end of the stream (``gen_ai.client.operation.duration``).
- **tokens** from the provider's usage: input, output, reasoning (a *subset* of output,
  never added on top: OpenAI ``completion_tokens_details.reasoning_tokens``), cached
  (a subset of input). A stream without usage leaves them ``None`` (unknown), never 0.
- **truncated**: the stream ended without a ``finish_reason``.
- **tool calls**: the pieces of each tool call put together by index
  (:attr:`StreamTimer.tool_calls`); they are no tokens for the TTFT (an answer that is
  only a tool call has none: ``first_tool_call_ms`` says when its first piece came).

Testable with a list of (time, chunk) pairs; see tests/test_timing.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Usage:
    """Token counts reported by the provider; ``None`` = not reported (unknown)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_input_tokens: int | None = None


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of one streamed tool call, as a chunk carries it (Chat Completions
    ``delta.tool_calls[]``; Responses ``function_call`` items and argument deltas).

    ``index`` tells the calls of one answer apart; ``id`` and ``name`` arrive with a
    call's first piece, ``arguments`` is a piece of the arguments' JSON text (the pieces
    of one index concatenate to the whole; OpenAI API reference, "Function calling").
    Servers bend these rules (:class:`ToolCallAssembler` says how each is read): ``index``
    is None when the server sent none, and ``notes`` names what the wire reader already
    mended (``"arguments_object"``: arguments sent as a JSON object, serialised).
    """

    index: int | None
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StreamedToolCall:
    """One whole tool call of an answer: its pieces put together (``arguments``: JSON text
    as the model wrote it, not yet validated).

    ``index`` is the call's position among the answer's calls (0, 1, ... in the order
    their first pieces came: the server's ``index`` on a stream that follows the API);
    ``wire_index`` is the index the server sent with its first piece (None: none);
    ``notes`` lists every normalisation :class:`ToolCallAssembler` made, so none is silent.
    """

    index: int
    id: str | None
    name: str | None
    arguments: str
    wire_index: int | None = None
    notes: tuple[str, ...] = ()


class ToolCallAssembler:
    """Streamed tool-call pieces put together into calls, as real servers send them.

    The API's rule is simple (the pieces of one call share an ``index``; its first piece
    has the ``id`` and ``name``), but OpenAI-compatible servers bend it, as publicly
    reported in 2025-2026: parallel calls that all carry ``index`` 0 or no index
    (Ollama behind proxies, Gemini's compatible endpoint), a function name streamed in
    fragments (Gemini), argument fragments on a shifted index with no id or name,
    arguments as a JSON object (llama.cpp). The rules, in order, for each piece:

    - on an index with an open call, a piece that brings a **different id**, or a
      **name after the call's arguments began** (a call's name comes before its
      arguments), starts a new call (note ``new_call_on_same_index``);
    - a piece **without an index** continues the last call unless it starts a new one
      by the first rule (``index_inferred``);
    - a piece on a **new index with neither id nor name** while a call is open is an
      argument fragment of that call (``fragment_reattached``);
    - otherwise a new index starts a new call;
    - a name on a call that has a name and no arguments yet is a **fragment** joined to
      it (``name_fragments_joined``), unless it restates the name or extends it (the
      name so far is its prefix), which is kept once.

    Pure: no I/O, no clock. :meth:`feed` takes a :class:`ToolCallDelta`; :attr:`calls`
    gives :class:`StreamedToolCall` s in the order of their first pieces.
    """

    __slots__ = ("_by_index", "_last", "_parts")

    def __init__(self) -> None:
        #: each call: [id, name, argument pieces, wire index, notes]
        self._parts: list[list[Any]] = []
        #: wire index -> position of the latest call opened on it
        self._by_index: dict[int, int] = {}
        #: position of the call the last piece went to
        self._last: int | None = None

    def __bool__(self) -> bool:
        return bool(self._parts)

    @staticmethod
    def _starts_new(part: list[Any], d: ToolCallDelta) -> bool:
        if d.id and part[0] and d.id != part[0]:
            return True
        return bool(d.name and part[2])  # a name after arguments: the next call's

    def _open(self, d: ToolCallDelta, notes: tuple[str, ...]) -> list[Any]:
        part: list[Any] = [d.id, None, [], d.index, list(notes)]
        self._parts.append(part)
        self._last = len(self._parts) - 1
        if d.index is not None:
            self._by_index[d.index] = self._last
        return part

    def _locate(self, d: ToolCallDelta) -> list[Any]:
        """The call piece ``d`` belongs to (opened here when it starts one)."""
        if d.index is not None and d.index in self._by_index:
            here = self._parts[self._by_index[d.index]]
            if self._starts_new(here, d):
                return self._open(d, ("new_call_on_same_index",))
            self._last = self._by_index[d.index]
            return here
        last = None if self._last is None else self._parts[self._last]
        if d.index is None:
            if last is None or self._starts_new(last, d):
                return self._open(d, ("index_inferred",))
            _note(last, "index_inferred")
            return last
        if last is not None and d.id is None and d.name is None and d.arguments:
            _note(last, "fragment_reattached")
            return last
        return self._open(d, ())

    def feed(self, d: ToolCallDelta) -> None:
        """Add one piece (see the class text for which call it joins)."""
        part = self._locate(d)
        for note in d.notes:
            _note(part, note)
        if d.id and not part[0]:
            part[0] = d.id
        if d.name:
            name = part[1]
            if not name or d.name.startswith(name):
                part[1] = d.name
            elif not name.endswith(d.name):
                part[1] = name + d.name
                _note(part, "name_fragments_joined")
        if d.arguments:
            part[2].append(d.arguments)

    @property
    def calls(self) -> list[StreamedToolCall]:
        """The calls so far, in order of their first pieces (whole once the stream ended)."""
        return [StreamedToolCall(i, p[0], p[1], "".join(p[2]), p[3], tuple(p[4]))
                for i, p in enumerate(self._parts)]  # fmt: skip


def _note(part: list[Any], note: str) -> None:
    if note not in part[4]:
        part[4].append(note)


@dataclass(frozen=True)
class Chunk:
    """One streamed chunk, normalised from the provider's wire format.

    ``nbytes`` is the size of the chunk as received (for cost of cancelled losers).
    """

    content: str | None = None
    reasoning: str | None = None
    role: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    response_id: str | None = None
    server_timings: dict[str, Any] | None = None
    nbytes: int = 0
    #: pieces of tool calls this chunk carries (None: none)
    tool_calls: tuple[ToolCallDelta, ...] | None = None

    @property
    def has_token(self) -> bool:
        """True when the chunk carries generated text (content or reasoning)."""
        return bool(self.content) or bool(self.reasoning)


_new = object.__new__
_set = object.__setattr__


def make_chunk(
    content: str | None,
    reasoning: str | None,
    role: str | None,
    finish_reason: str | None,
    usage: Usage | None,
    model: str | None,
    response_id: str | None,
    server_timings: dict[str, Any] | None,
    nbytes: int,
    tool_calls: tuple[ToolCallDelta, ...] | None = None,
) -> Chunk:
    """``Chunk(...)`` with every field given, built in one step: equal to the dataclass's
    own constructor, in about half its time (a frozen dataclass's ``__init__`` sets each
    of its nine fields through ``object.__setattr__``; measured 1.85 µs vs 0.93 µs on
    CPython 3.11). For providers' per-chunk path."""
    chunk = _new(Chunk)
    _set(chunk, "__dict__", {
        "content": content, "reasoning": reasoning, "role": role,
        "finish_reason": finish_reason, "usage": usage, "model": model,
        "response_id": response_id, "server_timings": server_timings, "nbytes": nbytes,
        "tool_calls": tool_calls,
    })  # fmt: skip
    return chunk


@dataclass
class StreamTimer:
    """Accumulates one call's timings and tokens. All ``*_ms`` values are in ms.

    Args:
        t_start: when the request was sent, in s (same clock as the ``t`` fed later).
    """

    t_start: float
    #: every streamed event handed to :meth:`on_chunk`, chunks or not
    n_events: int = 0
    n_chunks: int = 0
    nbytes: int = 0
    ttft_ms: float | None = None
    duration_ms: float | None = None
    chunk_gaps_ms: list[float] = field(default_factory=list)
    token_chunk_gaps_ms: list[float] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    response_id: str | None = None
    server_timings: dict[str, Any] | None = None
    ended: bool = False
    #: when the first piece of a tool call arrived, ms from the start (None: no tool call)
    first_tool_call_ms: float | None = None
    _t_last: float | None = None
    _t_last_token: float | None = None
    #: the answer's tool calls being put together
    _tool_parts: ToolCallAssembler = field(default_factory=ToolCallAssembler)

    def on_chunk(self, t: float, chunk: Chunk) -> None:
        """Record a streamed event that arrived at time ``t`` (s): a chunk when it
        carries text, a piece of a tool call, a finish reason or usage; otherwise only
        its bytes, model and id are kept (see the module text: what a chunk is)."""
        self.n_events += 1
        if not (chunk.content or chunk.reasoning or chunk.tool_calls or chunk.finish_reason
                or chunk.usage is not None):  # fmt: skip
            self.nbytes += chunk.nbytes
            self.model = chunk.model or self.model
            self.response_id = chunk.response_id or self.response_id
            if chunk.server_timings:
                self.server_timings = chunk.server_timings
            return
        if self._t_last is not None:
            self.chunk_gaps_ms.append((t - self._t_last) * 1000.0)
        self._t_last = t
        self.n_chunks += 1
        self.nbytes += chunk.nbytes
        if chunk.tool_calls:
            self._on_tool_calls(t, chunk.tool_calls)
        if chunk.content or chunk.reasoning:  # Chunk.has_token, without a property call
            if self.ttft_ms is None:
                self.ttft_ms = (t - self.t_start) * 1000.0
            if self._t_last_token is not None:
                self.token_chunk_gaps_ms.append((t - self._t_last_token) * 1000.0)
            self._t_last_token = t
        elif (chunk.finish_reason and self.ttft_ms is None and not self.content
              and not self._tool_parts):  # fmt: skip
            # The model stopped at once (its first token was a stop sequence or EOS,
            # which servers do not send as text): the finish chunk is the first evidence
            # of a generated token, so it marks the TTFT of this empty answer.
            self.ttft_ms = (t - self.t_start) * 1000.0
        if chunk.content:
            self.content.append(chunk.content)
        if chunk.reasoning:
            self.reasoning.append(chunk.reasoning)
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage
        self.model = chunk.model or self.model
        self.response_id = chunk.response_id or self.response_id
        if chunk.server_timings:
            self.server_timings = chunk.server_timings

    def _on_tool_calls(self, t: float, deltas: tuple[ToolCallDelta, ...]) -> None:
        if self.first_tool_call_ms is None:
            self.first_tool_call_ms = (t - self.t_start) * 1000.0
        for d in deltas:
            self._tool_parts.feed(d)

    @property
    def tool_calls(self) -> list[StreamedToolCall]:
        """The tool calls the answer holds so far, in order (whole once the stream ended;
        :class:`ToolCallAssembler` says how servers' pieces are read)."""
        return self._tool_parts.calls

    def on_end(self, t: float) -> None:
        """Record the end of the stream (normal end, error or cancel) at time ``t`` (s)."""
        if not self.ended:
            self.duration_ms = (t - self.t_start) * 1000.0
            self.ended = True

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def truncated(self) -> bool:
        """The stream started (an event arrived) and ended without a finish_reason (cut,
        cancelled or failed). A call that failed before any event is not truncated.
        An answer stopped by the token cap has finish reason ``length``: see
        :attr:`cut_at_limit`."""
        return self.ended and self.n_events > 0 and self.finish_reason is None

    @property
    def cut_at_limit(self) -> bool:
        """The model was stopped by the token cap (finish reason ``length``; the
        Responses API's ``response.incomplete`` with reason ``max_output_tokens``)."""
        return self.finish_reason == "length"

    @property
    def time_between_tokens_ms(self) -> float | None:
        """Mean gap between chunks that carried tokens, in ms (None with < 2 such chunks)."""
        gaps = self.token_chunk_gaps_ms
        return sum(gaps) / len(gaps) if gaps else None
