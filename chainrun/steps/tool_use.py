"""A model step with tools: rounds of a hedged model call, the tool calls the winner asked
for, and their results, until the model answers in text.

Round r sends the step's messages so far with the tools' definitions through the step's
hedger, as any model call of the step goes (the attempts race; copies go to the hedge
targets). **Each attempt only asks**: only the attempt that won has its tool calls
carried out, through the turn's :class:`~chainrun.tools.TurnTools` (each call at most
once per turn: per step, round and position, with the idempotency key
``"{turn id}:{step}:{round}:{position}"``; a side-effecting
tool waits until the turn is clear to act). A loser that asked for the same tool is
closed like any loser (a shadow loser is read to its end) and its calls are never run.
The results go back to the model as tool messages (an invalid call's error too, so the
model can correct it) and round r + 1 starts.

The answer's text streams to the user as it arrives, in whichever round it comes. The
model calls are bounded by the step's ``deadline_s`` (a tool by its own ``timeout_s``);
the rounds by ``max_tool_rounds``: a model that still asks for tools after that many
rounds fails the step (:class:`~chainrun.errors.ToolRoundsExceeded`), and the step's
``on_failure`` decides what the turn does.

The rounds are raced by the step's :class:`~chainrun.steps.model_call.HedgedCall`
(:meth:`~chainrun.steps.model_call.HedgedCall.run` with a :class:`ToolRounds`), as a call
without tools is: every attempt of every round is a ``calls`` row, numbered within its
round (``calls.round`` says which), and every tool call a ``tool_calls`` row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from chainrun.errors import ToolRoundsExceeded
from chainrun.events import ToolCallEvent
from chainrun.log.rows import ToolCallRow
from chainrun.timing import StreamedToolCall
from chainrun.tools import ToolCall, ToolCallRecord

if TYPE_CHECKING:
    from chainrun.providers.base import ChatRequest, ChatStream
    from chainrun.tools import Tool, TurnTools
    from chainrun.tools.confirm import PendingAction

__all__ = ["ToolRounds", "assistant_message", "tool_call_row"]


def assistant_message(
    text: str, calls: Sequence[ToolCall], reasoning: str | None = None
) -> dict[str, Any]:
    """The assistant message that asked for ``calls`` (Chat Completions shape; the
    Responses adapter turns it into ``function_call`` items), written so that strict
    servers take it back in the next round's history:

    - ``content`` is the round's text or ``""``, never null (Ollama and LM Studio answer
      400 to ``"content": null`` on an assistant tool-call message; the OpenAI API takes
      either);
    - ``arguments`` that are not valid JSON are sent as ``"{}"`` (llama-server answers
      500 to a history whose tool call does not parse, ggml-org/llama.cpp#25510; the
      tool message after it tells the model what was wrong, so it can correct itself);
    - ``reasoning`` (the round's reasoning text, when the server streamed one) is echoed
      as ``reasoning_content``. Source: DeepSeek's Thinking Mode guide
      (https://api-docs.deepseek.com/guides/thinking_mode, "Tool Calls"): the model
      streams ``reasoning_content`` before a round's ``tool_calls`` as before text, and
      when the model called tools between two user messages that assistant message's
      ``reasoning_content`` must be passed back in every later request, of this turn's
      rounds and of later turns (chainrun's history keeps these messages as sent), else
      400; without tool calls it need not be and is ignored. The earlier
      ``deepseek-reasoner`` answered 400 to ``reasoning_content`` in input messages, but
      it offered no function calling, so a tool-call message never reached it. Servers
      that stream no reasoning get no such field.
    """
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text or "",
        "tool_calls": [
            {"id": c.call_id, "type": "function",
             "function": {"name": c.name, "arguments": _valid_json(c.arguments)}}
            for c in calls
        ],
    }  # fmt: skip
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def _valid_json(arguments: str) -> str:
    try:
        json.loads(arguments)
    except ValueError:
        return "{}"
    return arguments


def tool_call_row(record: ToolCallRecord) -> ToolCallRow:
    """The ``tool_calls`` row of a record (a pending action's question and expiry with it)."""
    action = record.action
    return ToolCallRow(
        question=action.question if action else None,
        expires_at=action.expires_at if action else None,
        expires_after_turn=action.expires_after_turn if action else None,
        action_id=record.action_id,
        step=record.step, attempt=record.attempt, round=record.round,
        call_id=record.call.call_id, tool=record.call.name, arguments=record.call.arguments,
        idempotency_key=record.idempotency_key, side_effects=record.side_effects,
        status=record.status, started_offset_ms=record.started_offset_ms,
        duration_ms=record.duration_ms, result=record.content or None,
        error_type=record.error_type, error_message=record.error_message,
        turn_cancelled=record.turn_cancelled,
        wire_notes=",".join(record.call.notes) or None,
    )  # fmt: skip


def _as_calls(streamed: Sequence[StreamedToolCall], round_: int,
              used_ids: set[str]) -> list[ToolCall]:  # fmt: skip
    """The round's calls, each with an id unique in the step's messages: the server's
    own, or ``call_r{round}_{position}`` where it sent none or one already used (a
    constant id, ids restarted each round); ``used_ids`` is updated."""
    calls = []
    for c in streamed:
        notes = c.notes
        call_id = c.id if c.id and c.id not in used_ids else f"call_r{round_}_{c.index}"
        if call_id != c.id:
            notes = (*notes, "id_reused" if c.id else "id_missing")
        used_ids.add(call_id)
        calls.append(ToolCall(call_id=call_id, name=c.name or "", arguments=c.arguments,
                              position=c.index, notes=notes))  # fmt: skip
    return calls


def _event(record: ToolCallRecord, phase: str, step_offset_ms: float) -> ToolCallEvent:
    started = record.started_offset_ms
    return ToolCallEvent(
        step=record.step, phase=phase, tool=record.call.name,  # type: ignore[arg-type]
        call_id=record.call.call_id, round=record.round, side_effects=record.side_effects,
        status=record.status if phase == "finished" else None,
        started_offset_ms=None if started is None else step_offset_ms + started,
        duration_ms=record.duration_ms if phase == "finished" else None,
        error_type=record.error_type if phase == "finished" else None,
        idempotency_key=record.idempotency_key,
        action=record.action.as_json() if record.action is not None else None,
    )  # fmt: skip


class ToolRounds:
    """One turn's tool loop of a step: the tools offered, the messages so far and the
    tools' results (see the module text).

    Args:
        step: the step's name.
        tools: the step's tools by name.
        offered: the names of those offered this turn.
        max_rounds: rounds of tool calls at most (``max_tool_rounds``).
        turn_tools: the turn's tool calls (each run at most once per turn).
        state: the turn-state values a tool's arguments may name.

    Raises:
        RuntimeError: ``turn_tools`` is None (the step runs outside a chain turn).
    """

    def __init__(
        self, step: str, tools: Mapping[str, Tool], offered: Sequence[str], *,
        max_rounds: int, turn_tools: TurnTools | None, state: Mapping[str, str],
        t0: float,
    ) -> None:  # fmt: skip
        if turn_tools is None:  # run outside a chain turn (a test, a library user)
            raise RuntimeError(f"step {step} has tools but its turn has no TurnTools")
        self.step = step
        self.offered = list(offered)
        self.definitions = [tools[name].definition() for name in self.offered]
        self.max_rounds = max_rounds
        self.turn_tools = turn_tools
        self.state = state
        self.t0 = t0
        self.messages: list[dict[str, Any]] | None = None
        #: call ids in the messages so far (unique per step)
        self.used_ids: set[str] = set()
        #: the last result of each tool called, by tool name (JSON decoded)
        self.results: dict[str, Any] = {}
        #: the pending actions the last round's calls became (``confirm`` tools): the
        #: step ends with chainrun's question as the rest of its answer
        self.awaiting: list[PendingAction] = []

    def question(self, text_before: str) -> str:
        """What the step adds to its answer when the round asked for ``confirm`` tools:
        chainrun's question (one per action), after the round's text when it had any."""
        questions = " ".join(a.question for a in self.awaiting)
        return f"\n\n{questions}" if text_before.strip() else questions

    async def confirmed_round(
        self, base: ChatRequest, *, step_offset_ms: float
    ) -> AsyncGenerator[ToolCallEvent, None]:
        """Round 0: carry out the actions the shopper confirmed for this step (their
        recorded arguments, the model not asked to restate them), before the model's first
        round; the calls and their results join the messages, so the model answers from
        them. Nothing when there are none."""
        actions = self.turn_tools.confirmed_for(self.step)
        if not actions:
            return
        if self.messages is None:
            self.messages = list(base.messages)
        calls, records = [], []
        for position, action in enumerate(actions):
            record: ToolCallRecord | None = None
            phases = self.turn_tools.run_confirmed(action, step=self.step, position=position,
                                                   t0=self.t0, state=self.state)  # fmt: skip
            async with contextlib.aclosing(phases):
                async for phase, record in phases:
                    yield _event(record, phase, step_offset_ms)
            assert record is not None
            calls.append(record.call)
            records.append(record)
            self.used_ids.add(record.call.call_id)
        self.messages.append(assistant_message("", calls))
        for record in records:
            self.messages.append({"role": "tool", "tool_call_id": record.call.call_id,
                                  "content": record.content})  # fmt: skip
            if record.ok:
                self.results[record.call.name] = json.loads(record.content)

    def request(self, base: ChatRequest) -> ChatRequest:
        """The next round's request: ``base`` with the messages so far and the tools."""
        if self.messages is None:
            self.messages = list(base.messages)
        return dataclasses.replace(base, messages=list(self.messages), tools=self.definitions)

    def asked(self, winner: ChatStream, round_: int) -> list[ToolCall]:
        """The tool calls round ``round_``'s winner asked for (none: it answered).

        Raises:
            ToolRoundsExceeded: it asked after ``max_rounds`` rounds of tool calls.
        """
        calls = _as_calls(winner.timer.tool_calls, round_, self.used_ids)
        if calls and round_ > self.max_rounds:
            names = ", ".join(c.name for c in calls)
            raise ToolRoundsExceeded(
                f"{self.step}: the model still asked for tools ({names}) after "
                f"max_tool_rounds = {self.max_rounds} rounds"
            )
        return calls

    async def carry_out(
        self, calls: list[ToolCall], *, text: str, reasoning: str | None, attempt: int,
        round_: int, step_offset_ms: float,
    ) -> AsyncGenerator[ToolCallEvent, None]:  # fmt: skip
        """Run the calls a round's winner asked for (``text``: what else it said,
        ``reasoning``: its reasoning text, echoed back; ``attempt``: its number within
        round ``round_``), one after another, yielding a
        :class:`~chainrun.events.ToolCallEvent` as each starts and ends (offsets from the
        turn's start: the step's ``step_offset_ms`` added); their results (an invalid
        call's error too) become the next round's tool messages."""
        assert self.messages is not None
        self.messages.append(assistant_message(text, calls, reasoning))
        for call in calls:
            record: ToolCallRecord | None = None
            phases = self.turn_tools.phases(
                call, step=self.step, attempt=attempt, round=round_,
                t0=self.t0, state=self.state, only=self.offered,
            )  # fmt: skip
            async with contextlib.aclosing(phases):
                async for phase, record in phases:
                    yield _event(record, phase, step_offset_ms)
            assert record is not None
            self.messages.append({"role": "tool", "tool_call_id": call.call_id,
                                  "content": record.content})  # fmt: skip
            if record.ok:
                self.results[call.name] = json.loads(record.content)
            if record.action is not None:
                self.awaiting.append(record.action)

    def rows(self) -> list[ToolCallRow]:
        """The step's ``tool_calls`` rows so far."""
        return [tool_call_row(r) for r in self.turn_tools.records_of(self.step)]
