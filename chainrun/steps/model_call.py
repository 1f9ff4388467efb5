"""A step's hedged model call, as one piece a step kind composes.

:class:`HedgedCall` is what any kind that calls a model holds (the ``llm`` and ``guard``
kinds do, and so may a kind of your own): the step's providers and hedge targets, its
:class:`~chainrun.hedging.Hedger` (policy computed once, its own circuit breakers, its
latency window seeded from the fleet's recent calls), and :meth:`HedgedCall.run`, which
races the attempts, streams the winner's answer, carries out the tool calls a winner
asked for (:class:`~chainrun.steps.tool_use.ToolRounds`, round after round), and records
every attempt of every round as a ``calls`` row, the step's hedging summary in its
``steps`` row, and, once the turn is logged, the shadow losers' rows when they end.
The shape follows pydantic-ai's ``FallbackModel``, which wraps models rather than
being one.

Each attempt is a :class:`~chainrun.providers.base.ChatStream` on a provider (which knows
nothing of hedging) raced by the hedger (which knows nothing of models). Attempts are
numbered within their round (``calls.attempt``; ``calls.round`` says the round), so a
call with tools counts its copies, fires and wins per round: round 2's first attempt is
its primary, not a copy.

A kind of your own that calls a model (its config model extends
:class:`~chainrun.steps.model_config.ModelStepConfig`)::

    class Summary(Step):
        config_model = SummaryConfig  # kind: Literal["summary"] = "summary"
        state_fields = (StateField("summary", "the conversation in a line"),)

        def __init__(self, name, config):
            super().__init__(name, config)
            self.call = HedgedCall(name, config)

        reads = property(lambda self: template_fields(*self.config.templates().values()))
        def needs(self): return self.call.needs()
        async def open(self, ctx): await self.call.open(ctx)
        async def aclose(self): await self.call.aclose()

        def run(self, state, ctx):
            return self.call.step_items(ctx, self.call.request(state), lambda call:
                StepResult(error=call.error) if call.error is not None
                else StepResult(updates={"summary": call.text}))
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from chainrun.checks.holdback import HoldBack, OutputBlocked
from chainrun.conversations.history import history_messages
from chainrun.errors import (
    AnswerCutAtLimit,
    InvalidAnswer,
    ProviderError,
    ProviderStatusError,
    error_type,
)
from chainrun.events import TokenDelta, ToolCallEvent
from chainrun.hedging import AttemptInfo, AttemptRecord, HedgeOutcome, Hedger
from chainrun.hedging.advisor import hedge_detail
from chainrun.log.rows import CallRow
from chainrun.providers.base import ChatRequest, ChatStream, Provider
from chainrun.providers.rate_limit import Grant, RateLimited, RateLimiter, request_tokens
from chainrun.steps.answer_stream import settle_attempt, stream_answer
from chainrun.steps.base import (
    BuildContext,
    StepContext,
    StepItem,
    StepNeeds,
    StepResult,
    TurnState,
)
from chainrun.steps.model_config import ModelStepConfig, policy_from_config

if TYPE_CHECKING:
    from chainrun.log.store import Store
    from chainrun.steps.tool_use import ToolRounds

log = logging.getLogger(__name__)
#: s a new process waits for the run log's recent calls to seed a hedge window; past it
#: (or with the log's database unreachable) the window starts empty, with a warning
SEED_TIMEOUT_S = 5.0

__all__ = ["AnswerCheck", "CallResult", "CallRound", "HedgedCall", "call_row"]


def resolve_history_layout(
    layout: str, provider: Any
) -> Literal["transcript", "messages"]:
    """A step's ``history_layout`` decided: ``auto`` is ``messages`` for a provider of
    kind ``azure`` or at api.openai.com (chat models), else ``transcript``."""
    if layout in ("transcript", "messages"):
        return layout  # type: ignore[return-value]
    kind = getattr(provider, "kind", None)
    base_url = getattr(provider, "base_url", None)
    chat = kind == "azure" or (base_url is not None and "://api.openai.com" in base_url)
    return "messages" if chat else "transcript"


def call_row(
    step: str, attempt: AttemptRecord, request: ChatRequest, stream: ChatStream | None,
    provider: Provider | None, *, streamed: bool = False, round_: int = 1,
) -> CallRow:  # fmt: skip
    """One ``calls`` row from the engine's attempt record, the request actually sent and
    the attempt's stream timer (None: the attempt was never sent); ``streamed``: the
    step streamed its answer (``gen_ai.request.stream``); ``round_``: the round of the
    step's call the attempt belongs to.

    The fields are gathered first and validated once (one ``CallRow(**fields)``, not
    a row built and then set field by field: a third of the cost, on the event loop).
    """
    error = attempt.error
    fields: dict[str, Any] = {
        "step": step,
        "attempt": attempt.number,
        "round": round_,
        "target": attempt.target,
        "provider": provider.name if provider else attempt.target,
        "server_address": (stream.placement.address if stream is not None and stream.placement
                           else provider.server_address if provider else None),
        "model": request.model,
        "reasoning_effort": request.reasoning_effort,
        "stream": streamed,
        "temperature": request.temperature,
        "max_tokens": request.max_output_tokens,
        "stop": request.stop,
        "started_offset_ms": attempt.started_offset_ms,  # None: refused, never sent
        "outcome": attempt.outcome,
        "loop_lag_ms": attempt.loop_lag_ms,
        "fired_late": attempt.number > 1 and attempt.fired_during_loop_lag,
        "error_type": error_type(error) if error is not None else None,
        "error_message": str(error) if error else None,
    }
    if stream is not None:
        t = stream.timer
        usage = t.usage
        fields.update(
            # the format of every *_at column (chainrun.log.migrations.utc_now)
            started_at=datetime.fromtimestamp(stream.sent_at, UTC).isoformat(
                timespec="milliseconds"),
            prompt=list(request.messages),  # encoded once, when the row is written
            output=t.text,
            reasoning="".join(t.reasoning) or None,
            ttft_ms=t.ttft_ms,
            first_tool_call_ms=t.first_tool_call_ms,
            duration_ms=t.duration_ms,
            chunk_gaps_ms=list(t.chunk_gaps_ms),
            time_between_tokens_ms=t.time_between_tokens_ms,
            n_chunks=t.n_chunks,
            bytes_received=t.nbytes,
            response_model=t.model,
            response_id=t.response_id,
            finish_reason=t.finish_reason,
            truncated=t.truncated,
            server_timings=t.server_timings,
        )
        if usage is not None:
            fields.update(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                reasoning_tokens=usage.reasoning_tokens,
                cached_input_tokens=usage.cached_input_tokens,
            )
        if fields["error_type"] is None and stream.error is not None:
            fields["error_type"] = error_type(stream.error)
            fields["error_message"] = str(stream.error)
    if fields["error_type"] is None and attempt.outcome == "cancelled" and attempt.sent:
        # a loser closed when the race settled, or an attempt of a turn the caller
        # cancelled: the call ended without its answer, and the log says why
        fields["error_type"] = "cancelled"
    return CallRow(**fields)


def _with_headers(request: ChatRequest, headers: dict[str, str]) -> ChatRequest:
    """``dataclasses.replace(request, headers=headers)`` without its per-call walk over
    the fields (a copy of the frozen request's attributes; one per attempt, on the loop)."""
    copy = object.__new__(ChatRequest)
    copy.__dict__.update(request.__dict__, headers=headers)
    return copy


async def _close_all(streams: Sequence[ChatStream]) -> None:
    """Close every stream, even if the caller is being cancelled meanwhile (then the
    cancellation is raised once all are closed)."""
    cancelled: asyncio.CancelledError | None = None
    for s in streams:
        try:
            await s.aclose()
        except asyncio.CancelledError as e:
            cancelled = e
    if cancelled is not None:
        raise cancelled


@dataclass(frozen=True)
class AnswerStarted:
    """The streamed answer's winning attempt has its first token (the race of the call's
    first round settled): yielded by :meth:`HedgedCall.run` when asked
    (``announce_start``), before any of the answer's text, which the checks may still
    hold back. The answer step shows its lead then: chainrun's own words reach the
    shopper as soon as the model is answering, not after its first checked sentence."""

    step: str


@dataclass(frozen=True)
class AnswerCheck:
    """The checks a streamed answer goes through in the hold-back engine (the kind's:
    the answer step's list of checks, :mod:`chainrun.checks.stream`).

    Attributes:
        make: a hold-back engine for one round's answer stream, given the tool results
            so far (by tool name; empty in a call without tools); None: no check this
            round.
        record: puts the engine's figures in the step's row once the stream ended
            (``ctx``, the engine, the winning stream or None, the block or None).
    """

    make: Callable[[Mapping[str, Any]], HoldBack | None]
    record: Callable[[StepContext, HoldBack, ChatStream | None, OutputBlocked | None], None]


@dataclass
class CallRound:
    """One round's race: its request, attempts (by their number within the round, from
    1), the engine's outcome and the winner.

    Attributes:
        number: the round, from 1 (a call without tools has one).
        request: what its attempts sent (before per-attempt headers).
        streams: each attempt sent, by its number within the round.
        outcome: the engine's outcome (None: the race did not settle, e.g. cancelled).
        winner: the winning attempt's stream (None: no attempt won).
        error: why no attempt won.
        race_started: when the hedging engine's race began (``time.perf_counter`` s;
            None: not begun); its attempts' offsets count from it.
    """

    number: int
    request: ChatRequest
    streams: dict[int, ChatStream] = field(default_factory=dict)
    outcome: HedgeOutcome[ChatStream] | None = None
    winner: ChatStream | None = None
    error: BaseException | None = None
    #: each attempt's grant of its provider's rate limit, by attempt number
    grants: dict[int, Grant] = field(default_factory=dict)
    race_started: float | None = None

    def correct_grants(self) -> None:
        """Count each granted attempt's reported usage (prompt + completion tokens)
        in its rate limit instead of the estimate (attempts with no usage yet keep it)."""
        for number, grant in self.grants.items():
            s = self.streams.get(number)
            usage = s.timer.usage if s is not None else None
            if usage is not None and usage.input_tokens is not None:
                grant.correct(usage.input_tokens + (usage.output_tokens or 0))

    def hedge(self) -> dict[str, Any]:
        """The round's hedge as ``steps.detail["hedge_rounds"]`` logs it: ``{"round",
        "fired", "won", "time_saved_ms"}`` (ms; None until measured: a shadow loser that
        has not finished). A race stopped before it settled fired when a copy was sent."""
        if self.outcome is None:
            fired, won, saved = len(self.streams) > 1, False, None
        else:
            fired, won = self.outcome.fired, self.outcome.won_by_copy
            saved = self.outcome.time_saved_ms
        return {"round": self.number, "fired": fired, "won": won, "time_saved_ms": saved}

    def winner_attempt(self) -> int:
        """The winning attempt's number within the round (1 when none won)."""
        return next((n for n, s in self.streams.items() if s is self.winner), 1)

    def attempts(self, t0: float) -> Sequence[AttemptRecord]:
        """The engine's attempt records, or, for a race that did not settle, one
        ``cancelled`` record per attempt sent (``t0``: the step's start, perf_counter s)."""
        if self.outcome is not None:
            return self.outcome.attempts
        return [
            AttemptRecord(number=n, target=s.provider.name, outcome="cancelled",
                          started_offset_ms=(s.timer.t_start - t0) * 1000.0)
            for n, s in sorted(self.streams.items())
        ]  # fmt: skip


@dataclass
class CallResult:
    """How a step's model call ended (the last item :meth:`HedgedCall.run` yields).

    Attributes:
        winner: the last round's winning stream (None: no attempt won); with ``error``
            set, what arrived of a cut answer.
        error: why the call has no answer (None: it answered).
        blocked: the output check blocked the streamed answer.
        shown: the answer's text as it reached the shopper (streamed calls), pieces.
        rounds: every round raced.
        tool_results: the last result of each tool the model called, by tool name.
    """

    winner: ChatStream | None = None
    error: BaseException | None = None
    blocked: OutputBlocked | None = None
    shown: list[str] = field(default_factory=list)
    rounds: list[CallRound] = field(default_factory=list)
    tool_results: dict[str, Any] = field(default_factory=dict)
    #: chainrun's own words after the winner's text: the question of the actions the
    #: round asked for that wait for the shopper's yes ("": none)
    appended: str = ""

    @property
    def text(self) -> str | None:
        """The answer's text (None: no answer), chainrun's question after it when the
        model asked for a tool that waits for the shopper's yes."""
        return self.winner.timer.text + self.appended if self.winner is not None else None


class HedgedCall:
    """A step's hedged model call (see the module text).

    Args:
        step: the step's name (its rows are logged under it).
        config: the step's model settings (request, deadline, stream timers, hedging).
        answer_problem: why an answer's text is not acceptable (None: it is): a quality
            gate in the race of a hedged call that does not stream (a fast answer that
            fails it does not win; a round that asked for tools passes it), and the
            call's failure (:class:`~chainrun.errors.InvalidAnswer`) when the answer it
            settled on fails it. None: every answer is acceptable.
    """

    def __init__(
        self, step: str, config: ModelStepConfig, *,
        answer_problem: Callable[[str | None], str | None] | None = None,
    ) -> None:  # fmt: skip
        self.step = step
        self.config = config
        #: the hedging engine's policy for this step (computed once)
        self.policy = policy_from_config(config)
        self.answer_problem = answer_problem
        self.providers: dict[str, Provider] = {}
        #: the rate limiter of each target that has one (``[providers.NAME]``)
        self.rate_limits: dict[str, RateLimiter] = {}
        self._hedger: Hedger[ChatStream] | None = None
        self._store: Store | None = None
        #: how a prompt that begins with {history} shows it (decided in :meth:`open`)
        self.history_layout: Literal["transcript", "messages"] = (
            "messages" if config.history_layout == "messages" else "transcript"
        )

    @property
    def hedger(self) -> Hedger[ChatStream]:
        """The step's hedger (its window, budget, breakers and statistics).

        Raises:
            RuntimeError: :meth:`open` was not called.
        """
        if self._hedger is None:
            raise RuntimeError(f"step {self.step}: its model call was not opened")
        return self._hedger

    def needs(self) -> StepNeeds:
        """Its provider and hedge targets, its policy (the chain builds its breakers), the
        log (shadow losers update their rows after the turn is logged), its request
        settings for the capability check."""
        cfg = self.config
        return StepNeeds(
            providers=tuple(cfg.provider_names()), policy=self.policy,
            hedged=cfg.hedge is not None, model=cfg, log=True,
        )  # fmt: skip

    async def open(self, ctx: BuildContext) -> None:
        """Take the step's providers and breakers, build its hedger, and seed its latency
        window from the fleet's recent calls of this step when ``ctx.seed_windows`` asks
        (a hedged step whose delay comes from the window)."""
        cfg, policy = self.config, self.policy
        self.history_layout = resolve_history_layout(
            cfg.history_layout, ctx.config.providers.get(cfg.provider)
        )
        targets = cfg.provider_names()
        self.providers = {t: ctx.providers[t] for t in targets}
        self.rate_limits = {t: ctx.rate_limits[t] for t in targets if t in ctx.rate_limits}
        self._store = ctx.store
        self._hedger = Hedger(
            policy, targets, breakers=ctx.breakers_for(self.step), loop_lag=ctx.loop_lag
        )
        seed, store = ctx.seed_windows, ctx.store
        if seed is None or store is None or not policy.hedges or policy.delay_ms is not None:
            return
        # the fleet's recent calls of this step to the same servers and model (not a
        # replay's against the lab, say), before the first turn (off the loop)
        addresses = [p.server_address for p in self.providers.values()]
        servers = None if None in addresses else [a for a in addresses if a is not None]
        unreachable: tuple[type[BaseException], ...] = (TimeoutError, *store.log.network_errors)
        try:  # the log is behind the answer: a log that cannot be read seeds nothing
            samples = await asyncio.wait_for(store.off_loop(
                store.recent_latencies, self.step, max_calls=seed.max_calls,
                within_s=seed.within_s, servers=servers, model=cfg.model,
            ), SEED_TIMEOUT_S)  # fmt: skip
        except unreachable as e:
            why = str(e) or type(e).__name__
            log.warning("step %s: hedge window not seeded: the run log %s could not be "
                        "read (%s)", self.step, store.name, why)  # fmt: skip
            samples = []
        self._hedger.seed_window(samples)

    async def aclose(self) -> None:
        """Cancel the shadow losers still running and release the hedger."""
        if self._hedger is not None:
            await self._hedger.aclose()

    def request(self, state: TurnState, *, cache_owner: bool = False) -> ChatRequest:
        """The request the step sends for ``state`` (its templates filled), with the
        turn's prompt-cache key (:attr:`TurnState.affinity_key`: its conversation unless
        the client gave a hint); ``cache_owner``: the step is the
        chain's answer step (it keeps the conversation's cache)."""
        cfg = self.config
        # a prompt that begins with the history names what the history already shows
        after = cfg.prompt.startswith("{history}")
        values = state.prompt_vars(after_history=after)
        messages = []
        if cfg.system:
            messages.append({"role": "system", "content": cfg.system.format(**values)})
        if after and self.history_layout == "messages":
            # the earlier turns as role messages before this one, not text inside it
            messages += history_messages(state.history.turns)
            values["history"] = ""
        messages.append({"role": "user", "content": cfg.prompt.format(**values)})
        return ChatRequest(
            model=cfg.model, messages=messages, max_output_tokens=cfg.max_output_tokens,
            temperature=cfg.temperature, reasoning_effort=cfg.reasoning_effort,
            reasoning_summary=cfg.reasoning_summary, seed=cfg.seed,
            stop=cfg.stop, json_schema=cfg.json_schema, sampling=cfg.sampling,
            cache_key=state.affinity_key, cache_owner=cache_owner,
        )  # fmt: skip

    # ------------------------------------------------------------------ the call

    async def race(self, rnd: CallRound, deadline: float | None = None) -> None:
        """Race one round's attempts (fills ``rnd``); each attempt is sent with its number
        within the round in ``x-chainrun-attempt``. With a rate limit on a target
        (``[providers.NAME] requests_per_minute`` / ``tokens_per_minute``) the round's
        first attempt waits for room until ``deadline`` (loop time; default the step's
        deadline from now), a copy or retry goes only with room now (else it is not
        sent: ``rate_limited``), and a 429 with ``Retry-After`` holds the limit."""
        cfg = self.config
        limits = self.rate_limits
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + cfg.deadline_s
        tokens = request_tokens(rnd.request) if limits else 0

        def admit(number: int, target: str) -> BaseException | None:
            limiter = limits.get(target)
            if limiter is None:
                return None
            grant = limiter.try_acquire(tokens)
            if grant is None:
                return RateLimited(f"{target}: its rate limit has no room now (a copy does "
                                   "not wait)")  # fmt: skip
            rnd.grants[number] = grant
            return None

        async def attempt(info: AttemptInfo) -> ChatStream:
            limiter = limits.get(info.target)
            if limiter is not None and info.number not in rnd.grants:  # the first: waits
                rnd.grants[info.number] = await limiter.acquire(tokens, deadline=deadline)
            try:
                return await self._attempt(rnd, info)
            except ProviderStatusError as e:
                if limiter is not None and e.status == 429 and e.retry_after_s is not None:
                    limiter.hold(e.retry_after_s)  # every step of the process waits it out
                raise

        async def release(s: ChatStream) -> None:
            await s.aclose()

        problem = self.answer_problem

        def accept(s: ChatStream) -> bool:
            # quality gate: a fast answer that is not acceptable must not win (an attempt
            # that asked for tools has no answer yet to judge)
            return bool(s.timer.tool_calls) or problem is None or problem(s.timer.text) is None

        gate = accept if problem is not None and cfg.hedge is not None and not cfg.stream else None
        rnd.race_started = time.perf_counter()  # the engine's offsets count from here
        rnd.outcome = await self.hedger.run(attempt, release=release, accept=gate,
                                            admit=admit if limits else None)  # fmt: skip
        if rnd.outcome.error is not None:
            rnd.error = rnd.outcome.error
        else:
            rnd.winner = rnd.outcome.value

    async def _attempt(self, rnd: CallRound, info: AttemptInfo) -> ChatStream:
        """One attempt of ``rnd``: its stream, settled as the step reads it."""
        cfg = self.config
        req = _with_headers(rnd.request, {**rnd.request.headers,
                                          "x-chainrun-attempt": str(info.number)})
        s = ChatStream(
            self.providers[info.target], req,
            first_token_timeout_s=cfg.first_token_timeout_s,
            idle_timeout_s=cfg.idle_timeout_s,
            pump=cfg.stream,  # a whole answer is read in this attempt's own task
        )  # fmt: skip
        rnd.streams[info.number] = s
        return await settle_attempt(s, cfg.stream)

    async def run(
        self, ctx: StepContext, request: ChatRequest, *,
        checks: AnswerCheck | None = None,
        tools: ToolRounds | None = None,
        announce_start: bool = False,
    ) -> AsyncGenerator[TokenDelta | ToolCallEvent | AnswerStarted | CallResult, None]:  # fmt: skip
        """Run the step's call: yields the answer's :class:`~chainrun.events.TokenDelta` s
        (a streamed call), a :class:`~chainrun.events.ToolCallEvent` per tool call start
        and end (with ``tools``), then one :class:`CallResult`; with ``announce_start``
        (a streamed call), an :class:`AnswerStarted` as soon as the first round's
        winner has its first token. Everything is recorded
        in ``ctx`` (its calls, its row's hedging summary), even when the caller cancels.

        Args:
            ctx: the step's run in this turn.
            request: the first round's request (:meth:`request`).
            checks: the checks a streamed answer goes through (None: none).
            tools: the tools the model may call (None: none; the call is one round).

        Raises:
            asyncio.CancelledError: the caller cancelled (every attempt closed first).
        """
        cfg = self.config
        hedger = self.hedger
        deadline = asyncio.get_running_loop().time() + cfg.deadline_s
        result = CallResult()
        rounds = result.rounds
        stream: HoldBack | None = None
        cancelled = False
        seeded = hedger.delay_seeded()  # as the race reads its delay, just below
        try:
            if tools is not None:  # actions the shopper confirmed: carried out first
                confirmed = tools.confirmed_round(request,
                                                  step_offset_ms=ctx.row.started_offset_ms)
                async with contextlib.aclosing(confirmed):
                    async for event in confirmed:
                        yield event
            for number in itertools.count(1):
                rnd = CallRound(number, request if tools is None else tools.request(request))
                rounds.append(rnd)
                if number == 1:  # the race's own deadline is the step's
                    await self.race(rnd, deadline)
                else:
                    async with asyncio.timeout_at(deadline):
                        await self.race(rnd, deadline)
                if rnd.error is not None:
                    result.error = rnd.error
                    break
                winner = rnd.winner
                assert winner is not None
                if cfg.stream:
                    if announce_start and number == 1:
                        yield AnswerStarted(self.step)
                    stream = checks.make(tools.results if tools else {}) if checks else None
                    deltas = stream_answer(self.step, winner, stream, deadline, result.shown)
                    async with contextlib.aclosing(deltas):
                        async for delta in deltas:
                            yield delta
                else:
                    async with asyncio.timeout_at(deadline):
                        await winner.collect()
                asked = tools.asked(winner, number) if tools is not None else []
                if not asked:
                    break
                assert tools is not None
                events = tools.carry_out(
                    asked, text=winner.timer.text,
                    reasoning="".join(winner.timer.reasoning) or None,
                    attempt=rnd.winner_attempt(),
                    round_=number, step_offset_ms=ctx.row.started_offset_ms,
                )  # fmt: skip
                async with contextlib.aclosing(events):
                    async for event in events:
                        yield event
                if tools.awaiting:  # the shopper is asked (chainrun's words); the step ends
                    result.appended = tools.question(winner.timer.text)
                    if cfg.stream:
                        result.shown.append(result.appended)
                        yield TokenDelta(step=self.step, text=result.appended)
                    break
        except OutputBlocked as e:
            result.blocked = e  # the stream is closed below, like a loser's
        except (ProviderError, TimeoutError) as e:
            result.error = e
        except asyncio.CancelledError:
            # the caller went away: a winner cut mid-answer was cancelled, not failed
            cancelled = True
            raise
        finally:
            current = rounds[-1] if rounds else None
            result.winner = current.winner if current is not None else None
            try:
                if current is not None:
                    # cancelled before the engine settled: close every attempt
                    to_close = (list(current.streams.values()) if current.outcome is None
                                else [current.winner])  # fmt: skip
                    await _close_all([s for s in to_close if s is not None])
            finally:  # recorded even when the close is interrupted by a cancellation
                result.error = self._record(ctx, result, tools, cancelled=cancelled)
                if seeded and ctx.row.hedge_delay_ms is not None:
                    # the delay came from a window holding the fleet's seeded samples
                    ctx.row.detail = {**(ctx.row.detail or {}), "hedge_delay_seeded": True}
                if stream is not None and checks is not None:
                    checks.record(ctx, stream, result.winner, result.blocked)
                if any(r.outcome is not None and r.outcome.shadows_pending for r in rounds):
                    ctx.after_log.append(self._shadow_settler(rounds, deadline,
                                                              tools is not None, ctx.started))
        if tools is not None:
            result.tool_results = dict(tools.results)
        yield result

    async def step_items(
        self, ctx: StepContext, request: ChatRequest,
        finish: Callable[[CallResult], StepResult | Awaitable[StepResult]], *,
        checks: AnswerCheck | None = None,
        tools: ToolRounds | None = None,
    ) -> AsyncGenerator[StepItem, None]:  # fmt: skip
        """A step's run made of this call: :meth:`run`'s events, then ``finish`` of its
        :class:`CallResult` (what the kind makes of the answer; awaited when it is a
        coroutine) as the step's result."""
        result: CallResult | None = None
        items = self.run(ctx, request, checks=checks, tools=tools)
        async with contextlib.aclosing(items):
            async for item in items:
                if isinstance(item, CallResult):
                    result = item
                elif not isinstance(item, AnswerStarted):
                    yield item
        assert result is not None
        finished = finish(result)
        yield await finished if inspect.isawaitable(finished) else finished

    # --------------------------------------------------------------- the record

    def _record(
        self, ctx: StepContext, result: CallResult, tools: ToolRounds | None, *,
        cancelled: bool,
    ) -> BaseException | None:  # fmt: skip
        """Fill the step's row, its calls (every attempt of every round) and tool calls;
        return the call's error (None: it answered). ``cancelled``: the caller cancelled
        (the answer's call, if cut, is recorded as ``cancelled``)."""
        row, rounds, error, answer = ctx.row, result.rounds, result.error, result.winner
        row.duration_ms = ctx.elapsed_ms()
        rows_error = error if error is not None or not cancelled else asyncio.CancelledError()
        calls: list[CallRow] = []
        detail: dict[str, Any] = {}
        output_tokens: int | None = 0
        row.n_attempts = 0
        per_round: list[dict[str, Any]] = []
        for i, rnd in enumerate(rounds):
            last = i == len(rounds) - 1
            outcome = rnd.outcome
            row.n_attempts += len(rnd.streams)
            if outcome is not None:
                for key, value in hedge_detail(outcome).items():
                    detail[key] = (detail.get(key, []) + value if isinstance(value, list)
                                   else value)  # fmt: skip
            hedge = rnd.hedge()
            row.hedge_fired = row.hedge_fired or hedge["fired"]
            row.hedge_won = row.hedge_won or hedge["won"]
            per_round.append(hedge)
            if i == 0:
                row.hedge_delay_ms = (outcome.delay_ms if outcome is not None
                                      else self.hedger.current_delay_ms())  # fmt: skip
            rnd.correct_grants()
            calls.extend(self._call_rows(rnd, ctx.started, rows_error if last else None))
            usage = rnd.winner.timer.usage if rnd.winner is not None else None
            if output_tokens is not None:
                output_tokens = (output_tokens + usage.output_tokens
                                 if usage is not None and usage.output_tokens is not None
                                 else None)  # fmt: skip
        ctx.calls[:] = calls
        row.time_saved_ms = _time_saved(per_round)
        if tools is not None:
            ctx.tool_calls[:] = tools.rows()
            detail["tool_rounds"] = len(rounds)
            # the hedge per round (StepRow.hedge_rounds): a round is a call of its own
            detail["hedge_rounds"] = per_round
        if detail:
            row.detail = {**(row.detail or {}), **detail}
        ctx.output_tokens = output_tokens if rounds and answer is not None else None
        if answer is not None:
            ttft = answer.timer.ttft_ms
            if tools is not None and ttft is not None:
                # the answer came in a later round: its TTFT from the step's start
                ttft += (answer.timer.t_start - ctx.started) * 1000.0
            ctx.ttft_ms = ttft
            if error is None and answer.error is not None:
                error = answer.error
            row.output = answer.timer.text  # what arrived, even before a failure
            row.truncated = answer.timer.cut_at_limit
            if error is None and row.truncated and self.config.on_truncated == "fail":
                error = AnswerCutAtLimit(
                    f"{self.step}: the answer reached the token cap (max_output_tokens = "
                    f"{self.config.max_output_tokens}) and on_truncated = 'fail'"
                )
            if error is None and self.answer_problem is not None and result.blocked is None:
                problem = self.answer_problem(answer.timer.text)
                if problem is not None:
                    error = InvalidAnswer(f"{self.step}: {problem}")
        if error is not None:
            row.error_type = error_type(error)
        return error

    def _call_rows(
        self, rnd: CallRound, t0: float, step_error: BaseException | None
    ) -> list[CallRow]:
        """One row per attempt of ``rnd``. The winner's row also carries the step's error
        when its stream was cut by the step (the deadline), so a cut call is never
        error-free."""
        rows = []
        # the engine counts its attempts' offsets from its race; a row, from the step's
        # start (the answer's lead, the confirmed actions, earlier tool rounds come first)
        shift_ms = 0.0
        if rnd.outcome is not None and rnd.race_started is not None:
            shift_ms = (rnd.race_started - t0) * 1000.0
        for a in rnd.attempts(t0):
            s = rnd.streams.get(a.number)
            row = call_row(self.step, a, s.request if s else rnd.request, s,
                           self.providers.get(a.target), streamed=self.config.stream,
                           round_=rnd.number)  # fmt: skip
            if row.started_offset_ms is not None:
                row.started_offset_ms += shift_ms
            grant = rnd.grants.get(a.number)
            if grant is not None and grant.waited_s > 0:
                row.rate_limit_wait_ms = grant.waited_s * 1000.0
            if s is not None and s is rnd.winner and row.error_type is None and step_error:
                if isinstance(step_error, asyncio.CancelledError):
                    if s.timer.finish_reason is None:  # cut by the caller, not finished
                        row.error_type, row.error_message = "cancelled", "cancelled by the caller"
                else:
                    row.error_type = error_type(step_error)
                    row.error_message = str(step_error)
            rows.append(row)
        return rows

    def _shadow_settler(
        self, rounds: list[CallRound], deadline: float, per_round: bool, t0: float
    ) -> Callable[[int | None], Awaitable[None]]:
        """A callback that waits (inside the step's deadline) for the shadow losers of
        every round that left some, then rewrites those rounds' ``calls`` rows and the
        step's measured ``time_saved_ms`` (the sum over its rounds, as :meth:`_record`
        writes it), with each round's in ``detail["hedge_rounds"]`` when ``per_round``
        (a call with tools). ``t0``: the step's start (``time.perf_counter`` s), which
        the rows' offsets count from."""
        pending = [r for r in rounds if r.outcome is not None and r.outcome.shadows_pending]

        async def settle(turn_id: int | None) -> None:
            remaining = max(0.0, deadline - asyncio.get_running_loop().time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    for rnd in pending:
                        assert rnd.outcome is not None
                        await rnd.outcome.shadows_done()
            if self._store is None or turn_id is None:
                return
            for rnd in pending:
                rnd.correct_grants()  # the shadows' usage, now that they ended
            rows = [row for rnd in pending for row in self._call_rows(rnd, t0, None)]
            hedges = [rnd.hedge() for rnd in rounds]
            await self._store.aupdate_step_calls(turn_id, self.step, rows, _time_saved(hedges),
                                                 hedge_rounds=hedges if per_round else None)

        return settle


def _time_saved(hedges: Sequence[dict[str, Any]]) -> float | None:
    """A step's time saved: the sum of its rounds' measured ``time_saved_ms`` (ms; None
    when no round measured one)."""
    saved = [h["time_saved_ms"] for h in hedges if h["time_saved_ms"] is not None]
    return sum(saved) if saved else None
