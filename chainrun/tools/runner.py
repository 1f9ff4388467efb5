"""Carrying out the tool calls a model asked for: each at most once per turn.

Knows nothing of models or providers: a :class:`ToolCall` is a name, an id and the
arguments' JSON text, whoever produced it. :class:`TurnTools` holds one turn's calls:

- **At most once per (turn, step, round, position).** A call is what the turn really
  asked: the step, its tool round and the call's position in that round's answer. The
  first :meth:`TurnTools.run` of it runs it; a later one (a step run again) gets the
  first one's result without running anything. The model's call id is not the identity:
  servers reuse ids across rounds (llama.cpp has sent one constant id; others restart
  ``name:0`` each round), so keyed by id a second round's new call would be answered
  with the first round's result. The tool is handed the idempotency key
  ``"{turn key}:{step}:{round}:{position}"``.
- **Arguments first.** The arguments must be a JSON object that follows the tool's
  ``parameters`` schema (jsonschema, Draft 2020-12); otherwise nothing runs and the
  model is told what is wrong (status ``invalid_arguments``), so it can correct itself.
  A name that is no tool of the step: ``unknown_tool``, nothing runs.
- **Side effects wait for the turn to be clear to act.** Before a side-effecting tool
  starts, ``clear_to_act(step)`` is awaited (the chain passes one that returns once no
  check that can still refuse the turn is running). A turn cancelled before the start
  (the client went away, a guard refused) never starts it: status ``not_started``.
- **A started tool is never abandoned, never repeated.** It runs in a task of its own;
  a turn cancelled while it runs waits for it to finish, records its result (with
  ``turn_cancelled``), then lets the cancellation go on. Nothing is retried: a
  side-effecting tool may have acted even when it failed.
- **Confirmation first** (``confirm = true``, :mod:`chainrun.tools.confirm`): the call
  is not run; its arguments (only its schema's properties: any other is
  ``invalid_arguments``) become a :class:`~chainrun.tools.confirm.PendingAction`,
  recorded by ``ask`` (the log) before the record says ``awaiting_confirmation`` and the
  model is told the shopper is being asked; the same in a replay or an eval. A turn that
  carries out a confirmed action (:meth:`TurnTools.run_confirmed`; the desk claimed it
  when the yes was decided) checks its arguments against the schema and the catalogue
  again, marks it started (``claim``) once the turn is clear to act, runs exactly its
  recorded arguments with its key, and reports the outcome (``finish``); in a replay or
  an eval it is stubbed or recorded as ``replay`` says.
- **Products that exist.** A tool's ``product_arguments`` (product ids, SKUs) are
  looked up in the chain's catalogue (``known_products``) before the call runs, is
  stubbed or becomes a pending action; an id the catalogue does not hold is
  ``invalid_arguments``, nothing runs and nothing is asked, and the model is told so.
- **Bounded.** ``timeout_s`` per run (status ``timeout``; the model is told that the
  effect is unknown).

Times are in ms; offsets from the ``t0`` given (the step's start).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from chainrun.answer_json import schema_errors
from chainrun.identity import Identity
from chainrun.tools.confirm import (
    PendingAction,
    config_digest,
    expires_at,
    outside_properties,
    question_text,
    utc_iso,
)
from chainrun.tools.tool import Tool, ToolContext

__all__ = ["Confirmed", "KnownProducts", "ToolCall", "ToolCallRecord", "ToolPhase", "ToolStatus",
           "TurnTools", "argument_problem", "product_ids"]  # fmt: skip

#: which of the product ids given the catalogue holds (awaited off the loop's work)
KnownProducts = Callable[[Sequence[str]], Awaitable[Collection[str]]]

#: ok: ran and returned; error: ran and raised (or its result was not JSON); timeout:
#: ran past ``timeout_s``; invalid_arguments / unknown_tool: not run, the model was told
#: why; not_started: the turn was cancelled before a side-effecting tool could start
#: stubbed: a replay or an eval did not carry it out; awaiting_confirmation: a ``confirm``
#: tool asked for, waiting for the shopper (confirmed / denied / expired once decided)
ToolStatus = Literal["ok", "error", "timeout", "invalid_arguments", "unknown_tool", "not_started",
                     "stubbed", "recorded", "awaiting_confirmation", "confirmed", "denied",
                     "expired"]
#: a tool call's moments as :meth:`TurnTools.phases` yields them
ToolPhase = Literal["started", "finished"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call a model asked for.

    Attributes:
        call_id: the call's id in the messages (Chat Completions ``tool_calls[].id``,
            Responses ``call_id``): the model's, or chainrun's own where the server sent
            none or one already used in the step (see :mod:`chainrun.steps.tool_use`).
        name: the tool's name.
        arguments: the arguments as the model sent them: JSON text.
        position: the call's position among its answer's calls (0, 1, ...).
        notes: how the call was read where the server strayed from the API's shape
            (:class:`chainrun.timing.ToolCallAssembler`; ``id_missing``, ``id_reused``).
    """

    call_id: str
    name: str
    arguments: str
    position: int = 0
    notes: tuple[str, ...] = ()


