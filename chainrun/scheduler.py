"""Run one turn's graph: start each step as soon as what it waits for has ended.

:class:`TurnRun` folds a :class:`~chainrun.steps.base.TurnState` through the steps of
a :class:`~chainrun.graph.TurnGraph`. Steps that are ready together run concurrently,
each as its own task; their events reach the caller through one queue, in arrival
order. A step that fails closed (or refuses the turn) cancels its running siblings
(their HTTP streams are closed) and the steps not started are skipped.

The answer step's tokens are held back while a step that ``holds_answer`` (an input
guard raced against the answer) has not ended; they are released once it passes and
dropped if it refuses. Times in ms from the turn's start.

Once part of the answer has reached the shopper, a failure of the answer step (its
deadline, a stream that broke off) no longer refuses the turn, whatever the step's
``on_failure``: fail closed guards against an answer that is missing, and cannot take
back what the shopper has read. The turn ends **cut** (:attr:`TurnRun.cut_by`): the
step's row keeps its status and error, the running steps are cancelled and the rest
skipped (they would judge an answer the shopper did not get whole). Before the first
answer token reached the shopper, a fail-closed answer step refuses the turn as any
fail-closed step does; a fail-open one has nothing to let through (failing open lets an
answer through unchecked, and the answer step's failure is that there is none): the
turn ends **failed** (:attr:`TurnRun.failed_by`), the step's row ``failed_open`` with
its error, the running steps cancelled and the rest skipped, as for a cut.

A step with ``when`` is checked as it becomes ready (what it routes on has been
written, or its writer has ended without writing it): when the turn-state fields do
not match, it does not run; its row is ``skipped`` with the reason in
``detail["skipped"]``, a :class:`~chainrun.events.StepFinished` with status
``skipped`` is yielded, and what it would write stays unset (readers see the field's
empty value).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from chainrun.errors import (
    ProviderUnavailable,
    RequestRejected,
    StepConfigError,
    UndeclaredUpdate,
    error_type,
)
from chainrun.events import (
    AnswerDone,
    Event,
    ProductsShown,
    StepFinished,
    StepStarted,
    TokenDelta,
    ToolCallEvent,
)
from chainrun.graph import TurnGraph
from chainrun.log.rows import CallRow, StepRow, ToolCallRow, calls_usage
from chainrun.steps.base import Step, StepContext, StepResult, TurnState
from chainrun.steps.config import route_problem

if TYPE_CHECKING:
    from chainrun.tools import TurnTools


class Admission(Protocol):
    """What a turn starts from, as the front desk admitted it
    (:class:`chainrun.desk.Admitted`): read once, when the run is made."""

    @property
    def t0(self) -> float:
        """The turn's clock start, the request's arrival (``time.perf_counter()``, s)."""

    @property
    def tools(self) -> TurnTools | None:
        """The turn's tool calls (None: the chain has no tools)."""

    @property
    def verdicts(self) -> Mapping[str, Any]:
        """Verdicts the desk found (input checks, pending actions' decisions)."""

    @property
    def answer(self) -> tuple[str, str] | None:
        """Chainrun's own answer and why (no step runs), or None."""

    @property
    def blocked(self) -> tuple[str, str | None] | None:
        """``(by, text)`` when the turn is refused before any step starts, or None."""


#: what a step hands the turn's queue: its events and its result
QueueItem = TokenDelta | ToolCallEvent | ProductsShown | StepResult

#: what the shopper is told when a step that fails closed failed because the prompt
#: did not fit its model's context (``context_length``): trying again cannot help
TOO_LONG_REFUSAL = ("Your message is too long for me to read in one go. Please send a "
                    "shorter one.")


