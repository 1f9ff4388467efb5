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

Every attempt of every round is a ``calls`` row, numbered on across the rounds (round
2's first attempt follows round 1's last), and every tool call a ``tool_calls`` row.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from chainrun.checks.holdback import OutputBlocked
from chainrun.errors import ProviderError, ToolRoundsExceeded, error_type
from chainrun.events import ToolCallEvent
from chainrun.hedging import AttemptInfo, AttemptRecord, HedgeOutcome
from chainrun.log.rows import CallRow, ToolCallRow
from chainrun.providers.base import ChatRequest, ChatStream
from chainrun.steps.answer_stream import settle_attempt, stream_answer
from chainrun.steps.base import StepContext, StepItem, StepResult, TurnState
from chainrun.timing import StreamedToolCall
from chainrun.tools import ToolCall, ToolCallRecord

if TYPE_CHECKING:
    from chainrun.checks.holdback import HoldBack
    from chainrun.hedging import Hedger
    from chainrun.log.store import Store
    from chainrun.providers.base import Provider
    from chainrun.steps.model_config import ModelStepConfig
    from chainrun.tools import Tool


class ToolStep(Protocol):
    """What the tool rounds use of their step (:class:`~chainrun.steps.llm.ToolStep`
    offers it): its settings, hedger, providers, tools and how it records and answers."""

    name: str
    config: ModelStepConfig
    llm: Any  # the llm kind's settings: tools, tools_by_label, max_tool_rounds, ...
    tools: dict[str, Tool]
    is_answer: bool

    @property
    def hedger(self) -> Hedger[ChatStream]: ...
    @property
    def providers(self) -> dict[str, Provider]: ...
    @property
    def store(self) -> Store | None: ...
    def request(self, state: TurnState) -> ChatRequest: ...
    def offered_tools(self, state: TurnState) -> list[str]: ...
    def holdback(self, state: TurnState | None = None) -> HoldBack | None: ...
    def checked_result(self, ctx: StepContext, holdback: HoldBack | None,
                       winner: ChatStream | None, error: BaseException | None,
                       blocked: OutputBlocked | None, shown: list[str]) -> StepResult: ...
    def record_holdback(self, ctx: StepContext, holdback: HoldBack,
                        winner: ChatStream | None, blocked: OutputBlocked | None) -> None: ...
    def result_of(self, winner: ChatStream | None,
                  error: BaseException | None) -> StepResult: ...
    def call_rows(self, request: ChatRequest, attempts: Sequence[AttemptRecord],
                  streams: dict[int, ChatStream], winner: ChatStream | None,
                  step_error: BaseException | None) -> list[CallRow]: ...

__all__ = ["ToolStep", "assistant_message", "run_tool_rounds", "tool_call_row"]


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
      as ``reasoning_content``: DeepSeek's thinking mode refuses a tool-call turn without
      it (api-docs.deepseek.com, "Thinking Mode"); servers that stream no reasoning get
      no such field.
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
    """The ``tool_calls`` row of a record."""
    return ToolCallRow(
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
    )  # fmt: skip


@dataclass
class _Round:
    """One round's race: its request, attempts (numbered from ``offset + 1``), outcome."""

    request: ChatRequest
    offset: int
    streams: dict[int, ChatStream] = field(default_factory=dict)
    outcome: HedgeOutcome[ChatStream] | None = None
    winner: ChatStream | None = None
    error: BaseException | None = None

    def winner_attempt(self) -> int:
        for n, s in self.streams.items():
            if s is self.winner:
                return self.offset + n
        return self.offset + 1


async def _race(step: ToolStep, rnd: _Round) -> None:
    """Run one round's hedged model call (fills ``rnd``); an attempt is sent with the
    step-wide attempt number in ``x-chainrun-attempt``."""
    cfg = step.config
    hedger = step.hedger

    async def attempt(info: AttemptInfo) -> ChatStream:
        number = rnd.offset + info.number
        req = dataclasses.replace(
            rnd.request, headers={**rnd.request.headers, "x-chainrun-attempt": str(number)}
        )
        s = ChatStream(
            step.providers[info.target], req,
            first_token_timeout_s=cfg.first_token_timeout_s, idle_timeout_s=cfg.idle_timeout_s,
            pump=cfg.stream,
        )  # fmt: skip
        rnd.streams[info.number] = s
        return await settle_attempt(s, cfg.stream)

    async def release(s: ChatStream) -> None:
        await s.aclose()

    rnd.outcome = await hedger.run(attempt, release=release)
    if rnd.outcome.error is not None:
        rnd.error = rnd.outcome.error
    else:
        rnd.winner = rnd.outcome.value


