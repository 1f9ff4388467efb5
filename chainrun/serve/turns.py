"""One chat turn as a backend streams it: the chain's typed events turned into wire events.

Both faces (``POST /chat`` and the OpenAI-compatible ``/v1/chat/completions``) run a
turn through :class:`TurnRunner`, which wraps :meth:`chainrun.Chain.stream_turn` and
yields :class:`WireEvent` s (an SSE event name and a JSON-able payload)::

    turn_started  {conversation_id, request_id, answer_step, steps: [names in order]}
    step          {phase: "started", step, kind, started_ms}
    token         {step, text}
    tool          {phase: "started" | "finished", step, tool, call_id, round, side_effects,
                   started_ms, duration_ms, status, error_type}   (a step with tools)
    action        {id, tool, arguments, question, step, conversation_id, expires_at,
                   expires_after_turn}   (a tool with confirm = true waits for the yes;
                   confirm with the next message, or {"confirm": id} / {"deny": id})
    step          {phase: "finished", step, kind, status, started_ms, duration_ms,
                   ttft_ms, output_tokens, n_attempts, hedge_fired, hedge_won,
                   error_type, model, reasoning_effort, output}
    grounding     {step, action, claims, n_ungrounded, ungrounded: [{kind, text, product,
                   why, correction}], done: [{claim, action}], grounded, ...}  (after the
                   answer step's ``step`` event, when its grounding check ran)
    check         {step, check: NAME, status, reason, ...}  (after the answer step's
                   ``step`` event, one per other check of the answer's ``checks`` that
                   logged a verdict: the output check's figures, the loop check's stop)
    answer_done   {step, output, answer_ttft_ms, answer_done_ms, turn_index, pending: [step names],
                   usage: {input_tokens, ..., unknown_calls} of the calls so far}
    turn          the summary of :func:`turn_summary`, read back from the log

``answer_done`` (at most once, see :class:`chainrun.events.AnswerDone`): the shopper has
the whole answer and nothing pending can refuse it; the steps in ``pending`` (checks of
the answer) still run, and their ``step`` events and the ``turn`` event follow.

``turn`` closes every turn; its ``status`` says how it ended. A turn whose answer step
failed (its deadline, a stream that broke off) after ``token`` events had been sent
ends ``cut``: no ``answer_done``, and ``turn`` with ``status: "cut"``, ``error_type``
(e.g. ``timeout``) and ``output``, the text those tokens made: the answer as the
shopper has it, never replaced by a refusal.

All times are in ms from the turn's start. Closing the runner's iterator (a client that
went away) before ``answer_done`` cancels the turn's in-flight model calls; the chain
logs the turn ``cancelled`` and the runner's observers still get it, found in the log by
request id. Closed after ``answer_done``, the turn runs to its end on the server (its
checks finish and are logged) and the observers get it as usual. A turn the server
cancels (:meth:`TurnRunner.cancel`, a server stopping) ends its stream with its ``turn``
event, status ``cancelled``, read back from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chainrun.chain import Chain
from chainrun.desk import TurnRequest
from chainrun.events import (
    AnswerDone,
    ProductsShown,
    StepFinished,
    StepStarted,
    TokenDelta,
    ToolCallEvent,
    TurnFinished,
)
from chainrun.log.rows import TurnLog, TurnRow, TurnUsage
from chainrun.serve.disconnect import detached

log = logging.getLogger("chainrun.serve")
#: how long a finished turn's summary waits for its log write (seconds); past it the
#: summary is built from the turn's own events (a log database that is away)
READ_TIMEOUT_S = 2.0
#: how long a face waits for the chain's first event of a turn before it starts its
#: streamed response (seconds), beyond the log's outage wait (``[log] outage_wait_s``, the
#: longest the front desk waits for the log before it refuses): a refusal of the request
#: within it (:func:`opened`) is answered with its HTTP status instead of a stream
#: (:attr:`TurnRunner.refusal_wait_s`)
REFUSAL_WAIT_S = 2.0


class TurnObserver(Protocol):
    """Told about every turn once it is in the log (finished or cancelled).

    Called on the event loop right after the turn was logged: keep it quick
    (:class:`chainrun.telemetry.otel.Telemetry` only hands spans to a batch exporter).
    """

    def turn_logged(self, turn: TurnLog) -> None: ...


@dataclass(frozen=True)
class WireEvent:
    """One event of a turn as it goes on the wire: an SSE event name and its JSON payload."""

    event: str
    data: dict[str, Any]


def turn_summary(
    logged: TurnLog | None,
    done: TurnFinished,
    conversation_id: str,
    live_steps: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The ``turn`` event's payload: the turn's outcome, its summed usage and per step the
    logged timings with every attempt (the documented ``chainrun`` extra field of the
    OpenAI-compatible face carries the same object).

    Shape::

        {turn_id, run_id, conversation_id, turn_index, status, output, label, error_type,
         duration_ms, admit_ms, answer_ttft_ms, answer_done_ms,
         usage: {input_tokens, output_tokens, reasoning_tokens, cached_input_tokens,
                 calls, unknown_calls},
         steps: [{step, kind, status, started_ms, duration_ms, ttft_ms, output_tokens,
                  n_attempts, hedge_fired, hedge_won, hedge_delay_ms, error_type,
                  post_answer,
                  attempts: [{attempt, target, started_ms, ttft_ms, duration_ms,
                              outcome, output_tokens, error_type}],
                  tool_calls: [{tool, call_id, round, attempt, status, side_effects,
                                started_ms, duration_ms, error_type, turn_cancelled}]}]}

    ``started_ms`` of a step is from the turn's start, of an attempt from its step's
    start, of a tool call from its step's start (None: the tool never started); steps
    that ran concurrently overlap. ``answer_ttft_ms`` / ``answer_done_ms``
    are the shopper's wait for the first answer token / the whole answer (None when no
    answer reached the user); ``post_answer`` steps (checks of the answer) are not part of
    it. ``admit_ms`` is the time at the front desk before the first step (part of
    ``duration_ms`` and ``answer_ttft_ms``: every time counts from the request's arrival).
    ``turn_index`` is the turn's 1-based position in its conversation. Without a
    log (``logged`` None) the steps come from the events alone.
    """
    steps: list[dict[str, Any]] = []
    if logged is not None:
        for row in logged.steps:
            live = live_steps.get(row.step, {})
            steps.append(
                {
                    "step": row.step,
                    "kind": row.kind,
                    "status": row.status,
                    "started_ms": row.started_offset_ms,
                    "duration_ms": row.duration_ms,
                    "ttft_ms": live.get("ttft_ms"),
                    "output_tokens": live.get("output_tokens"),
                    "n_attempts": row.n_attempts,
                    "hedge_fired": bool(row.hedge_fired),
                    "hedge_won": bool(row.hedge_won),
                    "hedge_delay_ms": row.hedge_delay_ms,
                    "error_type": row.error_type,
                    "post_answer": bool(row.post_answer),
                    "attempts": [
                        {
                            "attempt": c.attempt,
                            "target": c.target,
                            "started_ms": c.started_offset_ms,
                            "ttft_ms": c.ttft_ms,
                            "duration_ms": c.duration_ms,
                            "outcome": c.outcome,
                            "output_tokens": c.output_tokens,
                            "error_type": c.error_type,
                        }
                        for c in logged.calls_of(row.step)
                    ],
                    "tool_calls": [
                        {
                            "tool": t.tool,
                            "call_id": t.call_id,
                            "round": t.round,
                            "attempt": t.attempt,
                            "status": t.status,
                            "side_effects": bool(t.side_effects),
                            "started_ms": t.started_offset_ms,
                            "duration_ms": t.duration_ms,
                            "error_type": t.error_type,
                            "turn_cancelled": bool(t.turn_cancelled),
                        }
                        for t in logged.tool_calls_of(row.step)
                    ],
                }
            )
    else:
        steps = [{**s, "attempts": [], "tool_calls": []} for s in live_steps.values()]
    usage = logged.usage() if logged is not None else TurnUsage()
    return {
        "turn_id": done.turn_id,
        "run_id": done.run_id,
        "conversation_id": conversation_id,
        "turn_index": done.turn_index,
        "status": done.status,
        "output": done.output,
        "label": done.label,
        "error_type": done.error_type,
        "duration_ms": done.duration_ms,
        "admit_ms": done.admit_ms,
        "answer_ttft_ms": done.answer_ttft_ms,
        "answer_done_ms": done.answer_done_ms,
        "usage": usage.as_json(),
        "steps": steps,
    }


