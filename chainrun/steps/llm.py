"""The LLM step: one model call per turn, hedged by the step's policy, streamed or not.

Each attempt is a :class:`~chainrun.providers.base.ChatStream` on a provider (which
knows nothing of hedging) raced by the step's :class:`~chainrun.hedging.Hedger`
(which knows nothing of LLMs); every attempt becomes a ``calls`` row built from the
request actually sent.

What the step writes follows from its config (:class:`LLMConfig`): the chain's
``answer_step`` writes ``answer``; a step with ``labels`` writes ``label`` (the first
label its answer names, "other" when none); any other LLM step is a check whose answer
becomes the turn's verdict for it (parsed JSON when it expects JSON, else
``{"text": ...}``). It reads the turn-state fields its templates name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from chainrun.answer_json import answer_problem, parse_json_object
from chainrun.checks.config import GroundingConfig, OutputCheckConfig
from chainrun.checks.holdback import (
    HoldBack,
    OutputBlocked,
    WindowCheck,
    exposure_bound,
    window_check,
)
from chainrun.checks.verdict import MissingReason
from chainrun.errors import (
    AnswerCutAtLimit,
    InvalidAnswer,
    ProviderError,
    ProviderTimeout,
    error_type,
)
from chainrun.hedging import AttemptInfo, AttemptRecord, HedgeOutcome, Hedger
from chainrun.hedging.advisor import hedge_detail
from chainrun.log.rows import CallRow
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest, ChatStream, Provider
from chainrun.steps.answer_stream import settle_attempt, stream_answer
from chainrun.steps.base import (
    ANSWER,
    LABEL,
    BuildContext,
    Step,
    StepContext,
    StepItem,
    StepNeeds,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.config import StepConfig
from chainrun.steps.grounding import AnswerGrounding, open_grounding
from chainrun.steps.model_config import ModelStepConfig, policy_from_config, template_fields
from chainrun.steps.tool_use import run_tool_rounds
from chainrun.tools import Tool

log = logging.getLogger(__name__)
#: s a new process waits for the run log's recent calls to seed a hedge window; past it
#: (or with the log's database unreachable) the window starts empty, with a warning
SEED_TIMEOUT_S = 5.0

#: The verdict a validating step (``on_reject`` refuse or replace) must give when its
#: config names no ``json_schema``: ``{"ok": bool, "reason": str}``.
VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["ok", "reason"],
}


def missing_reason(error: BaseException) -> MissingReason:
    """Why a checking step has no verdict: ``timeout`` (its deadline or a stream timer),
    ``unparseable`` (it answered, but not a verdict of the required form), ``error``."""
    if isinstance(error, TimeoutError | ProviderTimeout):
        return "timeout"
    return "unparseable" if isinstance(error, InvalidAnswer) else "error"


def parse_label(text: str | None, labels: Sequence[str]) -> str:
    """The first of ``labels`` named in ``text`` (case, spaces and dashes ignored), or
    "other" when none is."""
    low = (text or "").lower().replace("-", "_").replace(" ", "_")
    found = [(low.find(lab), lab) for lab in labels if lab in low]
    return min(found)[1] if found else "other"


def call_row(
    step: str, attempt: AttemptRecord, request: ChatRequest, stream: ChatStream | None,
    provider: Provider | None, *, streamed: bool = False,
) -> CallRow:  # fmt: skip
    """One ``calls`` row from the engine's attempt record, the request actually sent and
    the attempt's stream timer (None: the attempt was never sent); ``streamed``: the
    step streamed its answer (``gen_ai.request.stream``).

    The fields are gathered first and validated once (one ``CallRow(**fields)``, not
    a row built and then set field by field: a third of the cost, on the event loop).
    """
    error = attempt.error
    fields: dict[str, Any] = {
        "step": step,
        "attempt": attempt.number,
        "target": attempt.target,
        "provider": provider.name if provider else attempt.target,
        "server_address": provider.server_address if provider else None,
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


class LLMConfig(ModelStepConfig):
    """An ``llm`` step (``[steps.NAME]``, the default kind): a model call whose answer
    is the turn's answer (the ``answer_step``), its ``label`` (with ``labels``) or a
    verdict (any other step)."""

    answers: ClassVar[bool] = True

    kind: Literal["llm"] = "llm"
    #: an LLM step with labels writes the turn's ``label``: the first of these its
    #: answer names ("other" when none)
    labels: list[str] | None = None
    #: a checking step's rejection (its JSON verdict has ``"ok": false``): ``flag`` only
    #: records it; ``refuse`` answers ``reject_text`` (default: the chain's refusal);
    #: ``replace`` answers ``reject_text`` (required) instead. With refuse or replace
    #: a streamed answer is held back from the user until this step's verdict.
    on_reject: Literal["flag", "refuse", "replace"] = "flag"
    #: what the shopper is told when this step rejects the answer (see ``on_reject``)
    reject_text: str | None = None
    #: the answer step only: checks on its stream, in held-back windows
    output_check: OutputCheckConfig | None = None
    #: the answer step's stream only: its product, price, stock and policy claims
    #: against the turn's own sources (chainrun.checks.grounding); None: off
    grounding: GroundingConfig | None = None
    #: the tools (names of ``[tools.NAME]`` tables) the step's model may call; the step
    #: runs rounds of model call, tool calls and results until the model answers in text
    tools: list[str] = Field(default_factory=list)
    #: which of ``tools`` the step offers, by the turn's classify label (a label not
    #: named offers all of ``tools``); the step then waits for ``label``
    tools_by_label: dict[str, list[str]] = Field(default_factory=dict)
    #: rounds of tool calls at most; a model that still asks for tools after them fails
    #: the step (``tool_rounds_exceeded``) under its ``on_failure``
    max_tool_rounds: int = Field(default=4, ge=1, le=32)
    #: a turn-state field the step writes with its tools' results (JSON by tool name:
    #: the last result of each), for the steps after it; None: none
    tool_results_field: str | None = None

    @model_validator(mode="after")
    def _tools_by_label_are_tools(self) -> LLMConfig:
        for label, names in self.tools_by_label.items():
            extra = [n for n in names if n not in self.tools]
            if extra:
                raise ValueError(
                    f"tools_by_label.{label}: {extra[0]!r} is not one of the step's tools "
                    f"{self.tools}"
                )
        if self.tool_results_field is not None and not self.tools:
            raise ValueError("tool_results_field: the step has no tools")
        return self

    def tool_refs(self) -> list[str]:
        """The step's ``tools``."""
        return list(self.tools)

    def added_fields(self) -> list[str]:
        """``tool_results_field``, when set."""
        return [self.tool_results_field] if self.tool_results_field else []

    @model_validator(mode="after")
    def _replace_needs_text(self) -> LLMConfig:
        if self.on_reject == "replace" and not self.reject_text:
            raise ValueError(
                "reject_text: on_reject = 'replace' needs the safe answer to show instead"
            )
        return self

    def chain_problem(self, name: str, answer_step: str) -> str | None:
        """``output_check`` is only for the answer step's stream."""
        if self.output_check is not None and (name != answer_step or not self.stream):
            return (
                "output_check: only the answer step's stream is checked this way "
                f"(answer_step is {answer_step!r}; it needs stream = true)"
            )
        return None


