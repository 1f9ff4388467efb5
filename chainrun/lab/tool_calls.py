"""The lab's tool calls: when a request offers ``tools``, the lab can answer by calling one.

Pure (no I/O): :func:`plan_tool_answer` reads a request's tools and conversation and
says what to send, the server streams it. A scenario turns it on with a
``[tool_calls]`` table::

    [tool_calls]
    rounds = 2              # answers with a tool call in the first 2 rounds, then text
    malformed_rounds = [1]  # round 1's arguments break the tool's schema
    fragments = 3           # the arguments' JSON text arrives in 3 pieces
    tool = "add_to_cart"    # the tool to call (default: the first one offered)

A *round* is one model answer after the shopper's last message: round 1 answers the
message, round 2 answers the first tool results, and so on (counted from the assistant
tool-call messages, or Responses ``function_call`` items, since the last user message).

Arguments are filled from the tool's ``parameters`` schema and the shopper's last
message, deterministically: an ``enum`` property takes the value that shares the most
words with the message (:func:`closest_value`; the first on a tie); an integer (or
number) one the next number written alone in the message (1 when none is left); a
string one the next word of letters and digits (a SKU such as ``JKT-12``), else the next
lone number as text (an order number), else ``"lab"``; a boolean is true.
A malformed round breaks the first required property's type (an integer becomes the
word ``"two"``, any other type the number 12345), so a client's validation catches it.

With the scenario's ``schema_answers``, a request that asks for an answer following a
JSON Schema (Chat Completions ``response_format`` json_schema, Responses ``text.format``)
and calls no tool gets a JSON object filled the same way (:func:`schema_answer`), as a
server that enforces the schema with a grammar would answer: a classify step whose
labels are an ``enum`` gets the label its words best match.

After the last round the answer is text made from the tool results it was sent:
``"<tool>: <result>"`` for each result of the latest round, so that a test can see the
answer came from the tool (e.g. an order status the lab could not know otherwise).

Wire shapes: OpenAI API reference, "Function calling" (Chat Completions streamed
``delta.tool_calls`` with ``index``, ``id``, ``type``, ``function.name`` on the first
fragment and ``function.arguments`` pieces after it, ``finish_reason = "tool_calls"``;
Responses ``function_call`` output items with ``call_id``, ``name``, ``arguments`` and
``response.function_call_arguments.delta`` events).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LabToolCall", "ToolCallsConfig", "closest_value", "conversation_round",
           "plan_tool_answer", "schema_answer", "split_fragments",
           "tool_results_text"]  # fmt: skip


class ToolCallsConfig(BaseModel):
    """A scenario's ``[tool_calls]`` table (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: rounds answered with a tool call before the text answer
    rounds: int = Field(default=1, ge=1, le=16)
    #: rounds whose arguments break the tool's schema
    malformed_rounds: list[int] = Field(default_factory=list)
    #: the arguments' JSON text arrives in this many streamed pieces
    fragments: int = Field(default=3, ge=1, le=64)
    #: the tool called (unset: the first the request offers)
    tool: str | None = None


@dataclass(frozen=True)
class LabToolCall:
    """One tool call the lab will send.

    Attributes:
        call_id: ``call_<hash>_<round>`` (stable for a conversation and round).
        name: the tool's name.
        arguments: the arguments' JSON text.
        round: the round it answers.
        malformed: the arguments break the tool's schema on purpose.
    """

    call_id: str
    name: str
    arguments: str
    round: int
    malformed: bool


def _offered(tools: Any) -> list[dict[str, Any]]:
    """The offered tools as ``{"name", "parameters"}``, from Chat Completions
    (``{"type": "function", "function": {...}}``) or Responses (flat) shapes."""
    out = []
    for t in tools if isinstance(tools, list) else []:
        if not isinstance(t, dict):
            continue
        inner = t.get("function")
        fn: dict[str, Any] = inner if isinstance(inner, dict) else t
        params = fn.get("parameters")
        if isinstance(fn.get("name"), str):
            out.append({"name": fn["name"], "parameters": params if isinstance(params, dict)
                        else {}})  # fmt: skip
    return out


def _is_tool_call_turn(m: dict[str, Any]) -> bool:
    return (m.get("role") == "assistant" and bool(m.get("tool_calls"))) or m.get(
        "type"
    ) == "function_call"


def _is_tool_result(m: dict[str, Any]) -> bool:
    return m.get("role") == "tool" or m.get("type") == "function_call_output"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def conversation_round(messages: list[Any]) -> tuple[int, str]:
    """``(round, last user text)``: the round this answer is (1 + tool-call turns since
    the last user message; consecutive Responses ``function_call`` items are one turn)."""
    round_ = 1
    user = ""
    previous_was_call = False
    for m in messages:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "user":
            round_, user, previous_was_call = 1, _text(m.get("content")), False
            continue
        call = _is_tool_call_turn(m)
        if call and not (previous_was_call and m.get("type") == "function_call"):
            round_ += 1
        previous_was_call = call
    return round_, user