@dataclass
class ToolCallRecord:
    """What one tool call did; the ``tool_calls`` row is built from it.

    Attributes:
        step: the step whose model asked.
        attempt: the model call attempt that asked (the race's winner).
        round: the step's tool round (1 for the model's first answer).
        call: the call as asked.
        idempotency_key: ``"{turn key}:{step}:{round}:{position}"``.
        side_effects: the tool's ``side_effects`` (False for an unknown tool).
        status: see :data:`ToolStatus`.
        started_offset_ms: when the tool started, ms from ``t0`` (None: never started).
        duration_ms: how long it ran, in ms (None: never started).
        content: what the model is told: the result as JSON text, or ``{"error": ...}``.
        error_type: ``invalid_arguments``, ``unknown_tool``, ``timeout``, ``not_started``
            or the exception's class name (None: ok).
        error_message: the error as the model was told it.
        turn_cancelled: the turn was cancelled while the tool ran (it was awaited).
        action: the pending action a ``confirm`` tool's call became (status
            ``awaiting_confirmation``).
        action_id: the confirmed action this run carried out (None: a call the model
            asked for in this turn).
    """

    step: str
    attempt: int
    round: int
    call: ToolCall
    idempotency_key: str
    side_effects: bool
    status: ToolStatus
    started_offset_ms: float | None = None
    duration_ms: float | None = None
    content: str = ""
    error_type: str | None = None
    error_message: str | None = None
    turn_cancelled: bool = False
    action: PendingAction | None = None
    action_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def argument_problem(arguments: str, tool: Tool) -> tuple[dict[str, Any] | None, str | None]:
    """``(arguments, None)`` when ``arguments`` (JSON text) is an object that follows the
    tool's ``parameters`` schema, else ``(None, why)`` in one line for the model."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError as e:
        return None, f"the arguments are not JSON ({e})"
    if not isinstance(value, dict):
        return None, f"the arguments must be a JSON object, got {type(value).__name__}"
    errors = schema_errors(value, tool.config.parameters, limit=3)
    if errors:
        return None, "the arguments break the tool's schema: " + "; ".join(errors)
    return value, None


def product_ids(arguments: Mapping[str, Any], tool: Tool) -> list[str]:
    """The product ids ``arguments`` (validated) name in the tool's ``product_arguments``,
    each once, in order: a string value, or the strings of an array value."""
    ids: list[str] = []
    for name in tool.config.product_arguments:
        value = arguments.get(name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item not in ids:
                ids.append(item)
    return ids


def _error_content(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


async def _await_to_the_end(task: asyncio.Task[Any]) -> None:
    """Wait until ``task`` is done, whatever cancels the caller meanwhile; the caller's
    own cancellation is raised afterwards."""
    interrupted: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as e:
            interrupted = e
    if interrupted is not None:
        raise interrupted


@dataclass(frozen=True)
class Confirmed:
    """What a turn's desk decided about its conversation's pending actions, handed to the
    turn's tools as one value.

    Attributes:
        actions: the actions the shopper said yes to (claimed by this turn), carried out
            in this turn.
        claim: awaited with an action right before its tool starts; False: the turn no
            longer holds it (nothing runs). None: no claim (a chain without a log).
        finish: awaited with an action and its run's status (``ok``, ``error``,
            ``timeout``, ``invalid_arguments``, ...) once its run ended (not for a run
            refused ``not_started``: the action is given back when the turn ends).
    """

    actions: tuple[PendingAction, ...] = ()
    claim: Callable[[PendingAction], Awaitable[bool]] | None = None
    finish: Callable[[PendingAction, str], Awaitable[None]] | None = None


@dataclass
class TurnTools:
    """One turn's tool calls (see the module docstring).

    Args:
        tools: the tools by name (those of the step; another name is ``unknown_tool``).
        turn_key: the first half of every idempotency key: the turn's id as text, or a
            random id for a chain without a log.
        turn_id: the turn's id in the log (None without one), told to the tools.
        conversation_id: told to the tools.
        clear_to_act: awaited with the step's name before a side-effecting tool of that
            step starts (None: at once).
        clock: s, monotonic (``time.perf_counter``).
        act: carry out side-effecting tools (True: live traffic); False (a replay, an
            eval): a side-effecting tool whose ``replay`` is ``"stub"`` is not carried
            out: its arguments are checked, the model is told its ``replay_result``, and
            its record says ``stubbed``.
        turn_index: the turn's index in its conversation (a pending action's expiry
            counts turns from it).
        user: the shopper the turn is for, handed to every tool.
        now: the wall-clock time, ISO-8601 UTC (a pending action's ``asked_at``).
        confirmed: what the turn's desk decided about the conversation's pending actions
            (:class:`Confirmed`): the actions the shopper said yes to, carried out by
            :meth:`run_confirmed`, and their claim.
        background: the turn answers a chat UI's background request (a title): a tool
            that acts (``side_effects``, ``confirm``) is refused ``not_started``.
        recorded: what ``replay = "record"`` tools are told, by idempotency key's
            ``{step}:{round}:{position}`` (the live turn's results).
        known_products: which of some product ids the chain's catalogue holds, for the
            tools' ``product_arguments``; None: not checked (a caller without a
            catalogue; the chain always passes its own).
        ask: awaited with a pending action as a ``confirm`` tool's call becomes one,
            before the call's record (and so its question) goes anywhere: records it in
            the log (None: not recorded, a chain without a log). Raising: the call is
            refused ``not_started`` (nothing asked).
    """

    tools: Mapping[str, Tool]
    turn_key: str
    turn_id: int | None = None
    conversation_id: str | None = None
    clear_to_act: Callable[[str], Awaitable[None]] | None = None
    clock: Callable[[], float] = time.perf_counter
    act: bool = True
    turn_index: int | None = None
    user: Identity | None = None
    now: Callable[[], str] | None = None
    confirmed: Confirmed = field(default_factory=lambda: Confirmed())
    background: bool = False
    recorded: Mapping[str, str] = field(default_factory=dict)
    known_products: KnownProducts | None = None
    ask: Callable[[PendingAction], Awaitable[None]] | None = None
    #: every record, in the order the calls were asked (no repeats)
    records: list[ToolCallRecord] = field(default_factory=list)
    _asked: dict[tuple[str, int, int], ToolCallRecord] = field(default_factory=dict)

    @property
    def pending(self) -> list[PendingAction]:
        """The pending actions this turn's calls became, in the order asked."""
        return [r.action for r in self.records if r.action is not None]

    def confirmed_for(self, step: str) -> list[PendingAction]:
        """The confirmed actions ``step`` carries out in this turn."""
        return [a for a in self.confirmed.actions if a.step == step]

    def for_run(self, clear_to_act: Callable[[str], Awaitable[None]]) -> TurnTools:
        """These tools, waiting on ``clear_to_act`` (the turn's run) before a tool that
        acts starts."""
        return dataclasses.replace(self, clear_to_act=clear_to_act)

    @property
    def acted(self) -> bool:
        """Whether anything of the turn's tools may have acted: a tool with side effects
        or a confirmed action started, or a call became a pending action."""
        return any(r.status == "awaiting_confirmation" or (
            r.started_offset_ms is not None and (r.side_effects or r.action_id is not None))
            for r in self.records)  # fmt: skip

    def key(self, step: str, round: int, position: int) -> str:
        """The idempotency key of the call at ``position`` of ``step``'s ``round``."""
        return f"{self.turn_key}:{step}:{round}:{position}"

    def records_of(self, step: str) -> list[ToolCallRecord]:
        """The records of ``step``'s calls, in the order asked."""
        return [r for r in self.records if r.step == step]

    async def run(
        self, call: ToolCall, *, step: str, attempt: int, round: int, t0: float,
        state: Mapping[str, Any] | None = None, only: Collection[str] | None = None,
    ) -> ToolCallRecord:  # fmt: skip
        """Carry out ``call`` (at most once per step, round and position in this turn) and
        return its record;
        the model is told ``record.content``. Arguments and errors as :meth:`phases`."""
        record: ToolCallRecord | None = None
        async with contextlib.aclosing(
            self.phases(call, step=step, attempt=attempt, round=round, t0=t0, state=state,
                        only=only)
        ) as phases:
            async for _, got in phases:
                record = got
        assert record is not None
        return record

    async def phases(
        self, call: ToolCall, *, step: str, attempt: int, round: int, t0: float,
        state: Mapping[str, Any] | None = None, only: Collection[str] | None = None,
    ) -> AsyncGenerator[tuple[ToolPhase, ToolCallRecord], None]:  # fmt: skip
        """Carry out ``call``, yielding ``("started", record)`` when the tool really starts
        (never for a call that is not run) and ``("finished", record)`` last. A call
        already asked in this turn (the same step, round and position) yields only its
        first record, ``finished``.

        Args:
            step, attempt, round: recorded with the call.
            t0: the clock's time the offsets count from (the step's start), in s.
            state: turn-state fields handed to the tool in its :class:`ToolContext`.
            only: the names the step may call (None: every tool); another is
                ``unknown_tool``.

        Raises:
            asyncio.CancelledError: the turn was cancelled; the record is in
                :attr:`records` first (``not_started``, or the finished run with
                ``turn_cancelled``).
        """
        asked = (step, round, call.position)
        seen = self._asked.get(asked)
        if seen is not None:
            yield "finished", seen
            return
        allowed = self.tools if only is None else {n: self.tools[n] for n in only
                                                   if n in self.tools}  # fmt: skip
        tool = allowed.get(call.name)
        record = ToolCallRecord(
            step=step, attempt=attempt, round=round, call=call,
            idempotency_key=self.key(step, round, call.position),
            side_effects=tool.side_effects if tool is not None else False,
            status="ok",
        )  # fmt: skip
        self._asked[asked] = record
        self.records.append(record)
        if tool is None:
            names = ", ".join(sorted(allowed)) or "none"
            self._refused(record, "unknown_tool",
                          f"no tool named {call.name!r} here (tools: {names})")  # fmt: skip
            yield "finished", record
            return
        arguments, problem = argument_problem(call.arguments, tool)
        if arguments is None:
            assert problem is not None
            self._refused(record, "invalid_arguments", problem)
            yield "finished", record
            return
        unknown = await self._unknown_products(arguments, tool)
        if unknown:
            self._refused(record, "invalid_arguments", unknown)
            yield "finished", record
            return
        if (tool.side_effects or tool.config.confirm) and self.background:
            self._refused(record, "not_started", "a chat UI's background request (a title, "
                          "tags) acts on nothing; nothing was done")  # fmt: skip
            yield "finished", record
            return
        if tool.config.confirm:
            extra = outside_properties(arguments, tool.config)
            if extra:
                self._refused(record, "invalid_arguments",
                              f"{', '.join(map(repr, extra))}: not parameters of the tool; a "
                              "confirm tool takes only its schema's properties, so the shopper "
                              "is asked about every argument that runs")  # fmt: skip
                yield "finished", record
                return
            await self._await_confirmation(record, tool, arguments, step)
            yield "finished", record
            return
        if tool.side_effects and not self.act:
            if tool.config.replay == "stub":
                record.status = "stubbed"
                record.content = json.dumps(tool.config.replay_result, ensure_ascii=False)
                yield "finished", record
                return
            if tool.config.replay == "record":
                self._from_record(record, step, round, call.position)
                yield "finished", record
                return
        async with contextlib.aclosing(
            self._carry_out(record, tool, arguments, step, state, t0)
        ) as run:
            async for item in run:
                yield item

    async def run_confirmed(
        self, action: PendingAction, *, step: str, position: int, t0: float,
        state: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[tuple[ToolPhase, ToolCallRecord], None]:  # fmt: skip
        """Carry out a confirmed ``action`` in this turn (round 0 of ``step``, before the
        model's first round), its recorded arguments as they are, with the action's id as
        the idempotency key; phases as :meth:`phases`. It is claimed (``claim``) once the
        turn is clear to act; a claim lost to another turn runs nothing (``not_started``)."""
        call = ToolCall(call_id=f"call_confirmed_{position}", name=action.tool,
                        arguments=json.dumps(action.arguments, ensure_ascii=False),
                        position=position)  # fmt: skip
        tool = self.tools.get(action.tool)
        record = ToolCallRecord(
            step=step, attempt=0, round=0, call=call, idempotency_key=action.id,
            side_effects=tool.side_effects if tool is not None else False, status="ok",
            action_id=action.id,
        )  # fmt: skip
        self._asked[(step, 0, position)] = record
        self.records.append(record)
        finish = self.confirmed.finish
        try:
            if tool is None:
                self._refused(record, "unknown_tool", f"no tool named {action.tool!r} any more")
                yield "finished", record
                return
            arguments, problem = argument_problem(record.call.arguments, tool)
            problem = problem or await self._unknown_products(arguments or {}, tool)
            if problem is not None:  # the tool or the catalogue changed since the yes
                self._refused(record, "invalid_arguments", problem)
                yield "finished", record
                return
            if not self.act and (tool.side_effects or tool.config.confirm):
                if tool.config.replay == "stub":  # a replay decides, the tool does not run
                    record.status = "stubbed"
                    record.content = json.dumps(tool.config.replay_result, ensure_ascii=False)
                    yield "finished", record
                    return
                if tool.config.replay == "record":
                    self._from_record(record, step, 0, position)
                    yield "finished", record
                    return
            async with contextlib.aclosing(
                self._carry_out(record, tool, dict(action.arguments), step, state, t0,
                                action=action)
            ) as run:
                async for item in run:
                    yield item
        finally:
            if finish is not None and record.status != "not_started":  # not_started: held
                with contextlib.suppress(Exception):  # by no one now, or given back at the end
                    await asyncio.shield(finish(action, record.status))

    async def _unknown_products(self, arguments: Mapping[str, Any], tool: Tool) -> str | None:
        """Why ``arguments`` cannot be acted on, in one line for the model (the product
        ids of its ``product_arguments`` the catalogue does not hold), or None."""
        ids = product_ids(arguments, tool)
        if not ids or self.known_products is None:
            return None
        known = set(await self.known_products(ids))
        missing = [i for i in ids if i not in known]
        if not missing:
            return None
        shown = ("product " if len(missing) == 1 else "products ") + ", ".join(map(repr, missing))
        return (f"no {shown} in the catalogue ({', '.join(tool.config.product_arguments)} "
                "must be a product id); nothing was done")

    async def _await_confirmation(self, record: ToolCallRecord, tool: Tool,
                                  arguments: dict[str, Any], step: str) -> None:  # fmt: skip
        """Record a ``confirm`` tool's call as a pending action (nothing runs), in the log
        (``ask``) before its record says so."""
        asked = self.now() if self.now is not None else utc_iso()
        question = question_text(tool.name, tool.config, arguments)
        action = PendingAction(
            id=record.idempotency_key, tool=tool.name, arguments=arguments, question=question,
            step=step, conversation_id=self.conversation_id, turn_id=self.turn_id,
            turn_index=self.turn_index, asked_at=asked, expires_at=expires_at(asked, tool.config),
            expires_after_turn=(None if self.turn_index is None
                                else self.turn_index + tool.config.confirm_turns),
            logged=self.ask is not None, config_sha256=config_digest(tool.config),
        )  # fmt: skip
        if self.ask is not None:
            try:
                await self.ask(action)
            except Exception as e:  # the log's errors: nothing was asked
                self._refused(record, "not_started", "the question could not be recorded "
                              f"({type(e).__name__}); nothing was asked or done")  # fmt: skip
                return
        record.status = "awaiting_confirmation"
        record.action = action
        record.content = json.dumps({"awaiting_confirmation": True, "question": question,
                                     "note": "chainrun asks the shopper; do not call it again"},
                                    ensure_ascii=False)  # fmt: skip

    def _from_record(self, record: ToolCallRecord, step: str, round: int, position: int) -> None:
        """``replay = "record"``: the result the live turn logged for this call."""
        got = self.recorded.get(f"{step}:{round}:{position}")
        record.status = "recorded"
        if got is None:
            record.error_type = "not_recorded"
            record.error_message = ("replay = \"record\": the live turn logged no result for "
                                    "this call; nothing was carried out")  # fmt: skip
            record.content = _error_content(record.error_message)
            return
        record.content = got

    async def _carry_out(
        self, record: ToolCallRecord, tool: Tool, arguments: dict[str, Any], step: str,
        state: Mapping[str, Any] | None, t0: float, *, action: PendingAction | None = None,
    ) -> AsyncGenerator[tuple[ToolPhase, ToolCallRecord], None]:  # fmt: skip
        """Start the tool once the turn is clear to act (a confirmed ``action`` claimed
        first) and see it to its end (see :meth:`phases`)."""
        call = record.call
        context = ToolContext(
            turn_id=self.turn_id, call_id=call.call_id, idempotency_key=record.idempotency_key,
            step=step, conversation_id=self.conversation_id, state=dict(state or {}),
            user=self.user,
        )  # fmt: skip
        try:
            await self._wait_until_clear(tool, step, force=action is not None)
        except asyncio.CancelledError:
            self._refused(record, "not_started",
                          "the turn was cancelled before the tool started")  # fmt: skip
            raise
        claim = self.confirmed.claim
        if action is not None and claim is not None and not await claim(action):
            self._refused(record, "not_started",
                          "the action was given back to the shopper before it could start; "
                          "nothing was done")
            yield "finished", record
            return
        started = self.clock()
        record.started_offset_ms = (started - t0) * 1000.0
        task = asyncio.create_task(self._once(tool, arguments, context),
                                   name=f"chainrun-tool-{tool.name}")  # fmt: skip
        resumed = False
        try:
            yield "started", record
            resumed = True
        finally:
            # whatever happens to the caller (cancelled, closed), the started tool runs to
            # its end exactly once and is recorded
            cancelled: BaseException | None = None
            try:
                await _await_to_the_end(task)
            except asyncio.CancelledError as e:
                cancelled = e
            record.duration_ms = (self.clock() - started) * 1000.0
            record.turn_cancelled = cancelled is not None or not resumed
            self._settle(record, tool, task)
            if cancelled is not None:
                raise cancelled
        yield "finished", record

    async def _wait_until_clear(self, tool: Tool, step: str, *, force: bool = False) -> None:
        """Return when ``tool`` may start (``force``: wait for the turn to be clear to act
        whatever its ``side_effects``: a confirmed action); raise CancelledError when the
        turn is being cancelled (also one asked for before this call, not yet delivered)."""
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError()
        if (tool.side_effects or force) and self.clear_to_act is not None:
            await self.clear_to_act(step)
        else:
            await asyncio.sleep(0)  # a cancellation already asked for arrives here

    def _refused(self, record: ToolCallRecord, status: ToolStatus, message: str) -> ToolCallRecord:
        record.status = status
        record.error_type = status
        record.error_message = message
        record.content = _error_content(message)
        return record

    async def _once(self, tool: Tool, arguments: dict[str, Any], context: ToolContext) -> Any:
        async with asyncio.timeout(tool.timeout_s):
            return await tool.invoke(arguments, context)

    def _settle(self, record: ToolCallRecord, tool: Tool, task: asyncio.Task[Any]) -> None:
        if task.cancelled():  # only our own timeout cancels it, and that is a TimeoutError
            self._failed(record, "error", "cancelled", "the tool was cancelled")
            return
        error = task.exception()
        if isinstance(error, TimeoutError):
            self._failed(record, "timeout", "timeout",
                         f"the tool did not finish within timeout_s = {tool.timeout_s:g} s; "
                         "whether it acted is unknown: do not call it again for this")  # fmt: skip
            return
        if error is not None:
            self._failed(record, "error", type(error).__name__, f"{type(error).__name__}: {error}")
            return
        try:
            record.content = json.dumps(task.result(), ensure_ascii=False)
        except (TypeError, ValueError) as e:
            self._failed(record, "error", "result_not_json",
                         f"the tool's result is not JSON-serialisable ({e})")  # fmt: skip
            return
        record.status = "ok"

    def _failed(self, record: ToolCallRecord, status: ToolStatus, error_type: str,
                message: str) -> None:  # fmt: skip
        record.status = status
        record.error_type = error_type
        record.error_message = message
        record.content = _error_content(message)
