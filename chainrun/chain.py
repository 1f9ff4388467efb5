"""The chain: classify → retrieve → compose → validate → critique, one turn at a time.

The chain composes the parts: each LLM step's attempts go through the step's
:class:`~chainrun.hedging.Hedger` (which knows nothing of LLMs), each attempt is a
:class:`~chainrun.providers.ChatStream` on a provider (which knows nothing of
hedging), and every attempt becomes a row of ``calls`` in the run log.

Library use from a chat backend::

    async with Chain.from_config("chainrun.toml") as chain:
        async with contextlib.aclosing(chain.stream_turn("a rain jacket under 100?")) as events:
            async for event in events:
                ...  # StepStarted, TokenDelta, StepFinished, TurnFinished

Closing the iterator early cancels the in-flight calls and still logs the turn
(status ``cancelled``). Turns run this way are logged as a run of kind ``live``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import sqlite_utils

from chainrun.catalog import ensure_sample_catalog
from chainrun.config import ChainConfig, StepConfig, load_config
from chainrun.errors import (
    ChainrunError,
    InvalidAnswer,
    ProviderError,
    ProviderUnavailable,
)
from chainrun.events import Event, StepFinished, StepStarted, TokenDelta, TurnFinished
from chainrun.hedging import (
    BreakerRegistry,
    HedgeOutcome,
    Hedger,
    LoopLagMonitor,
    get_loop_lag_monitor,
)
from chainrun.providers.base import ChatRequest, ChatStream, Provider
from chainrun.providers.factory import open_provider
from chainrun.records import CallRecord, RunKind, StepRecord, TurnRecord
from chainrun.retrieval import build_retriever
from chainrun.store import DEFAULT_DB, Store, utc_now

REFUSAL = "Sorry, I can't help with that right now. Please try again in a moment."
CLASSIFY_LABELS = ("sizing", "product_search", "order_status", "returns", "styling", "other")


class Retriever(Protocol):
    """What the retrieve step needs (filled by :mod:`chainrun.retrieval`)."""

    async def retrieve(self, query: str, *, label: str | None = None) -> Any: ...


def parse_label(text: str | None) -> str:
    """The first known classify label named in ``text`` ("other" when none is)."""
    low = (text or "").lower().replace("-", "_").replace(" ", "_")
    found = [(low.find(lab), lab) for lab in CLASSIFY_LABELS if lab in low]
    return min(found)[1] if found else "other"


def parse_json_object(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (models wrap JSON in prose or code fences), or None."""
    if not text:
        return None
    m = re.search(r"\{.*\}", text, re.S)
    if not m:
        return None
    try:
        value = json.loads(m.group(0))
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _error_type(err: BaseException | None) -> str | None:
    if err is None:
        return None
    if isinstance(err, TimeoutError):
        return "timeout"
    return getattr(err, "error_type", None) or type(err).__name__