#: What a model step that is not an ``llm`` step does about labels, rejections and
#: output checks: nothing (a guard; a registered kind built on :class:`LLMStep`).
_NO_LLM_OPTIONS = LLMConfig()


@register_step_kind
class LLMStep(Step):
    """A model call (``kind = "llm"``), hedged per ``[steps.NAME.hedge]``."""

    kind = "llm"
    config_model: ClassVar[type[StepConfig]] = LLMConfig
    config: ModelStepConfig
    state_fields = (ANSWER, LABEL)

    def __init__(self, name: str, config: ModelStepConfig) -> None:
        super().__init__(name, config)
        #: labels, on_reject, reject_text, output_check (an llm step's; none for others)
        self.llm = config if isinstance(config, LLMConfig) else _NO_LLM_OPTIONS
        self._hedger: Hedger[ChatStream] | None = None
        self._providers: dict[str, Provider] = {}
        self._store: Store | None = None
        #: the step's tools (its config's ``tools``), by name, once opened
        self.tools: dict[str, Tool] = {}
        self.is_answer = False
        # a verdict that can refuse or replace the answer must be seen before the answer
        self.holds_answer = self.llm.on_reject != "flag"
        #: the verdict's JSON Schema, checked with jsonschema: the configured one, or
        #: {"ok": bool, "reason": str} for a validating step (refuse or replace)
        self.answer_schema = config.json_schema or (
            VERDICT_SCHEMA if self.llm.on_reject != "flag" else None
        )
        # the answer step's stream through the hold-back engine (output_check)
        self._window_check: WindowCheck | None = (
            window_check(patterns=self.llm.output_check.checker())
            if self.llm.output_check is not None
            else None
        )
        #: the answer's grounding check (built by open() for a streamed answer step)
        self.grounding: AnswerGrounding | None = None

    @property
    def reads(self) -> frozenset[str]:
        fields = template_fields(*self.config.templates().values())
        if self.llm.tools_by_label:
            fields |= {"label"}  # the label picks the tools the step offers
        return fields

    @property
    def writes(self) -> frozenset[str]:
        extra = {self.llm.tool_results_field} if self.llm.tool_results_field else set()
        if self.is_answer:
            return frozenset({"answer", *extra})
        if self.llm.labels:
            return frozenset({"label", *extra})
        return frozenset(extra)

    @property
    def model(self) -> str | None:
        return self.config.model

    @property
    def reasoning_effort(self) -> str | None:
        return self.config.reasoning_effort

    def needs(self) -> StepNeeds:
        """Its provider and hedge targets, its policy, the log (shadow losers update
        their rows after the turn is logged), its request settings for the capability
        check."""
        cfg = self.config
        return StepNeeds(
            providers=tuple(cfg.provider_names()), policy=policy_from_config(cfg),
            hedged=cfg.hedge is not None, model=cfg, log=True,
        )  # fmt: skip

    @property
    def wants_json(self) -> bool:
        return self.config.expect_json or self.answer_schema is not None

    def bind(self, answer_step: str) -> None:
        """Tell the step whether it is the chain's answer step (before the graph is built)."""
        self.is_answer = self.name == answer_step

    async def open(self, ctx: BuildContext) -> None:
        cfg = self.config
        targets = cfg.provider_names()
        self._providers = {t: ctx.providers[t] for t in targets}
        self._store = ctx.store
        policy = policy_from_config(cfg)
        self._hedger = Hedger(
            policy, targets, breakers=ctx.breakers_for(policy), loop_lag=ctx.loop_lag
        )
        self.tools = {name: ctx.tools[name] for name in self.llm.tools}
        g = self.llm.grounding
        if g is not None and g.enabled and self.is_answer and cfg.stream:
            self.grounding = await open_grounding(g, ctx)
        seed, store = ctx.seed_windows, ctx.store
        if (seed is not None and store is not None and policy is not None and policy.hedges
                and policy.delay_ms is None):
            # the fleet's recent calls of this step to the same servers and model (not a
            # replay's against the lab, say), before the first turn (off the loop)
            addresses = [p.server_address for p in self._providers.values()]
            servers = None if None in addresses else [a for a in addresses if a is not None]
            unreachable: tuple[type[BaseException], ...] = (
                TimeoutError, *store.log.network_errors
            )
            try:  # the log is behind the answer: a log that cannot be read seeds nothing
                samples = await asyncio.wait_for(store.off_loop(
                    store.recent_latencies, self.name, max_calls=seed.max_calls,
                    within_s=seed.within_s, servers=servers, model=cfg.model,
                ), SEED_TIMEOUT_S)  # fmt: skip
            except unreachable as e:
                why = str(e) or type(e).__name__
                log.warning("step %s: hedge window not seeded: the run log %s could not be "
                            "read (%s)", self.name, store.name, why)  # fmt: skip
                samples = []
            self._hedger.seed_window(samples)

    async def aclose(self) -> None:
        if self._hedger is not None:
            await self._hedger.aclose()

    def request(self, state: TurnState) -> ChatRequest:
        """The request this step sends for ``state`` (templates filled)."""
        cfg, values = self.config, state.prompt_vars()
        messages = []
        if cfg.system:
            messages.append({"role": "system", "content": cfg.system.format(**values)})
        messages.append({"role": "user", "content": cfg.prompt.format(**values)})
        return ChatRequest(
            model=cfg.model, messages=messages, max_output_tokens=cfg.max_output_tokens,
            temperature=cfg.temperature, reasoning_effort=cfg.reasoning_effort,
            reasoning_summary=cfg.reasoning_summary, seed=cfg.seed,
            stop=cfg.stop, json_schema=cfg.json_schema,
        )  # fmt: skip

    # -- what a step with tools (steps.tool_use) uses of the step --------------------------
    @property
    def hedger(self) -> Hedger[ChatStream]:
        assert self._hedger is not None, "LLMStep.open() was not called"
        return self._hedger

    @property
    def providers(self) -> dict[str, Provider]:
        return self._providers

    @property
    def store(self) -> Store | None:
        return self._store

    def offered_tools(self, state: TurnState) -> list[str]:
        """The tools the step offers for ``state``: ``tools_by_label[label]`` when the
        turn's label is named there, else all of ``tools``."""
        by_label = self.llm.tools_by_label
        if state.label is not None and state.label in by_label:
            return list(by_label[state.label])
        return list(self.llm.tools)

    def holdback(self, state: TurnState | None = None) -> HoldBack | None:
        return self._holdback(state)

    def record_holdback(self, ctx: StepContext, holdback: HoldBack, winner: ChatStream | None,
                        blocked: OutputBlocked | None) -> None:  # fmt: skip
        self._record_holdback(ctx, holdback, winner, blocked)

    def result_of(self, winner: ChatStream | None, error: BaseException | None) -> StepResult:
        return self._result(winner, error)

    def call_rows(
        self, request: ChatRequest, attempts: Sequence[AttemptRecord],
        streams: dict[int, ChatStream], winner: ChatStream | None,
        step_error: BaseException | None,
    ) -> list[CallRow]:  # fmt: skip
        return self._call_rows(request, attempts, streams, winner, step_error)

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        if self.tools:
            async with contextlib.aclosing(run_tool_rounds(self, state, ctx)) as items:
                async for item in items:
                    yield item
            return
        cfg = self.config
        assert self._hedger is not None, "LLMStep.open() was not called"
        deadline = asyncio.get_running_loop().time() + cfg.deadline_s
        request = self.request(state)
        streams: dict[int, ChatStream] = {}

        async def attempt(info: AttemptInfo) -> ChatStream:
            req = _with_headers(request, {"x-chainrun-attempt": str(info.number)})
            s = ChatStream(
                self._providers[info.target], req,
                first_token_timeout_s=cfg.first_token_timeout_s, idle_timeout_s=cfg.idle_timeout_s,
                pump=cfg.stream,  # a whole answer is read in this attempt's own task
            )  # fmt: skip
            streams[info.number] = s
            return await settle_attempt(s, cfg.stream)

        async def release(s: ChatStream) -> None:
            await s.aclose()

        def accept(s: ChatStream) -> bool:
            # quality gate: a fast answer that is not JSON (or breaks its schema) must not win
            return self._answer_problem(s.timer.text) is None

        gate = accept if self.wants_json and cfg.hedge is not None and not cfg.stream else None
        winner: ChatStream | None = None
        outcome: HedgeOutcome[ChatStream] | None = None
        error: BaseException | None = None
        holdback = self._holdback(state)
        shown: list[str] = []  # what reached the user (redacted by the output check)
        blocked: OutputBlocked | None = None
        cancelled = False
        seeded = self._hedger.delay_seeded()  # as the race reads its delay, just below
        try:
            outcome = await self._hedger.run(attempt, release=release, accept=gate)
            if outcome.error is not None:
                error = outcome.error
            else:
                winner = outcome.value
                assert winner is not None
                if cfg.stream:
                    deltas = stream_answer(self.name, winner, holdback, deadline, shown)
                    async with contextlib.aclosing(deltas):
                        async for delta in deltas:
                            yield delta
                else:
                    await winner.collect()
        except OutputBlocked as e:
            blocked = e  # the stream is closed below, like a loser's
        except (ProviderError, TimeoutError) as e:
            error = e
        except asyncio.CancelledError:
            # the caller went away: a winner cut mid-answer was cancelled, not failed
            cancelled = True
            raise
        finally:
            # cancelled from outside before the engine settled: close every attempt
            to_close = list(streams.values()) if outcome is None else [winner]
            try:
                await _close_all([s for s in to_close if s is not None])
            finally:  # recorded even when the close is interrupted by a cancellation
                error = self._record(ctx, request, outcome, streams, winner, error,
                                     cancelled=cancelled)
                if seeded and ctx.row.hedge_delay_ms is not None:
                    # the delay came from a window holding the fleet's seeded samples
                    ctx.row.detail = {**(ctx.row.detail or {}), "hedge_delay_seeded": True}
                if holdback is not None:
                    self._record_holdback(ctx, holdback, winner, blocked)
                if outcome is not None and outcome.shadows_pending:
                    ctx.after_log.append(self._shadow_settler(request, outcome, streams, deadline))
        yield self.checked_result(ctx, holdback, winner, error, blocked, shown)

    def checked_result(
        self, ctx: StepContext, holdback: HoldBack | None, winner: ChatStream | None,
        error: BaseException | None, blocked: OutputBlocked | None, shown: list[str],
    ) -> StepResult:  # fmt: skip
        """The step's result after its stream went through the hold-back engine: the
        output check's and the grounding check's verdicts, a block as a refusal (or, by
        the grounding's ``replace``, as its safe text), the answer as it was shown."""
        detail = ctx.row.detail or {}
        verdict = {k: detail[k] for k in ("output_check", "grounding") if k in detail}
        if blocked is not None:
            g = self.llm.grounding
            by_grounding = blocked.reason.startswith("ungrounded") and g is not None
            if by_grounding and g is not None and g.action == "replace":
                return StepResult(verdict=verdict, refuse=True, refusal_text=g.safe_text,
                                  replaced=True)  # fmt: skip
            oc = self.llm.output_check
            return StepResult(verdict=verdict, refuse=True,
                              refusal_text=oc.reject_text if oc and not by_grounding
                              else None)  # fmt: skip
        result = self._result(winner, error)
        if holdback is not None and result.error is None:
            result.updates["answer"] = "".join(shown)  # with the checks' redactions
            if holdback.stats.redactions or "grounding" in verdict:
                result.verdict = verdict
        return result

    def _holdback(self, state: TurnState | None = None) -> HoldBack | None:
        """A hold-back engine for this turn's answer stream (None: no output check and
        no grounding check); the grounding check reads the turn's sources in ``state``."""
        oc = self.llm.output_check
        if not self.config.stream:
            return None
        if self.grounding is not None and state is not None:
            check = self.grounding.stream_check(state.values, self._window_check)
            return HoldBack(check, oc.window_tokens if oc is not None else 0)
        if self._window_check is None or oc is None:
            return None
        return HoldBack(self._window_check, oc.window_tokens)

    def _record_holdback(
        self, ctx: StepContext, holdback: HoldBack, winner: ChatStream | None,
        blocked: OutputBlocked | None,
    ) -> None:  # fmt: skip
        """The output check's figures in the step's ``detail["output_check"]``: windows
        checked, check latency, tokens held and released, the block (reason and tokens
        shown before it), and the exposure bound for this stream's measured generation
        speed and slowest check (:func:`~chainrun.checks.holdback.exposure_bound`)."""
        grounding = getattr(holdback.check, "grounding", None)
        if grounding is not None:
            ctx.row.detail = {**(ctx.row.detail or {}), "grounding": grounding.report()}
            if self.llm.output_check is None:
                return  # the engine ran for the grounding check alone
        st, c = holdback.stats, holdback.window_tokens
        doc: dict[str, Any] = {
            "window_tokens": c, "checks": st.checks,
            "check_ms_max": round(max(st.check_ms), 3) if st.check_ms else None,
            "tokens_in": st.tokens_in, "tokens_released": st.tokens_released,
            "max_held_tokens": st.max_held_tokens, "redactions": st.redactions,
            "status": "blocked" if blocked is not None else "passed",
        }  # fmt: skip
        if blocked is not None:
            doc["reason"] = blocked.reason
            doc["released_before_block_tokens"] = blocked.released_tokens
        gaps = winner.timer.token_chunk_gaps_ms if winner is not None else []
        tokens_per_s = 1000.0 * len(gaps) / sum(gaps) if gaps and sum(gaps) > 0 else None
        if tokens_per_s is not None:
            doc["tokens_per_s"] = round(tokens_per_s, 1)
            doc["exposure"] = exposure_bound(c, tokens_per_s, max(st.check_ms, default=0.0))
        ctx.row.detail = {**(ctx.row.detail or {}), "output_check": doc}

    def _record(
        self,
        ctx: StepContext,
        request: ChatRequest,
        outcome: HedgeOutcome[ChatStream] | None,
        streams: dict[int, ChatStream],
        winner: ChatStream | None,
        error: BaseException | None,
        *,
        cancelled: bool = False,
    ) -> BaseException | None:
        """Fill the step's row and calls; return the step's error (None: it answered).
        ``cancelled``: the caller cancelled the step (its winner's call, if cut, is
        recorded as ``cancelled``)."""
        row = ctx.row
        row.duration_ms = ctx.elapsed_ms()
        rows_error = error if error is not None or not cancelled else asyncio.CancelledError()
        if outcome is not None:
            row.n_attempts = sum(1 for a in outcome.attempts if a.number in streams)
            row.hedge_delay_ms = outcome.delay_ms
            row.hedge_fired = outcome.fired
            row.hedge_won = outcome.won_by_copy
            row.time_saved_ms = outcome.time_saved_ms
            ctx.calls[:] = self._call_rows(request, outcome.attempts, streams, winner, rows_error)
            hedge = hedge_detail(outcome)
            if hedge:
                row.detail = {**(row.detail or {}), **hedge}
        elif streams:  # stopped before the race settled: every attempt sent is a row
            row.n_attempts = len(streams)
            # a copy was sent: the hedge fired (and was paid for), whatever came after
            row.hedge_fired = len(streams) > 1
            row.hedge_delay_ms = self._hedger.current_delay_ms() if self._hedger else None
            unsettled = [
                AttemptRecord(number=n, target=s.provider.name, outcome="cancelled",
                              started_offset_ms=(s.timer.t_start - ctx.started) * 1000.0)
                for n, s in sorted(streams.items())
            ]  # fmt: skip
            ctx.calls[:] = self._call_rows(request, unsettled, streams, None, rows_error)
        if winner is not None:
            ctx.ttft_ms = winner.timer.ttft_ms
            usage = winner.timer.usage
            ctx.output_tokens = usage.output_tokens if usage is not None else None
            if error is None and winner.error is not None:
                error = winner.error
            row.output = winner.timer.text  # what arrived, even before a failure
            row.truncated = winner.timer.cut_at_limit
            if error is None and row.truncated and self.config.on_truncated == "fail":
                error = AnswerCutAtLimit(
                    f"{self.name}: the answer reached the token cap (max_output_tokens = "
                    f"{self.config.max_output_tokens}) and on_truncated = 'fail'"
                )
        if error is None and winner is not None and self.wants_json:
            problem = self._answer_problem(winner.timer.text)
            if problem is not None:
                error = InvalidAnswer(f"{self.name}: {problem}")
        if error is not None:
            row.error_type = error_type(error)
        return error

    def _call_rows(
        self, request: ChatRequest, attempts: Sequence[AttemptRecord],
        streams: dict[int, ChatStream], winner: ChatStream | None,
        step_error: BaseException | None,
    ) -> list[CallRow]:  # fmt: skip
        """One row per attempt. The winner's row also carries the step's error when its
        stream was cut by the step (the deadline), so a cut call is never error-free."""
        rows = []
        for a in attempts:
            s = streams.get(a.number)
            row = call_row(self.name, a, s.request if s else request, s,
                           self._providers.get(a.target), streamed=self.config.stream)  # fmt: skip
            if s is not None and s is winner and row.error_type is None and step_error:
                if isinstance(step_error, asyncio.CancelledError):
                    if s.timer.finish_reason is None:  # cut by the caller, not finished
                        row.error_type, row.error_message = "cancelled", "cancelled by the caller"
                else:
                    row.error_type = error_type(step_error)
                    row.error_message = str(step_error)
            rows.append(row)
        return rows

    def _answer_problem(self, text: str | None) -> str | None:
        """Why ``text`` is not an acceptable answer of a JSON step (None: it is): not a
        JSON object, breaks :attr:`answer_schema` (jsonschema, Draft 2020-12), or, for a
        validating step, has no boolean ``ok`` to act on."""
        problem = answer_problem(text, self.answer_schema)
        if problem is None and self.llm.on_reject != "flag":
            parsed = parse_json_object(text) or {}
            if not isinstance(parsed.get("ok"), bool):
                problem = "the verdict has no boolean 'ok' to act on"
        return problem

    @property
    def _gives_verdict(self) -> bool:
        return not self.is_answer and not self.llm.labels

    def _result(self, winner: ChatStream | None, error: BaseException | None) -> StepResult:
        if error is not None or winner is None:
            if self._gives_verdict and self.wants_json and error is not None:
                # a missing verdict, with its reason (never silently ok): the step's
                # on_failure decides whether the turn goes on
                missing = {"ok": None, "missing": missing_reason(error), "problem": str(error)}
                return StepResult(error=error, verdict=missing)
            return StepResult(error=error)
        text = winner.timer.text
        if self.is_answer:
            return StepResult(updates={"answer": text})
        if self.llm.labels:
            return StepResult(updates={"label": parse_label(text, self.llm.labels)})
        parsed = parse_json_object(text) if self.wants_json else None
        verdict = parsed if parsed is not None else {"text": text}
        rejected = parsed is not None and parsed.get("ok") is False
        if rejected and self.llm.on_reject != "flag":
            # refuse: the configured text or the chain's refusal; replace: the safe answer
            return StepResult(verdict=verdict, refuse=True, refusal_text=self.llm.reject_text,
                              replaced=self.llm.on_reject == "replace")  # fmt: skip
        return StepResult(verdict=verdict)

    def _shadow_settler(
        self, request: ChatRequest, outcome: HedgeOutcome[ChatStream],
        streams: dict[int, ChatStream], deadline: float,
    ) -> Any:  # fmt: skip
        """A callback that waits (inside the step's deadline) for shadow losers, then
        rewrites the step's ``calls`` rows and measured ``time_saved_ms`` in the log."""

        async def settle(turn_id: int | None) -> None:
            remaining = max(0.0, deadline - asyncio.get_running_loop().time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await outcome.shadows_done()
            if self._store is None or turn_id is None:
                return
            rows = self._call_rows(request, outcome.attempts, streams, None, None)
            await self._store.aupdate_step_calls(turn_id, self.name, rows, outcome.time_saved_ms)

        return settle


__all__ = ["LLMConfig", "LLMStep", "call_row", "parse_label", "template_fields"]