def _cancelled_summary(
    logged: TurnLog | None,
    request_id: str,
    conversation_id: str,
    run_id: int | None,
    live_steps: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The ``turn`` event of a turn the server cancelled (:func:`turn_summary`'s shape,
    status ``cancelled``), from its logged row; without one (no log, or its database
    away) from the events alone, times and usage unknown (None, never 0)."""
    if logged is not None:
        t = logged.turn
        done = TurnFinished(
            turn_id=t.id, run_id=t.run_id, output=t.output, status=t.status,
            duration_ms=t.duration_ms or 0.0, label=t.label, verdicts=dict(t.verdicts),
            error_type=t.error_type, answer_ttft_ms=t.answer_ttft_ms,
            answer_done_ms=t.answer_done_ms, truncated=bool(t.truncated),
            conversation_id=t.conversation_id, turn_index=t.turn_index, admit_ms=t.admit_ms,
        )  # fmt: skip
        summary = turn_summary(logged, done, conversation_id, live_steps)
        summary["duration_ms"] = t.duration_ms
        return summary
    done = TurnFinished(turn_id=None, run_id=run_id, output=None, status="cancelled",
                        duration_ms=0.0)  # fmt: skip
    summary = turn_summary(None, done, conversation_id, live_steps)
    summary["duration_ms"] = None
    summary["usage"] = {k: None for k in summary["usage"]}
    return summary


async def opened(
    stream: AsyncGenerator[WireEvent, None], wait_s: float | None = None
) -> tuple[AsyncGenerator[WireEvent, None], dict[str, Any] | None]:
    """``stream`` (:meth:`TurnRunner.stream`) read up to the chain's first event, for at
    most ``wait_s`` seconds (None: :data:`REFUSAL_WAIT_S`), so that a face can answer a
    refused request with its HTTP status before it starts a stream: ``(events, refusal)``.

    ``refusal``: the ``error`` event's ``{status, message, type}`` when the chain refused
    the request before its turn ran (``stream`` is then closed and ``events`` empty);
    None otherwise, and ``events`` yields every event of the turn from its first
    (``turn_started``), those read here included. A refusal that comes later (a key whose
    first request is still running: the repeat waits for its turn, and past
    :data:`chainrun.desk.keys.WAIT_S` it is refused) is the ``error`` event
    of a stream begun. Closing ``events`` closes ``stream``.

    Raises:
        What ``stream`` raised before its first event (a crash of the turn).
    """
    events, read = await peek(stream, REFUSAL_WAIT_S if wait_s is None else wait_s,
                              lambda ev: ev.event != "turn_started")  # fmt: skip
    if read and read[-1].event == "error":  # nothing is being read: close it as it is
        await stream.aclose()
        return _replayed([], None, stream, ended=True), read[-1].data
    return events, None


async def peek(
    stream: AsyncGenerator[WireEvent, None], wait_s: float,
    stop: Callable[[WireEvent], bool],
) -> tuple[AsyncGenerator[WireEvent, None], list[WireEvent]]:  # fmt: skip
    """``stream`` read for at most ``wait_s`` seconds, up to its first event for which
    ``stop`` is true or an ``error`` event: ``(events, read)``, where ``read`` holds the
    events read (the last one the event that stopped it, if any) and ``events`` yields
    them and then the rest of ``stream``. Closing ``events`` closes ``stream``.

    Raises:
        What ``stream`` raised while read here.
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + wait_s
    first: list[WireEvent] = []
    pending: asyncio.Future[WireEvent] | None = None
    ended = False
    try:
        while True:
            pending = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait({pending}, timeout=max(0.0, until - loop.time()))
            if not done:
                break  # still waiting: the stream starts, the event follows in it
            got, pending = pending, None
            try:
                ev = got.result()
            except StopAsyncIteration:
                ended = True
                break
            first.append(ev)
            if ev.event == "error" or stop(ev):
                break
    except BaseException:
        await _close(pending, stream)
        raise
    return _replayed(list(first), pending, stream, ended=ended), first


async def _close(pending: asyncio.Future[WireEvent] | None,
                 stream: AsyncGenerator[WireEvent, None]) -> None:  # fmt: skip
    """Close ``stream``, cancelling the read of its next event first (a generator being
    read cannot be closed)."""
    if pending is not None and not pending.done():
        pending.cancel()
        with contextlib.suppress(BaseException):
            await pending
    await stream.aclose()


async def _replayed(
    first: list[WireEvent], pending: asyncio.Future[WireEvent] | None,
    stream: AsyncGenerator[WireEvent, None], *, ended: bool,
) -> AsyncGenerator[WireEvent, None]:  # fmt: skip
    """``first``, then the event being read (``pending``), then the rest of ``stream``."""
    try:
        for ev in first:
            yield ev
        if ended:
            return
        if pending is not None:
            try:
                yield await pending
            except StopAsyncIteration:
                return
            pending = None
        async for ev in stream:
            yield ev
    finally:
        await _close(pending, stream)


def _check_events(ev: StepFinished) -> list[WireEvent]:
    """The answer step's check verdicts as wire events: ``grounding`` for the grounding
    check's report, ``check`` (with the check's name) for each other check of the
    answer's ``checks`` (the step's ``detail["checks"]``) that logged one."""
    detail = ev.detail or {}
    names = detail.get("checks")
    out = []
    for name in names if isinstance(names, list) else ["grounding"]:
        doc = detail.get(name)
        if not isinstance(doc, dict):
            continue
        if name == "grounding":
            out.append(WireEvent("grounding", {"step": ev.step, **doc}))
        else:
            out.append(WireEvent("check", {"step": ev.step, "check": name, **doc}))
    return out


class TurnRunner:
    """Runs chat turns on one shared :class:`~chainrun.Chain` (one connection pool, one run
    of kind ``live``) and streams them as :class:`WireEvent` s.

    Args:
        chain: an opened chain; every turn of every chat goes through it.
        observers: told about each logged turn (e.g. the OpenTelemetry exporter).
        on_finished: called with each turn's ``TurnFinished`` as soon as the chain
            yields it, before the log is read (serve's provider watch).
    """

    def __init__(
        self,
        chain: Chain,
        observers: Sequence[TurnObserver] = (),
        on_finished: Sequence[Callable[[TurnFinished], None]] = (),
    ) -> None:
        self.chain = chain
        self.observers = list(observers)
        self.on_finished = list(on_finished)
        #: turns in flight, each in a task of its own (see :func:`detached`)
        self.background: set[asyncio.Task[None]] = set()
        #: the server cancelled its turns (:meth:`cancel`): a cancelled turn's stream
        #: still ends with its ``turn`` event
        self.stopping = False

    async def drain(self) -> None:
        """Wait for the turns in flight (cancelled ones log themselves first)."""
        while self.background:
            await asyncio.gather(*self.background, return_exceptions=True)

    def cancel(self) -> int:
        """Cancel every turn in flight (a server stopping now): each logs itself
        ``cancelled``, and a stream still sending one ends with that turn's ``turn``
        event (status ``cancelled``; ``ok`` for a turn whose answer was done, only its checks
        cancelled). Returns how many."""
        self.stopping = True
        tasks = [t for t in self.background if not t.done()]
        for task in tasks:
            task.cancel()
        return len(tasks)

    @property
    def refusal_wait_s(self) -> float:
        """How long a face waits for a turn's first event before it starts the response
        (s): :data:`REFUSAL_WAIT_S` beyond the log's outage wait, so that a request the
        desk refuses after waiting out an outage still gets its status."""
        return REFUSAL_WAIT_S + self.chain.config.log.outage_wait_s

    @property
    def answer_step(self) -> str:
        return self.chain.config.answer_step

    def stream(self, request: TurnRequest) -> AsyncGenerator[WireEvent, None]:
        """Run the turn ``request`` asks for; yield its wire events (see the module
        docstring), ``turn`` last.

        ``request``: as a face built it (:func:`chainrun.serve.intake.turn_request`), its
        conversation named: the ``turn_started`` event says it before the chain runs.

        The turn runs in a task of its own; closing the returned generator (a client
        gone) before ``answer_done`` cancels it once, and it logs itself ``cancelled``;
        closed after, the turn finishes on the server. A provider that cannot be
        reached at all ends the turn with status ``error`` (its ``turn`` event is still
        sent; the error is not re-raised here). A turn with an ``idempotency_key`` is
        never cancelled by its client going away (a retry with the key gets it). A
        refusal of the request itself by the chain's front desk (an error with an
        ``http_status``: another identity's conversation, a key reused with another
        request, the log away) is one ``error`` event ``{status, message, type}``, after
        ``turn_started``; the faces read it with :func:`opened` and answer that HTTP
        status when it comes before the response starts.
        """
        keyed = request.idempotency_key is not None
        return detached(
            self._turn(request.with_request_id() if request.request_id is None else request),
            self.background,
            finish_after=(lambda ev: True) if keyed else (lambda ev: ev.event == "answer_done"),
        )

    async def _turn(self, request: TurnRequest) -> AsyncGenerator[WireEvent, None]:
        conversation_id = request.conversation_id or ""
        request_id = request.request_id or ""
        finished: dict[str, dict[str, Any]] = {}
        yield WireEvent(
            "turn_started",
            {
                "conversation_id": conversation_id,
                "request_id": request_id,
                "answer_step": self.answer_step,
                "steps": list(self.chain.config.order),
            },
        )
        done: TurnFinished | None = None
        events = self.chain.stream_turn(request)
        sent_actions: set[str] = set()
        cut: TurnLog | None = None  # the turn as logged, when the server cancelled it
        try:
            async with contextlib.aclosing(events):
                async for ev in events:
                    if isinstance(ev, TurnFinished):
                        done = ev
                        for hook in self.on_finished:
                            hook(ev)
                        for action in ev.pending_actions:  # asked again: shown again
                            if action.id not in sent_actions:
                                yield WireEvent("action", action.as_json())
                        break
                    yield self._wire(ev, finished)
                    if isinstance(ev, ToolCallEvent) and ev.action is not None:
                        sent_actions.add(ev.action["id"])
                        yield WireEvent("action", ev.action)
                    if isinstance(ev, StepFinished) and ev.step == self.answer_step:
                        for event in _check_events(ev):
                            yield event
        except asyncio.CancelledError:
            if not self.stopping:
                raise  # the client went away: nobody reads a closing event
            # the server's stop cancelled the turn, which logged itself cancelled: the
            # stream still reading gets the turn's closing event, as every turn's stream
            cut = await self._observe_by_request_id(request_id)
            yield WireEvent("turn", _cancelled_summary(cut, request_id, conversation_id,
                                                       self.chain.run_id, finished))
            return
        except Exception as e:
            status = getattr(e, "http_status", None)
            if done is None and status is not None:
                # the desk refused the request before its turn ran: nothing to observe
                cut = TurnLog(turn=TurnRow(input=request.message))
                yield WireEvent("error", {"status": status, "message": str(e),
                                          "type": type(e).__name__})  # fmt: skip
                return
            # the chain logged the turn (status error) and yielded TurnFinished before
            # raising, e.g. ProviderUnavailable: the backend reports it, it does not crash
            if done is None:
                raise
            log.warning("turn %s: %s", done.turn_id, e)
        finally:
            if done is None and cut is None:  # cancelled (client gone) or crashed
                await self._observe_by_request_id(request_id)  # the chain logged it
        assert done is not None
        logged = await self._read(done.turn_id)
        if logged is not None:
            self._notify(logged)
        yield WireEvent(
            "turn",
            turn_summary(logged, done, conversation_id, finished),
        )

    def _wire(self, ev: Any, finished: dict[str, dict[str, Any]]) -> WireEvent:
        if isinstance(ev, TokenDelta):
            return WireEvent("token", {"step": ev.step, "text": ev.text})
        if isinstance(ev, ToolCallEvent):
            return WireEvent("tool", {
                "phase": ev.phase, "step": ev.step, "tool": ev.tool, "call_id": ev.call_id,
                "round": ev.round, "side_effects": ev.side_effects,
                "started_ms": ev.started_offset_ms, "duration_ms": ev.duration_ms,
                "status": ev.status, "error_type": ev.error_type,
            })  # fmt: skip
        if isinstance(ev, ProductsShown):
            # the rows the answer lists, for a chat page's product cards
            return WireEvent("products", {"step": ev.step, "products": list(ev.products)})
        if isinstance(ev, AnswerDone):
            return WireEvent(
                "answer_done",
                {"step": ev.step, "output": ev.text, "answer_ttft_ms": ev.answer_ttft_ms,
                 "answer_done_ms": ev.answer_done_ms, "pending": list(ev.pending),
                 "usage": ev.usage.as_json(), "turn_index": ev.turn_index},
            )  # fmt: skip
        if isinstance(ev, StepStarted):
            started = ev.started_offset_ms
            return WireEvent(
                "step",
                {"phase": "started", "step": ev.step, "kind": ev.kind, "started_ms": started},
            )
        assert isinstance(ev, StepFinished)
        data = {
            "phase": "finished",
            "step": ev.step,
            "kind": self.chain.config.steps[ev.step].kind,
            "status": ev.status,
            "started_ms": ev.started_offset_ms,
            "duration_ms": ev.duration_ms,
            "ttft_ms": ev.ttft_ms,
            "output_tokens": ev.output_tokens,
            "n_attempts": ev.n_attempts,
            "hedge_fired": ev.hedge_fired,
            "hedge_won": ev.hedge_won,
            "error_type": ev.error_type,
            "model": ev.model,
            "reasoning_effort": ev.reasoning_effort,
            "output": ev.output,
            "post_answer": ev.post_answer,
        }
        finished[ev.step] = data
        return WireEvent("step", data)

    async def _read(self, turn_id: int | None) -> TurnLog | None:
        """The turn as logged, once committed; None without a log, or when the log's
        database could not be reached within :data:`READ_TIMEOUT_S` (the answer is
        never held back by the log: the summary then comes from the events)."""
        store = self.chain.store
        if store is None or turn_id is None:
            return None
        return await store.aread_turn(turn_id, flush_timeout_s=READ_TIMEOUT_S)

    async def _observe_by_request_id(self, request_id: str) -> TurnLog | None:
        """Find a turn that ended without ``TurnFinished`` (cancelled) in the log by its
        request id, tell the observers, and return it (None: no log, or its database did
        not answer within :data:`READ_TIMEOUT_S`)."""
        store, run_id = self.chain.store, self.chain.run_id
        if store is None or run_id is None:
            return None
        try:
            await asyncio.wait_for(store.flush(), READ_TIMEOUT_S)
        except TimeoutError:
            return None  # the log's database is away: no observer call for this turn
        turn_id = await store.off_loop(store.find_turn_id, run_id, request_id)
        logged = None if turn_id is None else await store.aread_turn(turn_id)
        if logged is not None:
            self._notify(logged)
        return logged

    def _notify(self, logged: TurnLog) -> None:
        for obs in self.observers:
            try:
                obs.turn_logged(logged)
            except Exception:  # an exporter's fault must not fail the chat
                log.exception("observer %r failed on turn %s", obs, logged.turn_id)