def _call_record(
    step_name: str,
    step: StepConfig,
    attempt: Any,
    stream: ChatStream | None,
    provider: Provider | None,
) -> CallRecord:
    """One ``calls`` row from the engine's attempt record and the attempt's stream timer."""
    rec = CallRecord(
        step=step_name,
        attempt=attempt.number,
        target=attempt.target,
        provider=provider.name if provider else attempt.target,
        server_address=provider.server_address if provider else None,
        model=step.model,
        reasoning_effort=step.reasoning_effort,
        stream=step.stream,
        temperature=step.temperature,
        max_tokens=step.max_output_tokens,
        started_offset_ms=attempt.started_offset_ms or 0.0,
        outcome=attempt.outcome,
        loop_lag_ms=attempt.loop_lag_ms,
        fired_late=attempt.number > 1 and attempt.fired_during_loop_lag,
        error_type=_error_type(attempt.error),
        error_message=str(attempt.error) if attempt.error else None,
    )
    if stream is None:
        return rec
    t = stream.timer
    usage = t.usage
    rec.prompt = json.dumps(stream.request.messages)
    rec.output = t.text
    rec.reasoning = "".join(t.reasoning) or None
    rec.ttft_ms = t.ttft_ms
    rec.duration_ms = t.duration_ms
    rec.chunk_gaps_ms = list(t.chunk_gaps_ms)
    rec.n_chunks = t.n_chunks
    rec.bytes_received = t.nbytes
    rec.response_model = t.model
    rec.response_id = t.response_id
    rec.finish_reason = t.finish_reason
    rec.truncated = t.truncated
    rec.server_timings = t.server_timings
    if usage is not None:
        rec.input_tokens = usage.input_tokens
        rec.output_tokens = usage.output_tokens
        rec.reasoning_tokens = usage.reasoning_tokens
        rec.cached_input_tokens = usage.cached_input_tokens
    if rec.error_type is None and stream.error is not None:
        rec.error_type = _error_type(stream.error)
        rec.error_message = str(stream.error)
    return rec


@dataclass
class _PendingShadows:
    """A hedged step whose shadow losers were still running when it settled."""

    name: str
    step: StepConfig
    outcome: HedgeOutcome[ChatStream]
    streams: dict[int, ChatStream]
    deadline: float  # event-loop time


@dataclass
class _StepResult:
    output: str | None = None
    ok: bool = True
    error: BaseException | None = None
    record: StepRecord | None = None
    calls: list[CallRecord] = field(default_factory=list)
    ttft_ms: float | None = None
    output_tokens: int | None = None
    shadows: _PendingShadows | None = None


