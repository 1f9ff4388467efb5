"""Server families in the lab: the planned stream reshaped as each family sends it.

OpenAI-compatible servers speak the same API with habits of their own, each reported in
public in 2025-2026 (the :data:`SERVER_PROFILES` entries name their sources). A scenario
with ``server = "ollama"`` (``chainrun lab serve --scenario fast --server ollama``) plays
its planned stream (latency, tokens, tool calls, faults) and then reshapes every frame
as that family would send it: tool-call ids, indexes, name fragments and argument
shapes; where the reasoning goes; the usage fields; and the requests it refuses for what
their history holds (:class:`~chainrun.lab.scenarios.StrictHistory`). The timing of the
planned frames is kept: a frame is reshaped when it is due (a call whose pieces must be
sent whole, such as arguments as a JSON object, is sent once its last piece is due).

Pure but for the async generator that wraps the stream: :class:`FrameShaper` turns one
frame's bytes into the frames to send.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from chainrun.lab.names import SERVER_FAMILY_NAMES
from chainrun.lab.scenarios import StrictHistory

__all__ = ["SERVER_PROFILES", "FrameShaper", "ServerProfile", "reshape_stream"]


class ServerProfile(BaseModel):
    """How one server family sends the Chat Completions stream (see the module text).

    Attributes:
        family: the family's name.
        source: where the habits are documented or reported.
        tool_call_ids: ``unique`` (the API's), ``constant`` (one id for every call:
            ``call_0``), ``per_round`` (``name:position``, restarted each round).
        tool_call_index: ``api``, ``all_zero`` (parallel calls all on index 0) or
            ``missing`` (no index).
        parallel_calls: how many calls an answer that calls a tool holds (the planned
            call, then copies at the next positions).
        name_fragments: the function name arrives in two pieces.
        arguments: ``text`` (the API's JSON text in pieces) or ``object`` (one JSON object).
        usage: ``openai``; ``deepseek`` (cached tokens as top-level
            ``prompt_cache_hit_tokens``/``prompt_cache_miss_tokens``); ``no_details``
            (neither cached nor reasoning counts); ``on_finish`` (on the finish chunk).
        reasoning: ``none``, ``reasoning_content`` (``delta.reasoning_content`` before the
            text) or ``think_in_content`` (``<think>...</think>`` inside ``content``).
        filter_frames: Azure's ``prompt_filter_results`` first frame and
            ``content_filter_results`` on every choice.
        strict_history: what the family refuses in a request's earlier turns.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str
    source: str
    tool_call_ids: Literal["unique", "constant", "per_round"] = "unique"
    tool_call_index: Literal["api", "all_zero", "missing"] = "api"
    parallel_calls: int = Field(default=1, ge=1, le=4)
    name_fragments: bool = False
    arguments: Literal["text", "object"] = "text"
    usage: Literal["openai", "deepseek", "no_details", "on_finish"] = "openai"
    reasoning: Literal["none", "reasoning_content", "think_in_content"] = "none"
    filter_frames: bool = False
    strict_history: StrictHistory = StrictHistory()


#: The families a shop puts chainrun in front of, with their habits.
SERVER_PROFILES: dict[str, ServerProfile] = {
    p.family: p
    for p in (
        ServerProfile(family="openai", source="OpenAI API reference, Chat Completions streaming"),
        ServerProfile(family="azure", filter_frames=True,
                      source="Azure OpenAI reference: content filtering in streamed chunks"),
        ServerProfile(family="llama.cpp", tool_call_ids="constant", reasoning="reasoning_content",
                      strict_history=StrictHistory(arguments_must_parse=True),
                      source="ggml-org/llama.cpp#20198 (one constant id), #25510 (500 on a "
                             "history whose arguments do not parse); tools/server README"),
        ServerProfile(family="vllm", reasoning="reasoning_content",
                      source="vLLM docs: reasoning outputs (delta.reasoning_content)"),
        ServerProfile(family="ollama", tool_call_index="all_zero", parallel_calls=2,
                      usage="no_details", strict_history=StrictHistory(content_null=True),
                      source="Ollama's OpenAI compatibility behind proxies: parallel calls on "
                             "index 0; 400 on null content"),
        ServerProfile(family="lmstudio", usage="no_details",
                      strict_history=StrictHistory(content_null=True),
                      source="LM Studio's OpenAI-compatible server: 400 on null content"),
        ServerProfile(family="deepseek", usage="deepseek", reasoning="reasoning_content",
                      strict_history=StrictHistory(reasoning_content=True),
                      source="api-docs.deepseek.com: context caching (prompt_cache_hit_tokens); "
                             "guides/thinking_mode: reasoning_content streamed before a "
                             "round's tool calls too, and a 400 unless every later request "
                             "passes it back on that tool-call message"),
        ServerProfile(family="gemini", tool_call_index="missing", parallel_calls=2,
                      name_fragments=True,
                      source="Gemini API OpenAI compatibility: tool calls without index, names "
                             "streamed in fragments"),
        ServerProfile(family="mistral", usage="on_finish", tool_call_ids="per_round",
                      source="Mistral API: usage on the last chunk; kimi/grok-style ids "
                             "restarted each round"),
        ServerProfile(family="minimax", reasoning="think_in_content",
                      source="MiniMax M2: <think>...</think> inside content"),
    )
}  # fmt: skip

assert tuple(SERVER_PROFILES) == SERVER_FAMILY_NAMES, "names.py lists every family"

#: the thought a ``think_in_content`` or ``reasoning_content`` family sends before its text
THOUGHT = ["The shopper", " asks; answer", " briefly."]


class FrameShaper:
    """Reshapes one stream's frames as ``profile`` sends them (round ``round_`` of a tool
    loop: ids that restart per round use it). Feed each frame's bytes (without the blank
    line) to :meth:`frame`; it returns the frames to send (each ending in ``\\n\\n``)."""

    def __init__(self, profile: ServerProfile, round_: int = 1) -> None:
        self.p = profile
        self.round = round_
        self._head: dict[str, Any] | None = None
        self._started_text = False
        self._calls: dict[int, dict[str, Any]] = {}  # planned index -> {id, name, args}
        self._held_finish: dict[str, Any] | None = None
        self._whole = (profile.arguments == "object" or profile.parallel_calls > 1
                       or profile.tool_call_index != "api")  # fmt: skip

    @staticmethod
    def _encode(doc: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(doc)}\n\n".encode()

    def _doc(self, delta: dict[str, Any] | None, finish: str | None = None,
             usage: Any = None) -> dict[str, Any]:  # fmt: skip
        assert self._head is not None
        choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "logprobs": None,
                                  "finish_reason": finish}  # fmt: skip
        if self.p.filter_frames:
            choice["content_filter_results"] = {}
        return {**self._head, "choices": [] if delta is None else [choice], "usage": usage}

    def frame(self, raw: bytes) -> list[bytes]:
        """The frames to send for one planned frame ``raw`` (``data: ...`` bytes)."""
        out: list[bytes] = []
        if not raw.startswith(b"data: ") or raw.strip() == b"data: [DONE]":
            if raw.strip() == b"data: [DONE]" and self._held_finish is not None:
                out.append(self._encode(self._held_finish))
                self._held_finish = None
            return [*out, raw + b"\n\n"]
        doc = json.loads(raw[len(b"data: "):])
        if self._head is None:
            self._head = {k: doc[k] for k in ("id", "object", "created", "model") if k in doc}
            if self.p.filter_frames:
                out.append(self._encode({**self._head, "choices": [], "prompt_filter_results": [
                    {"prompt_index": 0, "content_filter_results": {}}]}))  # fmt: skip
        if doc.get("usage"):
            doc["usage"] = self._usage(doc["usage"])
        choices = doc.get("choices") or []
        if not choices:  # the usage-only frame
            if self._held_finish is not None:
                self._held_finish["usage"] = doc.get("usage")
                out.append(self._encode(self._held_finish))
                self._held_finish = None
                return out
            return [*out, self._encode(doc)]
        choice = choices[0]
        delta = choice.get("delta") or {}
        finish = choice.get("finish_reason")
        if delta.get("content") and not self._started_text:
            self._started_text = True
            out += self._thought()
        if delta.get("tool_calls"):
            if not self._started_text and self.p.strict_history.reasoning_content:
                # a family that wants a tool round's reasoning_content back sends one:
                # DeepSeek's thinking mode streams it ahead of the round's tool_calls
                # (api-docs.deepseek.com/guides/thinking_mode, "Tool Calls"); without it
                # here no client could send the history the lab then demands
                self._started_text = True
                out += self._thought()
            out += self._tool_pieces(delta)
            delta = {k: v for k, v in delta.items() if k != "tool_calls"}
            if not finish and not delta.get("content") and set(delta) <= {"role", "content"}:
                if delta.get("role"):
                    out.append(self._encode(self._doc({"role": "assistant", "content": None})))
                return out
        if finish:
            if self._calls and self._whole:
                out += self._whole_calls()
            fin = self._doc(delta or {}, finish, doc.get("usage"))
            if self.p.usage == "on_finish" and not doc.get("usage"):
                self._held_finish = fin  # the usage frame that follows joins it
                return out
            return [*out, self._encode(fin)]
        return [*out, self._encode(self._doc(delta, None, doc.get("usage")))]

    def _thought(self) -> list[bytes]:
        if self.p.reasoning == "reasoning_content":
            return [self._encode(self._doc({"reasoning_content": t})) for t in THOUGHT]
        if self.p.reasoning == "think_in_content":
            pieces = ["<think>", *THOUGHT, "</think>\n\n"]
            return [self._encode(self._doc({"content": t})) for t in pieces]
        return []

    def _usage(self, u: dict[str, Any]) -> dict[str, Any]:
        u = dict(u)
        if self.p.usage == "deepseek":
            cached = (u.pop("prompt_tokens_details", None) or {}).get("cached_tokens") or 0
            u["prompt_cache_hit_tokens"] = cached
            u["prompt_cache_miss_tokens"] = (u.get("prompt_tokens") or 0) - cached
        elif self.p.usage == "no_details":
            u.pop("prompt_tokens_details", None)
            u.pop("completion_tokens_details", None)
        return u

    def _call_id(self, planned: str | None, position: int, name: str) -> str:
        if self.p.tool_call_ids == "constant":
            return "call_0"
        if self.p.tool_call_ids == "per_round":
            return f"{name}:{position}"
        return f"{planned}_{position}" if position else str(planned)

    def _tool_pieces(self, delta: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        for piece in delta["tool_calls"]:
            fn = piece.get("function") or {}
            call = self._calls.setdefault(piece.get("index", 0), {"id": None, "name": None,
                                                                  "args": []})  # fmt: skip
            call["id"] = call["id"] or piece.get("id")
            call["name"] = call["name"] or fn.get("name")
            if fn.get("arguments"):
                call["args"].append(fn["arguments"])
            if self._whole:
                continue  # sent whole with the finish frame
            if piece.get("id") or fn.get("name"):  # the call's first piece
                name = call["name"] or ""
                first: dict[str, Any] = {"index": 0, "id": self._call_id(call["id"], 0, name),
                                         "type": "function", "function": {"name": name}}
                if self.p.name_fragments and len(name) > 1:
                    cut = len(name) // 2
                    first["function"]["name"] = name[:cut]
                    out.append(self._encode(self._doc({"tool_calls": [first]})))
                    first = {"index": 0, "function": {"name": name[cut:]}}
                first["function"]["arguments"] = fn.get("arguments") or ""
                out.append(self._encode(self._doc({"tool_calls": [first]})))
            else:
                out.append(self._encode(self._doc({"tool_calls": [
                    {"index": 0, "function": {"arguments": fn.get("arguments") or ""}}]})))
        return out

    def _whole_calls(self) -> list[bytes]:
        """Every planned call (and its copies) as one piece each, in order."""
        out: list[bytes] = []
        position = 0
        for call in self._calls.values():
            text = "".join(call["args"])
            for _ in range(self.p.parallel_calls):
                name = call["name"] or ""
                piece: dict[str, Any] = {"id": self._call_id(call["id"], position, name),
                                         "type": "function", "function": {"name": name}}
                if self.p.tool_call_index == "api":
                    piece["index"] = position
                elif self.p.tool_call_index == "all_zero":
                    piece["index"] = 0
                piece["function"]["arguments"] = (json.loads(text or "{}")
                                                  if self.p.arguments == "object" else text)
                if self.p.name_fragments and len(name) > 1:
                    cut = len(name) // 2
                    head = {**piece, "function": {"name": name[:cut]}}
                    out.append(self._encode(self._doc({"tool_calls": [head]})))
                    piece = {k: v for k, v in piece.items() if k not in ("id", "type")}
                    piece["function"] = {"name": name[cut:],
                                         "arguments": piece["function"]["arguments"]}
                out.append(self._encode(self._doc({"tool_calls": [piece]})))
                position += 1
        self._calls.clear()
        return out


async def reshape_stream(events: AsyncGenerator[bytes, None], profile: ServerProfile,
                         round_: int = 1) -> AsyncGenerator[bytes, None]:  # fmt: skip
    """``events`` (the planned stream's bytes) as ``profile``'s family sends them; closing
    this stream closes ``events`` (the lab records a client that left)."""
    shaper = FrameShaper(profile, round_)
    buffer = b""
    try:
        async for part in events:
            buffer += part
            out: list[bytes] = []
            while b"\n\n" in buffer:
                raw, buffer = buffer.split(b"\n\n", 1)
                out += shaper.frame(raw)
            if out:
                yield b"".join(out)
        if buffer:
            yield buffer
    finally:
        await events.aclose()


#: The features of the compatibility table (docs/reference/compatibility.md), in order.
FEATURES: tuple[str, ...] = ("streamed TTFT", "usage", "cached tokens", "reasoning tokens",
                             "reasoning text", "tool calls", "response_format")  # fmt: skip


def expected_cell(profile: ServerProfile, feature: str) -> str:
    """What chainrun does with ``feature`` when ``profile``'s family serves it: the cell
    of the compatibility table, which ``tests/test_server_compatibility.py`` checks by
    running the feature against the lab sending as that family.

    Raises:
        KeyError: a feature not in :data:`FEATURES`.
    """
    details = profile.usage != "no_details"
    cells = {
        "streamed TTFT": "yes",
        "usage": "yes" + (" (on the finish chunk)" if profile.usage == "on_finish" else ""),
        "cached tokens": ("yes (`prompt_cache_hit_tokens`)" if profile.usage == "deepseek"
                          else "yes" if details else "unknown: not reported"),
        "reasoning tokens": "yes" if details else "unknown: not reported",
        "reasoning text": {"none": "none sent",
                           "reasoning_content": "logged as reasoning (`reasoning_content`)",
                           "think_in_content": "moved out of the answer (`<think>` in content)",
                           }[profile.reasoning],
        "tool calls": "yes" + (f", {profile.parallel_calls} in parallel"
                               if profile.parallel_calls > 1 else "")
                      + (" (its `reasoning_content` passed back)"
                         if profile.strict_history.reasoning_content else ""),
        "response_format": "yes",
    }  # fmt: skip
    return cells[feature]


def compatibility_table() -> str:
    """The compatibility table as Markdown: a row per family, a column per feature."""
    lines = ["| server family | " + " | ".join(FEATURES) + " |",
             "|---|" + "---|" * len(FEATURES)]  # fmt: skip
    for p in SERVER_PROFILES.values():
        cells = [expected_cell(p, f) for f in FEATURES]
        lines.append(f"| {p.family} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