async def run_tool_rounds(
    step: ToolStep, state: TurnState, ctx: StepContext
) -> AsyncGenerator[StepItem, None]:
    """The step's run when it has tools (see the module docstring): yields the answer's
    :class:`~chainrun.events.TokenDelta` s and a :class:`~chainrun.events.ToolCallEvent`
    per tool call start and end, then one :class:`~chainrun.steps.base.StepResult`."""
    cfg = step.config
    turn_tools = ctx.tools
    if turn_tools is None:  # run outside a chain turn (a test, a library user)
        raise RuntimeError(f"step {step.name} has tools but its turn has no TurnTools")
    deadline = asyncio.get_running_loop().time() + cfg.deadline_s
    base = step.request(state)
    offered = step.offered_tools(state)
    definitions = [step.tools[name].definition() for name in offered]
    messages: list[dict[str, Any]] = list(base.messages)
    rounds: list[_Round] = []
    shown: list[str] = []
    final: _Round | None = None
    error: BaseException | None = None
    blocked: OutputBlocked | None = None
    holdback = None
    results: dict[str, Any] = {}
    tool_state = state.prompt_vars()
    used_ids: set[str] = set()  # call ids in the messages so far (unique per step)
    offset = 0
    try:
        for round_ in itertools.count(1):
            rnd = _Round(dataclasses.replace(base, messages=list(messages), tools=definitions),
                         offset)  # fmt: skip
            rounds.append(rnd)
            async with asyncio.timeout_at(deadline):
                await _race(step, rnd)
            offset += max(rnd.streams, default=0)
            if rnd.error is not None:
                error = rnd.error
                break
            winner = rnd.winner
            assert winner is not None
            # the grounding check's sources: the turn's, and this step's tool results so far
            seen = dataclasses.replace(state, values={**state.values,
                                                      "tool_results": json.dumps(results)})
            holdback = step.holdback(seen)
            if cfg.stream:
                deltas = stream_answer(step.name, winner, holdback, deadline, shown)
                async with contextlib.aclosing(deltas):
                    async for delta in deltas:
                        yield delta
            else:
                async with asyncio.timeout_at(deadline):
                    await winner.collect()
            calls = _as_calls(winner.timer.tool_calls, round_, used_ids)
            if not calls:
                final = rnd
                break
            if round_ > step.llm.max_tool_rounds:
                names = ", ".join(c.name for c in calls)
                error = ToolRoundsExceeded(
                    f"{step.name}: the model still asked for tools ({names}) after "
                    f"max_tool_rounds = {step.llm.max_tool_rounds} rounds"
                )
                break
            reasoning = "".join(winner.timer.reasoning) or None
            messages.append(assistant_message(winner.timer.text, calls, reasoning))
            for call in calls:
                record: ToolCallRecord | None = None
                phases = turn_tools.phases(
                    call, step=step.name, attempt=rnd.winner_attempt(), round=round_,
                    t0=ctx.started, state=tool_state, only=offered,
                )  # fmt: skip
                async with contextlib.aclosing(phases):
                    async for phase, record in phases:
                        yield _event(record, phase, ctx.row.started_offset_ms)
                assert record is not None
                messages.append({"role": "tool", "tool_call_id": call.call_id,
                                 "content": record.content})  # fmt: skip
                if record.ok:
                    results[call.name] = json.loads(record.content)
    except OutputBlocked as e:
        blocked = e
    except (ProviderError, TimeoutError) as e:
        error = e
    finally:
        current = rounds[-1] if rounds else None
        try:
            if current is not None:
                to_close = (list(current.streams.values()) if current.outcome is None
                            else [current.winner])  # fmt: skip
                for s in to_close:
                    if s is not None:
                        await s.aclose()
        finally:
            error = _record(step, ctx, rounds, final, error, turn_tools.records_of(step.name))
            if holdback is not None and current is not None:
                step.record_holdback(ctx, holdback, current.winner, blocked)
            for r in rounds:
                if r.outcome is not None and r.outcome.shadows_pending:
                    ctx.after_log.append(_shadow_settler(step, r, deadline))
    if blocked is not None:
        yield step.checked_result(ctx, holdback, None, None, blocked, shown)
        return
    result = step.result_of(final.winner if final is not None else None, error)
    if result.error is None and step.is_answer and cfg.stream:
        result.updates["answer"] = "".join(shown)  # what reached the user
        if "grounding" in (ctx.row.detail or {}):
            result.verdict = {k: v for k, v in (ctx.row.detail or {}).items()
                              if k in ("output_check", "grounding")}  # fmt: skip
    if result.error is None and step.llm.tool_results_field:
        result.updates[step.llm.tool_results_field] = json.dumps(results, ensure_ascii=False)
    yield result