class Chain:
    """A configured chain with its providers, hedgers and run log.

    Build with :meth:`from_config`; use as ``async with``. One ``Chain`` logs its turns
    into one run (created at the first turn, or given as ``run_id``).

    Args:
        config: the chain configuration.
        store: the run log (None: log nothing).
        providers: providers by name to use instead of building them from the config
            (the test fake, a custom adapter).
        retriever: fills the retrieve step (None: the step returns no products).
        kind: the run kind for the log (``live`` | ``replay`` | ``eval``).
    """

    def __init__(
        self,
        config: ChainConfig,
        *,
        store: Store | None = None,
        providers: Mapping[str, Provider] | None = None,
        retriever: Retriever | None = None,
        kind: RunKind = "live",
        label: str | None = None,
        source: str | None = None,
        run_id: int | None = None,
        quiet: bool = False,
    ) -> None:
        self.config = config
        self.store = store
        self.retriever = retriever
        self.kind: RunKind = kind
        self.label = label
        self.source = source
        self.run_id = run_id
        self.quiet = quiet
        self._injected = dict(providers or {})
        self._providers: dict[str, Provider] = {}
        self._owned: list[Provider] = []
        self._breakers = BreakerRegistry()
        self._input_checks = config.checks.checker()
        self._hedgers: dict[str, Hedger[ChatStream]] = {}
        self._loop_lag: LoopLagMonitor | None = None
        self._owned_retriever: Any = None
        self._background: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(
        cls,
        config: ChainConfig | str | Path | None = None,
        *,
        db: Store | str | Path | None = DEFAULT_DB,
        **kwargs: Any,
    ) -> Chain:
        """Build a chain from a config (a ChainConfig, a TOML path, or None for ./chainrun.toml
        or the built-in default) and a log (a Store, a path, or None for no log).

        Raises:
            ConfigError: the config is invalid.
        """
        cfg = config if isinstance(config, ChainConfig) else load_config(config)
        store = db if isinstance(db, Store) or db is None else Store.open(db)
        return cls(cfg, store=store, **kwargs)

    # -- lifecycle -------------------------------------------------------------------
    async def __aenter__(self) -> Chain:
        await self.open()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        status = (
            "complete"
            if exc_type is None
            else (
                "interrupted"
                if exc_type in (KeyboardInterrupt, asyncio.CancelledError)
                else "failed"
            )
        )
        await self.aclose(status)

    def _used_providers(self) -> list[str]:
        names: list[str] = []
        for step_name in self.config.order:
            step = self.config.steps[step_name]
            if step.kind != "llm":
                continue
            for n in [step.provider, *(step.hedge.targets if step.hedge else [])]:
                if n not in names:
                    names.append(n)
        return names

    async def open(self) -> None:
        """Build the providers (starting the local model if a provider needs it).

        Raises:
            ProviderUnavailable: the local model cannot be started, or a provider's
                server cannot be reached (checked before any run is created).
            ConfigError: a provider's API key variable is not set.
        """
        try:
            await self._open_providers()
        except BaseException:
            await self.aclose("failed")
            raise
        await self._open_retriever()
        if any(s.hedge is not None for s in self.config.steps.values()):
            # the client's own event-loop lag, recorded with every attempt of hedged steps
            self._loop_lag = get_loop_lag_monitor()
            await self._loop_lag.__aenter__()
        for step_name in self.config.order:
            step = self.config.steps[step_name]
            if step.kind == "llm":
                targets = [step.provider, *(step.hedge.targets if step.hedge else [])]
                self._hedgers[step_name] = Hedger(
                    step.hedge_policy(), targets, breakers=self._breakers,
                    loop_lag=self._loop_lag,
                )  # fmt: skip

    async def _open_retriever(self) -> None:
        """Build the retrieve step's searches over the catalogue in the log database
        (loading the sample catalogue when it has none), unless one was injected."""
        steps = [self.config.steps[n] for n in self.config.order]
        retrieve = next((s for s in steps if s.kind == "retrieve"), None)
        if self.retriever is not None or retrieve is None:
            return
        db = self.store.db if self.store is not None else sqlite_utils.Database(memory=True)
        ensure_sample_catalog(db)  # sqlite connections are bound to their thread
        built = build_retriever(retrieve.retrieval, db)
        self._owned_retriever = built
        self.retriever = built
        try:
            await built.warm()  # embeds the catalogue once (cached in the database)
        except ProviderError as e:
            if not self.quiet:
                print(f"chainrun: vector search unavailable ({e})", file=sys.stderr)

    async def _open_providers(self) -> None:
        for name in self._used_providers():
            if name in self._injected:
                self._providers[name] = self._injected[name]
                continue
            provider = await open_provider(name, self.config.providers[name], quiet=self.quiet)
            self._providers[name] = provider
            self._owned.append(provider)

    async def aclose(self, status: str = "complete") -> None:
        """Wait for background work (shadow losers), close providers, end the run."""
        if self._background:  # shadow losers (bounded by their step's deadline)
            await asyncio.gather(*self._background, return_exceptions=True)
        for hedger in self._hedgers.values():
            await hedger.aclose()
        if self._loop_lag is not None:
            await self._loop_lag.__aexit__(None, None, None)
            self._loop_lag = None
        if self._owned_retriever is not None:
            await self._owned_retriever.aclose()
            self._owned_retriever = None
            self.retriever = None
        for p in self._owned:
            await p.aclose()
        self._owned.clear()
        if self.store is not None and self.run_id is not None:
            run = self.store.get_run(self.run_id)
            if run["status"] == "running":
                self.store.finish_run(self.run_id, status)  # type: ignore[arg-type]

    def ensure_run(self) -> int | None:
        """The run this chain logs into, created on first use (None without a store)."""
        if self.store is None:
            return None
        if self.run_id is None:
            self.run_id = self.store.create_run(
                self.kind, self.config.snapshot(), label=self.label, source=self.source
            )
        return self.run_id

    # -- one turn --------------------------------------------------------------------
    async def run_turn(self, message: str, **kwargs: Any) -> TurnFinished:
        """Run a whole turn and return its :class:`TurnFinished` (events are discarded)."""
        last: TurnFinished | None = None
        async with contextlib.aclosing(self.stream_turn(message, **kwargs)) as events:
            async for ev in events:
                if isinstance(ev, TurnFinished):
                    last = ev
        assert last is not None
        return last

    async def stream_turn(
        self,
        message: str,
        *,
        request_id: str | None = None,
        conversation_id: str | None = None,
        original_ms: float | None = None,
    ) -> AsyncGenerator[Event, None]:
        """Run one turn, yielding typed events as they happen.

        Raises:
            ProviderUnavailable: a provider could not be reached at all (after logging
                the turn with status ``error``), so that callers can stop a replay.
        """
        run_id = self.ensure_run()
        turn = TurnRecord(
            input=message,
            request_id=request_id,
            conversation_id=conversation_id,
            started_at=utc_now(),
            original_ms=original_ms,
        )
        t0 = time.perf_counter()
        vars_: dict[str, str] = {
            "message": message,
            "label": "",
            "products": "(none)",
            "answer": "",
        }
        refused = False
        # deterministic checks first: microseconds, before any model call (issue 11)
        checked = self._input_checks.check(message)
        if checked.findings:
            turn.input = vars_["message"] = checked.text  # the log keeps no card number
            turn.verdicts["checks"] = checked.as_json()
            if checked.blocked:
                refused = True
                turn.status = "refused"
        unavailable: ProviderUnavailable | None = None
        current: _StepResult | None = None  # the step in flight, for a cancelled turn's log
        shadows: list[_PendingShadows] = []
        try:
            for name in self.config.order:
                step = self.config.steps[name]
                offset = (time.perf_counter() - t0) * 1000.0
                if refused:
                    turn.steps.append(
                        StepRecord(
                            step=name, kind=step.kind, status="skipped", started_offset_ms=offset
                        )
                    )
                    continue
                yield StepStarted(step=name, kind=step.kind)
                current = result = _StepResult()
                if step.kind == "retrieve":
                    await self._retrieve_step(name, step, vars_, result)
                else:
                    async with contextlib.aclosing(
                        self._llm_step(name, step, vars_, result)
                    ) as step_events:
                        async for ev in step_events:
                            yield ev
                current = None
                if result.shadows is not None:
                    shadows.append(result.shadows)
                rec = result.record
                assert rec is not None
                rec.started_offset_ms = offset
                turn.steps.append(rec)
                turn.calls.extend(result.calls)
                if not result.ok:
                    if isinstance(result.error, ProviderUnavailable):
                        unavailable = result.error
                    if step.on_failure == "closed":
                        rec.status = "failed_closed"
                        refused = True
                        turn.status = "refused"
                        turn.error_type = rec.error_type
                    else:
                        rec.status = "failed_open"
                else:
                    self._absorb(name, step, result.output, vars_, turn)
                yield StepFinished(
                    step=name, status=rec.status, duration_ms=rec.duration_ms,
                    output=rec.output, model=step.model if step.kind == "llm" else None,
                    reasoning_effort=step.reasoning_effort, ttft_ms=result.ttft_ms,
                    output_tokens=result.output_tokens, n_attempts=rec.n_attempts,
                    hedge_fired=rec.hedge_fired, hedge_won=rec.hedge_won,
                    error_type=rec.error_type, detail=rec.detail,
                )  # fmt: skip
            turn.output = REFUSAL if refused else vars_["answer"]
        except (asyncio.CancelledError, GeneratorExit):
            turn.status = "cancelled"
            raise
        except BaseException as e:
            turn.status = "error"
            turn.error_type = _error_type(e)
            raise
        finally:
            turn.duration_ms = (time.perf_counter() - t0) * 1000.0
            if current is not None and current.record is not None:
                current.record.status = "cancelled"
                turn.steps.append(current.record)
                turn.calls.extend(current.calls)
            if unavailable is not None and turn.status != "cancelled":
                turn.status = "error"
                turn.error_type = unavailable.error_type
            turn_id = self._log_turn(run_id, turn)
            self._spawn_shadow_updates(turn_id, shadows)
        yield TurnFinished(
            turn_id=turn_id, run_id=run_id, output=turn.output, status=turn.status,
            duration_ms=turn.duration_ms, label=turn.label, verdicts=turn.verdicts,
            error_type=turn.error_type,
        )  # fmt: skip
        if unavailable is not None:
            raise unavailable

    def _log_turn(self, run_id: int | None, turn: TurnRecord) -> int | None:
        if self.store is None or run_id is None:
            return None
        return self.store.log_turn(run_id, turn)

    def _absorb(
        self,
        name: str,
        step: StepConfig,
        output: str | None,
        vars_: dict[str, str],
        turn: TurnRecord,
    ) -> None:
        """Feed a step's output to the later steps' prompt variables and the turn's verdicts."""
        text = output or ""
        if name == "classify":
            vars_["label"] = turn.label = parse_label(text)
        elif name == self.config.answer_step:
            vars_["answer"] = text
        elif step.kind == "llm":
            wants_json = step.expect_json or step.json_schema is not None
            parsed = parse_json_object(text) if wants_json else None
            turn.verdicts[name] = parsed if parsed is not None else {"text": text}

    async def _retrieve_step(
        self, name: str, step: StepConfig, vars_: dict[str, str], result: _StepResult
    ) -> None:
        t = time.perf_counter()
        rec = StepRecord(step=name, kind="retrieve")
        if self.retriever is None:
            rec.detail = {"results": [], "searches": [], "stopped_after": None}
        else:
            try:
                async with asyncio.timeout(step.deadline_s):
                    found = await self.retriever.retrieve(vars_["message"], label=vars_["label"])
                rec.detail = found.as_json()
                vars_["products"] = found.prompt_text() or "(none)"
                rec.output = json.dumps([item["id"] for item in rec.detail.get("results", [])])
            except (ChainrunError, TimeoutError) as e:
                result.ok, result.error = False, e
                rec.error_type = _error_type(e)
        rec.duration_ms = (time.perf_counter() - t) * 1000.0
        result.record = rec

    def _request(self, step: StepConfig, vars_: Mapping[str, str]) -> ChatRequest:
        messages = []
        if step.system:
            messages.append({"role": "system", "content": step.system.format(**vars_)})
        messages.append({"role": "user", "content": step.prompt.format(**vars_)})
        return ChatRequest(
            model=step.model,
            messages=messages,
            max_output_tokens=step.max_output_tokens,
            temperature=step.temperature,
            reasoning_effort=step.reasoning_effort,
            reasoning_summary=step.reasoning_summary,
            seed=step.seed,
            stop=step.stop,
            json_schema=step.json_schema,
        )

    async def _llm_step(
        self, name: str, step: StepConfig, vars_: Mapping[str, str], result: _StepResult
    ) -> AsyncGenerator[Event, None]:
        t_step = time.perf_counter()
        deadline = asyncio.get_running_loop().time() + step.deadline_s
        request = self._request(step, vars_)
        streams: dict[int, ChatStream] = {}

        async def attempt(info: Any) -> ChatStream:
            provider = self._providers[info.target]
            req = replace(request, headers={"x-chainrun-attempt": str(info.number)})
            s = ChatStream(provider, req)
            streams[info.number] = s
            try:
                return await (s.first_token() if step.stream else s.collect())
            except BaseException:
                await s.aclose()
                raise

        async def release(s: ChatStream) -> None:
            await s.aclose()

        accept = None
        wants_json = step.expect_json or step.json_schema is not None
        if wants_json and step.hedge is not None and not step.stream:
            # quality gate: a fast answer that is not JSON must not win the race
            def accept(s: ChatStream) -> bool:
                return parse_json_object(s.timer.text) is not None

        winner: ChatStream | None = None
        outcome: HedgeOutcome[ChatStream] | None = None
        error: BaseException | None = None
        try:
            outcome = await self._hedgers[name].run(attempt, release=release, accept=accept)
            if outcome.error is not None:
                error = outcome.error
            else:
                winner = outcome.value
                assert winner is not None
                if step.stream:
                    async with asyncio.timeout_at(deadline):
                        async for text in winner.deltas():
                            yield TokenDelta(step=name, text=text)
                else:
                    await winner.collect()
        except (ProviderError, TimeoutError) as e:
            error = e
        finally:
            try:
                if winner is not None:
                    await winner.aclose()
                for s in streams.values():
                    if s is not winner and outcome is None:
                        await s.aclose()  # cancelled from outside before the engine settled
            finally:
                # a cancelled task's aclose() re-raises the cancel: the step is still logged
                self._finish_llm_step(name, step, t_step, outcome, streams, winner, error,
                                      result)  # fmt: skip
            if outcome is not None and outcome.shadows_pending:
                # shadow losers finish unseen: the step (and the turn) does not wait for
                # them; their rows are updated once they are done (see _settle_shadows)
                result.shadows = _PendingShadows(name, step, outcome, streams, deadline)

    def _spawn_shadow_updates(self, turn_id: int | None, pending: list[_PendingShadows]) -> None:
        for p in pending:
            task = asyncio.create_task(self._settle_shadows(turn_id, p))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _settle_shadows(self, turn_id: int | None, p: _PendingShadows) -> None:
        """Wait (inside the step's deadline) for a step's shadow losers, then rewrite the
        step's ``calls`` rows and its measured ``time_saved_ms`` in the log."""
        remaining = max(0.0, p.deadline - asyncio.get_running_loop().time())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                await p.outcome.shadows_done()
        if self.store is None or turn_id is None:
            return
        calls = [
            _call_record(p.name, p.step, a, p.streams.get(a.number), self._providers.get(a.target))
            for a in p.outcome.attempts
        ]
        self.store.update_step_calls(turn_id, p.name, calls, p.outcome.time_saved_ms)

    def _finish_llm_step(
        self,
        name: str,
        step: StepConfig,
        t_step: float,
        outcome: HedgeOutcome[ChatStream] | None,
        streams: dict[int, ChatStream],
        winner: ChatStream | None,
        error: BaseException | None,
        result: _StepResult,
    ) -> None:
        rec = StepRecord(step=name, kind="llm")
        rec.duration_ms = (time.perf_counter() - t_step) * 1000.0
        if outcome is not None:
            rec.n_attempts = sum(1 for a in outcome.attempts if a.number in streams)
            rec.hedge_delay_ms = outcome.delay_ms
            rec.hedge_fired = outcome.fired
            rec.hedge_won = outcome.won_by_copy
            rec.time_saved_ms = outcome.time_saved_ms
            for a in outcome.attempts:
                s = streams.get(a.number)
                provider = self._providers.get(a.target)
                result.calls.append(_call_record(name, step, a, s, provider))
        if winner is not None:
            result.ttft_ms = winner.timer.ttft_ms
            result.output_tokens = winner.timer.usage.output_tokens if winner.timer.usage else None
            if error is None and winner.error is not None:
                error = winner.error
        wants_json = step.expect_json or step.json_schema is not None
        if error is None and winner is not None and wants_json:
            if parse_json_object(winner.timer.text) is None:
                error = InvalidAnswer(f"{name}: the answer is not a JSON object")
        if error is None and winner is not None:
            result.output = rec.output = winner.timer.text
        else:
            result.ok, result.error = False, error
            rec.error_type = _error_type(error)
            if winner is not None:
                rec.output = winner.timer.text  # what arrived before the failure
        result.record = rec