class _Inbox:
    """The steps' items for the turn's consumer, in arrival order: what the turn used of
    an ``asyncio.Queue`` (unbounded, one reader), without the rest (a queue per turn
    built an Event, three deques and task accounting nothing read)."""

    def __init__(self) -> None:
        self._items: deque[tuple[str, QueueItem]] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: tuple[str, QueueItem]) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> tuple[str, QueueItem]:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class TurnRun:
    """One turn in flight over a chain's steps.

    After :meth:`events` ends (or :meth:`cancel` returns) the outcome is in
    ``state`` (the folded turn state), ``verdicts``, ``refused`` / ``refusal_text``,
    ``unavailable`` (a provider that could not be reached), ``cut_by``, ``failed_by``,
    ``answer_ttft_ms``
    and ``answer_done_ms``, and :meth:`rows` / :meth:`calls` give what to log.
    """

    def __init__(
        self,
        steps: Mapping[str, Step],
        graph: TurnGraph,
        state: TurnState,
        answered: set[str] | None = None,
        admitted: Admission | None = None,
    ) -> None:
        self.steps = steps
        #: steps that have had an answer in this chain (shared across its turns): a
        #: 401/403/404 after that is no configuration mistake
        self.answered = answered if answered is not None else set()
        self.graph = graph
        self.state = state
        self.t0 = admitted.t0 if admitted is not None else time.perf_counter()
        self.verdicts: dict[str, Any] = dict(admitted.verdicts) if admitted is not None else {}
        self.refused = False
        self.refusal_text: str | None = None
        self.refused_by: str | None = None
        #: the refusal is a safe answer replacing the turn's answer (on_reject = "replace")
        self.replaced = False
        self.unavailable: ProviderUnavailable | StepConfigError | None = None
        #: the answer step, when it failed after part of its answer had reached the
        #: shopper: the turn ended there, its answer cut (see the module text)
        self.cut_by: str | None = None
        #: the answer step, when it failed open before any of its answer reached the
        #: shopper: the turn ended there with no answer (see the module text)
        self.failed_by: str | None = None
        self.answer_ttft_ms: float | None = None
        self.answer_done_ms: float | None = None
        self._queue = _Inbox()
        self._ctx: dict[str, StepContext] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ended: set[str] = set()
        self._held: list[TokenDelta] = []
        self._answer_ended = False
        #: the turn's tool calls (None: no step of the chain has tools); a tool that acts
        #: waits for :meth:`clear_to_act`
        tools = admitted.tools if admitted is not None else None
        self.tools = tools.for_run(self.clear_to_act) if tools is not None else None
        #: steps waiting in :meth:`clear_to_act`
        self._clear_waiters: list[asyncio.Future[None]] = []
        self._announced = False  # AnswerDone was yielded
        #: chainrun's own answer and why, given before the turn starts (no step runs): a
        #: reply to a pending action that needs no model (a no, an unclear reply, a yes to
        #: an expired action); the turn is answered (status ``ok``), not refused
        self._direct = admitted.answer if admitted is not None else None
        if admitted is not None and admitted.blocked is not None:
            # the input checks blocked the message: every step skipped, nothing sent
            self._refuse(*admitted.blocked)
            self._skip_not_started()

    def now_ms(self) -> float:
        """ms since the turn started."""
        return (time.perf_counter() - self.t0) * 1000.0

    # -- running ---------------------------------------------------------------------
    async def _direct_answer(self, text: str, why: str) -> AsyncIterator[Event]:
        for name in self.graph.order:
            step = self.steps[name]
            row = StepRow(step=name, kind=step.kind, status="skipped",
                          started_offset_ms=self.now_ms(), detail={"skipped": why},
                          post_answer=name in self.graph.post_answer)  # fmt: skip
            self._ctx[name] = StepContext(row=row)
            self._ended.add(name)
        self.state = self.state.updated({"answer": text})
        self.answer_ttft_ms = self.answer_done_ms = self.now_ms()
        yield TokenDelta(step=self.graph.answer_step, text=text)
        self._announced = True
        yield AnswerDone(step=self.graph.answer_step, text=text,
                         answer_ttft_ms=self.answer_ttft_ms,
                         answer_done_ms=self.answer_done_ms)  # fmt: skip

    async def events(self) -> AsyncIterator[Event]:
        """Run the turn, yielding StepStarted, TokenDelta and StepFinished as they happen."""
        if self._direct is not None:
            async for ev in self._direct_answer(*self._direct):
                yield ev
            return
        while True:
            if not self.ended_early:
                for ev in self._start_ready():
                    yield ev
            if not self._tasks:
                break
            name, item = await self._queue.get()
            if isinstance(item, TokenDelta):
                for ev in self._on_delta(name, item):
                    yield ev
                continue
            if isinstance(item, ToolCallEvent | ProductsShown):
                yield item
                continue
            for ev in await self._on_result(name, item):
                yield ev
        self._skip_not_started()

    def _ready(self) -> list[str]:
        return [
            n for n in self.graph.order
            if n not in self._ctx and self.graph.deps[n] <= self._ended
        ]  # fmt: skip

    def _start_ready(self) -> list[Event]:
        """Start every ready step whose ``when`` matches; skip the others (which may make
        more steps ready)."""
        events: list[Event] = []
        while ready := self._ready():
            skipped = False
            for name in ready:
                why = route_problem(self.steps[name].config.when, self.state.values)
                if why is None:
                    events.append(self._start(name))
                else:
                    events.append(self._skip_routed(name, why))
                    skipped = True
            if not skipped:
                break
            if not self._holding():  # a skipped check held the answer back no longer
                events.extend(self._release())
        return events

    def _skip_routed(self, name: str, why: str) -> StepFinished:
        """Log ``name`` as skipped by its ``when`` (``why``), ended without running."""
        step = self.steps[name]
        row = StepRow(step=name, kind=step.kind, status="skipped",
                      started_offset_ms=self.now_ms(), detail={"skipped": why},
                      post_answer=name in self.graph.post_answer)  # fmt: skip
        ctx = self._ctx[name] = StepContext(row=row, tools=self.tools)
        self._ended.add(name)
        return self._finished(name, ctx)

    def _start(self, name: str) -> StepStarted:
        step = self.steps[name]
        offset = self.now_ms()
        row = StepRow(step=name, kind=step.kind, started_offset_ms=offset,
                      post_answer=name in self.graph.post_answer)  # fmt: skip
        ctx = self._ctx[name] = StepContext(row=row, tools=self.tools)
        self._tasks[name] = asyncio.create_task(
            self._drive(name, step, self.state, ctx), name=f"chainrun-step-{name}"
        )
        return StepStarted(step=name, kind=step.kind, started_offset_ms=offset)

    async def _drive(self, name: str, step: Step, state: TurnState, ctx: StepContext) -> None:
        result: StepResult | None = None
        try:
            async with contextlib.aclosing(step.run(state, ctx)) as items:
                async for item in items:
                    if isinstance(item, StepResult):
                        result = item
                    else:
                        self._queue.put((name, item))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in a step must not hang or kill the turn
            result = StepResult(error=e)
        if result is None:
            result = StepResult(error=RuntimeError(f"step {name} ended without a result"))
        self._queue.put((name, result))

    async def clear_to_act(self, step: str) -> None:
        """Return once ``step`` may act (a side-effecting tool of it may start): no step
        that holds the answer back (and so can still refuse the turn) is left to end,
        except those that wait for ``step`` itself (a check of its answer can only judge
        it afterwards), and the turn is not refused. Cancelled with the step that waits
        when the turn ends first (refused, or the caller went away)."""
        after = self.graph.descendants(step) | {step}

        def blocked() -> bool:
            return any(self.steps[n].holds_answer and n not in self._ended and n not in after
                       for n in self.graph.order)  # fmt: skip

        while blocked() and not self.ended_early:
            waiter = asyncio.get_running_loop().create_future()
            self._clear_waiters.append(waiter)
            await waiter
        if self.ended_early:
            raise asyncio.CancelledError()

    def _wake_clear_waiters(self) -> None:
        waiters, self._clear_waiters = self._clear_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _holding(self) -> bool:
        """Whether a step that holds the answer back has not ended yet."""
        return any(self.steps[n].holds_answer and n not in self._ended for n in self.graph.order)

    def _on_delta(self, name: str, delta: TokenDelta) -> list[Event]:
        if name != self.graph.answer_step:
            return [delta]
        if self._holding():
            self._held.append(delta)
            return []
        if self.answer_ttft_ms is None:
            self.answer_ttft_ms = self.now_ms()
        return [delta]

    async def _on_result(self, name: str, result: StepResult) -> list[Event]:
        task = self._tasks.pop(name)
        await task  # already done: it queued its result last
        ctx = self._ctx[name]
        self._apply(name, result, ctx.row)
        self._ended.add(name)
        self._wake_clear_waiters()
        events: list[Event] = [self._finished(name, ctx)]
        if name == self.graph.answer_step:
            self._answer_ended = True
        if self.ended_early:
            self._held.clear()
            await self._cancel_running()
        elif not self._holding():
            events.extend(self._release())
            events.extend(self._answer_done())
        return events

    def _answer_done(self) -> list[Event]:
        """One :class:`AnswerDone` once the answer is complete and shown, and no step
        that could still refuse the turn or fail it closed is pending."""
        if self._announced or self.ended_early or self.answer_done_ms is None:
            return []
        if any(self.steps[n].may_end_turn and n not in self._ended for n in self.graph.order):
            return []
        self._announced = True
        ended = [n for n in self.graph.order if n in self._ended]
        pending = tuple(n for n in self.graph.order if n not in self._ended)
        return [AnswerDone(
            step=self.graph.answer_step, text=self.state.answer or "",
            answer_ttft_ms=self.answer_ttft_ms, answer_done_ms=self.answer_done_ms,
            pending=pending, usage=calls_usage(c for n in ended for c in self._ctx[n].calls),
        )]  # fmt: skip

    def _apply(self, name: str, result: StepResult, row: StepRow) -> None:
        step = self.steps[name]
        extra = set(result.updates) - step.writes
        if extra and result.error is None:
            # the step's kind broke its own declaration: the step fails, the turn goes on
            # under its on_failure (its other updates are not applied either)
            result = dataclasses.replace(result, updates={}, error=UndeclaredUpdate(
                f"step {name} set {sorted(extra)} but declares writes {sorted(step.writes)}"
            ))  # fmt: skip
        if result.error is not None:
            if result.verdict is not None:  # a missing verdict, with its reason
                self.verdicts[name] = result.verdict
            row.error_type = row.error_type or error_type(result.error)
            if row.error_type == "internal_error":
                row.detail = {**(row.detail or {}), "error": repr(result.error)}
            if isinstance(result.error, ProviderUnavailable):
                self.unavailable = result.error
            stop = self._config_stop(name, result.error)
            if stop is not None:  # a configuration mistake: nothing else runs
                self.unavailable = stop
                row.status = "failed_closed"
                self._refuse(name, None)
            elif name == self.graph.answer_step and self.answer_ttft_ms is not None:
                # part of the answer reached the shopper: the turn ends with it, cut
                row.status = "failed_closed" if step.config.on_failure == "closed" \
                    else "failed_open"
                self.cut_by = name
            elif step.config.on_failure == "closed":
                row.status = "failed_closed"
                self._refuse(name, TOO_LONG_REFUSAL if row.error_type == "context_length"
                             else None)  # fmt: skip
            elif name == self.graph.answer_step:
                # failing open lets an answer through unchecked; there is none: the turn
                # ends without one (its steps after the answer would judge nothing)
                row.status = "failed_open"
                self.failed_by = name
            else:
                row.status = "failed_open"
            return
        self.answered.add(name)
        self.state = self.state.updated(result.updates)
        if result.updates:  # what the step handed on, as data, in its row (every kind)
            fields = self.state.fields
            row.updates = {f: fields[f].logged(v) for f, v in result.updates.items()}
        if result.verdict is not None:
            self.verdicts[name] = result.verdict
            self.state = dataclasses.replace(self.state, verdicts=dict(self.verdicts))
        if result.refuse:
            self._refuse(name, result.refusal_text, replaced=result.replaced)

    @property
    def ended_early(self) -> bool:
        """Whether the turn stopped before its steps' end: refused, its answer cut, or
        its answer step failed open with no answer."""
        return self.refused or self.cut_by is not None or self.failed_by is not None

    def _config_stop(self, name: str, err: BaseException) -> StepConfigError | None:
        """A provider's refusal of the step's request as misconfigured: HTTP 400 naming a
        parameter, or 401/403/404 on the step's first call (see :class:`StepConfigError`)."""
        if not isinstance(err, RequestRejected):
            return None
        if err.param is None and name in self.answered:
            return None
        provider = err.provider or str(getattr(self.steps[name].config, "provider", "?"))
        return StepConfigError(name, provider, err)

    def _refuse(self, name: str, text: str | None, *, replaced: bool = False) -> None:
        if not self.refused:
            self.refused, self.refused_by, self.refusal_text = True, name, text
            self.replaced = replaced

    def _release(self) -> list[Event]:
        """Nothing holds the answer back: flush held tokens, stamp the answer timings."""
        now = self.now_ms()
        if self._held and self.answer_ttft_ms is None:
            self.answer_ttft_ms = now
        if self._answer_ended and self.state.answer is not None:
            if self.answer_ttft_ms is None:  # a non-streamed answer arrives whole
                self.answer_ttft_ms = now
            if self.answer_done_ms is None:
                self.answer_done_ms = now
        held, self._held = self._held, []
        return list(held)

    def _finished(self, name: str, ctx: StepContext) -> StepFinished:
        row, step = ctx.row, self.steps[name]
        return StepFinished(
            step=name, status=row.status, duration_ms=row.duration_ms, output=row.output,
            model=step.model, reasoning_effort=step.reasoning_effort, ttft_ms=ctx.ttft_ms,
            output_tokens=ctx.output_tokens, n_attempts=row.n_attempts,
            hedge_fired=row.hedge_fired, hedge_won=row.hedge_won, error_type=row.error_type,
            detail=row.detail, started_offset_ms=row.started_offset_ms,
            post_answer=row.post_answer,
        )  # fmt: skip

    # -- stopping --------------------------------------------------------------------
    async def _cancel_running(self, *, skip_rest: bool = True) -> None:
        tasks = dict(self._tasks)
        self._tasks.clear()
        for name in tasks:
            row = self._ctx[name].row
            row.status = "cancelled"
            row.error_type = row.error_type or "cancelled"
            self._ended.add(name)
        for task in tasks.values():
            task.cancel()
        # wait for the steps to close their calls and record them, even if we are
        # cancelled again meanwhile (then that cancellation is raised afterwards)
        interrupted: asyncio.CancelledError | None = None
        pending = set(tasks.values())
        while pending:
            try:
                _, pending = await asyncio.wait(pending)
            except asyncio.CancelledError as e:
                interrupted = e
        for name in tasks:
            row = self._ctx[name].row
            if row.duration_ms == 0.0:
                row.duration_ms = self.now_ms() - row.started_offset_ms
        if skip_rest:
            self._skip_not_started()
        if interrupted is not None:
            raise interrupted

    def _skip_not_started(self) -> None:
        for name in self.graph.order:
            if name not in self._ctx:
                step = self.steps[name]
                row = StepRow(step=name, kind=step.kind, status="skipped",
                              started_offset_ms=self.now_ms(),
                              post_answer=name in self.graph.post_answer)  # fmt: skip
                self._ctx[name] = StepContext(row=row)

    async def cancel(self) -> None:
        """Stop the turn: cancel every running step (their calls are closed) and wait.
        Steps not started yet are not logged (the turn was cancelled, not refused)."""
        await self._cancel_running(skip_rest=False)

    # -- what to log -----------------------------------------------------------------
    def rows(self) -> list[StepRow]:
        """The steps' rows in display order (steps never reached are skipped)."""
        return [self._ctx[n].row for n in self.graph.order if n in self._ctx]

    def error_type_of(self, name: str | None) -> str | None:
        """The error type in step ``name``'s row (None: no such row, or no error)."""
        ctx = self._ctx.get(name) if name is not None else None
        return ctx.row.error_type if ctx is not None else None

    def tool_calls(self) -> list[ToolCallRow]:
        """Every step's tool calls, in display order."""
        return [t for n in self.graph.order if n in self._ctx for t in self._ctx[n].tool_calls]

    def calls(self) -> list[CallRow]:
        """Every step's call rows, in display order."""
        return [c for n in self.graph.order if n in self._ctx for c in self._ctx[n].calls]

    def after_log(self) -> list[Any]:
        """Callbacks the steps left to run once the turn is logged."""
        return [cb for n in self.graph.order if n in self._ctx for cb in self._ctx[n].after_log]