def _record(
    step: ToolStep, ctx: StepContext, rounds: list[_Round], final: _Round | None,
    error: BaseException | None, records: list[ToolCallRecord],
) -> BaseException | None:  # fmt: skip
    """Fill the step's row, its calls (every attempt of every round) and tool calls;
    return the step's error (None: it answered)."""
    row = ctx.row
    row.duration_ms = ctx.elapsed_ms()
    calls: list[CallRow] = []
    fired = won = False
    saved: list[float] = []
    n_attempts = 0
    output_tokens: int | None = 0
    for i, rnd in enumerate(rounds):
        last = i == len(rounds) - 1
        round_error = error if last else None
        if rnd.outcome is not None:
            attempts: Sequence[AttemptRecord] = rnd.outcome.attempts
            fired = fired or rnd.outcome.fired
            won = won or rnd.outcome.won_by_copy
            if rnd.outcome.time_saved_ms is not None:
                saved.append(rnd.outcome.time_saved_ms)
            if i == 0:
                row.hedge_delay_ms = rnd.outcome.delay_ms
        else:
            attempts = [
                AttemptRecord(number=n, target=s.provider.name, outcome="cancelled",
                              started_offset_ms=(s.timer.t_start - ctx.started) * 1000.0)
                for n, s in sorted(rnd.streams.items())
            ]  # fmt: skip
        sent = [a for a in attempts if a.number in rnd.streams]
        n_attempts += len(sent)
        for r in step.call_rows(rnd.request, attempts, rnd.streams, rnd.winner, round_error):
            r.attempt += rnd.offset
            calls.append(r)
        usage = rnd.winner.timer.usage if rnd.winner is not None else None
        if output_tokens is not None:
            output_tokens = (output_tokens + usage.output_tokens
                             if usage is not None and usage.output_tokens is not None
                             else None)  # fmt: skip
    ctx.calls[:] = calls
    ctx.tool_calls[:] = [tool_call_row(r) for r in records]
    row.n_attempts = n_attempts
    row.hedge_fired = fired
    row.hedge_won = won
    row.time_saved_ms = sum(saved) if saved else None
    row.detail = {**(row.detail or {}), "tool_rounds": len(rounds)}
    winner = final.winner if final is not None else (rounds[-1].winner if rounds else None)
    if winner is not None:
        ttft = winner.timer.ttft_ms  # from its own call's start: from the step's start here
        ctx.ttft_ms = (None if ttft is None
                       else (winner.timer.t_start - ctx.started) * 1000.0 + ttft)  # fmt: skip
        row.output = winner.timer.text
        if error is None and winner.error is not None:
            error = winner.error
    ctx.output_tokens = output_tokens if rounds else None
    if error is not None:
        row.error_type = error_type(error)
    return error


def _shadow_settler(step: ToolStep, rnd: _Round, deadline: float) -> Any:
    """As the plain step's: wait (inside the deadline) for this round's shadow losers,
    then rewrite their ``calls`` rows (attempts numbered on across rounds)."""
    outcome = rnd.outcome
    assert outcome is not None

    async def settle(turn_id: int | None) -> None:
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                await outcome.shadows_done()
        if step.store is None or turn_id is None:
            return
        rows = step.call_rows(rnd.request, outcome.attempts, rnd.streams, None, None)
        for r in rows:
            r.attempt += rnd.offset
        await step.store.aupdate_step_calls(turn_id, step.name, rows, outcome.time_saved_ms)

    return settle