def _properties(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


def closest_value(values: list[Any], message: str) -> Any:
    """The value sharing the most words with ``message`` (a value's words: split on
    ``_``, ``-`` and spaces; case ignored); the first one on a tie."""
    said = set(re.findall(r"[a-z0-9]+", message.lower()))

    def shared(v: Any) -> int:
        return len(set(re.findall(r"[a-z0-9]+", str(v).lower())) & said)

    return max(values, key=shared)  # max keeps the first of equals


def schema_answer(schema: Any, messages: list[Any]) -> str | None:
    """A JSON text that follows ``schema`` (an object schema), filled from the last user
    message as tool arguments are (an ``enum`` takes :func:`closest_value`); None when
    the schema is not an object schema."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    _, user = conversation_round(messages)
    return json.dumps(_fill(schema, user))


def _fill(schema: dict[str, Any], message: str) -> dict[str, Any]:
    tokens = [w.strip(".,!?;:\"'()") for w in message.split()]
    numbers = [t for t in tokens if t.isdigit()]
    ids = [t for t in tokens if re.search(r"\d", t) and re.search(r"[A-Za-z]", t)]
    props = _properties(schema)
    required = [p for p in schema.get("required", []) if p in props]
    args: dict[str, Any] = {}
    for name in [*required, *(p for p in props if p not in required)]:
        spec = props[name] if isinstance(props[name], dict) else {}
        kind = spec.get("type")
        if isinstance(spec.get("enum"), list) and spec["enum"]:
            args[name] = closest_value(spec["enum"], message)
        elif kind in ("integer", "number"):
            args[name] = int(numbers.pop(0)) if numbers else 1
        elif kind == "boolean":
            args[name] = True
        elif kind == "string":
            args[name] = ids.pop(0) if ids else numbers.pop(0) if numbers else "lab"
        elif name in required:
            args[name] = "lab"
    return args


def _break(args: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    props = _properties(schema)
    names = [p for p in schema.get("required", []) if p in props] or list(props)
    if not names:
        return {**args, "unexpected": "lab"}
    first = names[0]
    kind = props[first].get("type") if isinstance(props[first], dict) else None
    return {**args, first: "two" if kind in ("integer", "number") else 12345}


def plan_tool_answer(
    tools: Any, messages: list[Any], config: ToolCallsConfig | None
) -> LabToolCall | None:
    """The tool call to answer with, or None (answer with text: no tools offered, tool
    calls not configured, or the configured rounds are done)."""
    offered = _offered(tools)
    if config is None or not offered:
        return None
    round_, user = conversation_round(messages)
    if round_ > config.rounds:
        return None
    chosen = next((t for t in offered if t["name"] == config.tool), offered[0])
    args = _fill(chosen["parameters"], user)
    malformed = round_ in config.malformed_rounds
    if malformed:
        args = _break(args, chosen["parameters"])
    digest = hashlib.blake2b(f"{user}\0{chosen['name']}".encode(), digest_size=4).hexdigest()
    return LabToolCall(call_id=f"call_{digest}_{round_}", name=chosen["name"],
                       arguments=json.dumps(args), round=round_, malformed=malformed)  # fmt: skip


def split_fragments(text: str, n: int) -> list[str]:
    """``text`` in ``n`` pieces (fewer when it is shorter), concatenating back to it."""
    n = max(1, min(n, len(text)))
    size = -(-len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def tool_results_text(messages: list[Any]) -> str | None:
    """``"<tool>: <result> ..."`` for the tool results after the last tool call (None:
    the conversation ends with no tool result). Names come from the calls' ids."""
    names: dict[str, str] = {}
    results: list[tuple[str, str]] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "user":
            results = []
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            results = []
            for c in m["tool_calls"]:
                if isinstance(c, dict) and isinstance(c.get("function"), dict):
                    names[str(c.get("id"))] = str(c["function"].get("name"))
        elif m.get("type") == "function_call":
            if results:  # a later round's calls: the earlier results are answered
                results = []
            names[str(m.get("call_id"))] = str(m.get("name"))
        elif _is_tool_result(m):
            call_id = str(m.get("tool_call_id") or m.get("call_id"))
            output = m.get("content") if m.get("role") == "tool" else m.get("output")
            results.append((names.get(call_id, "tool"), _text(output)))
    if not results:
        return None
    return " ".join(f"{name}: {output}" for name, output in results)
