"""The chain: the composition root that builds a ready chain and runs turns through it.

:meth:`Chain.open` builds everything a turn needs, once: the steps from the config
(:mod:`chainrun.steps`, by kind), the turn's graph (:mod:`chainrun.graph`), the
providers (starting the embedded llama-server when one needs it), the hedgers, and the
catalogue in the log database. A turn is then a :class:`~chainrun.scheduler.TurnRun`
over that graph, and every step and call becomes a row of the run log.

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
import dataclasses
import difflib
import logging
import math
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any

import sqlite_utils

from chainrun.config import ChainConfig, load_config
from chainrun.config.capabilities import check_model_step
from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.source import (
    LOAD_TIMEOUT_S,
    SHARED_TIMEOUT_S,
    ConversationSource,
    answer_turn,
    log_claim,
    log_loader,
    shown_products,
)
from chainrun.conversations.tokens import counter_for
from chainrun.desk import Admitted, Desk, Repeated, TurnRequest
from chainrun.errors import (
    ChainClosed,
    ConfigError,
    LogWriteError,
    ProviderUnavailable,
    error_type,
)
from chainrun.events import AnswerDone, Event, TokenDelta, TurnFinished
from chainrun.graph import TurnGraph, build_graph
from chainrun.hedging import BreakerRegistry, LoopLagMonitor, get_loop_lag_monitor
from chainrun.log.reads import SeedWindows
from chainrun.log.redaction import Redactor
from chainrun.log.rows import RunKind, TurnLog, TurnRow
from chainrun.log.store import DEFAULT_DB, Store
from chainrun.providers.base import ChatRequest, Provider
from chainrun.providers.factory import open_provider
from chainrun.providers.rate_limit import limiters_for
from chainrun.retrieval.catalog import ensure_sample_catalog, get_products
from chainrun.retrieval.reader import reader_for
from chainrun.scheduler import TurnRun
from chainrun.steps import (
    BUILTIN_FIELDS,
    BuildContext,
    Retriever,
    StateField,
    Step,
    StepNeeds,
    TurnState,
    step_kinds,
)
from chainrun.timing import Chunk
from chainrun.tools import build_tools

logger = logging.getLogger(__name__)

REFUSAL = "Sorry, I can't help with that right now. Please try again in a moment."

__all__ = ["REFUSAL", "Chain", "Retriever", "build_steps"]


async def _after_log(
    callback: Callable[[int | None], Awaitable[None]], turn_id: int | None
) -> None:
    """Run one of a turn's after-log callbacks (a shadow loser's rows rewritten once it
    ends) in its own task, whose failure nobody awaits: a log write that failed (refused,
    or given up with the database away: the writer counts and says every lost write) is
    left at that; any other error is said in one warning line with its traceback, never
    as an unretrieved task exception."""
    try:
        await callback(turn_id)
    except LogWriteError as e:
        logger.debug("turn %s: a late log update was not written (%s)", turn_id, e)
    except Exception:
        logger.warning("turn %s: a late log update failed", turn_id, exc_info=True)


class _Down:
    """Stands in for a hedge target that was unreachable when the chain opened (its
    circuit breaker is open for the chain's life, so it is never asked; if it were, it
    fails like the server did)."""

    server_address: str | None = None

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        raise ProviderUnavailable(self.reason)
        yield  # an async generator, like every provider's chunks()

    async def aclose(self) -> None:
        pass


def build_steps(config: ChainConfig) -> dict[str, Step]:
    """One step object per configured step, in ``order``, by kind.

    Raises:
        ConfigError: a step's ``kind`` is not registered, or a step does not fit beside
            the others (:meth:`Step.beside`).
    """
    kinds = step_kinds()
    steps: dict[str, Step] = {}
    for name in config.order:
        cfg = config.steps[name]
        cls = kinds.get(cfg.kind)
        if cls is None:
            close = difflib.get_close_matches(cfg.kind, list(kinds), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"steps.{name}.kind: unknown step kind {cfg.kind!r}{hint}; expected one of "
                f"{sorted(kinds)} or a class registered with chainrun.steps.register_step_kind"
            )
        step = cls(name, cfg)
        step.bind(config.answer_step)
        steps[name] = step
    for name, step in steps.items():
        problem = step.beside(steps)
        if problem is not None:
            raise ConfigError(f"steps.{name}.{problem}")
    return steps


def state_fields(steps: Mapping[str, Step]) -> dict[str, StateField]:
    """The turn-state fields of a chain: the built-ins and those its steps' kinds declare."""
    return {**BUILTIN_FIELDS, **{f.name: f for s in steps.values() for f in s.fields}}


def _naming_file(error: ConfigError, config: ChainConfig) -> ConfigError:
    """``error`` found after loading (graph, capabilities), naming the config file it
    came from when the message does not yet."""
    if error.path is not None or config.path is None:
        return error
    return ConfigError(f"{config.path}: {error}", path=config.path)

class Chain:
    """A configured chain with its steps, providers, hedgers and run log.

    Build with :meth:`from_config`; use as ``async with``. One ``Chain`` logs its turns
    into one run (created at the first turn, or given as ``run_id``).

    Args:
        config: the chain configuration.
        store: the run log (None: log nothing).
        providers: providers by name to use instead of building them from the config
            (the test fake, a custom adapter).
        retriever: fills the retrieve step (None: searches over the log's catalogue).
        kind: the run kind for the log (``live`` | ``replay`` | ``eval``).
        act: carry out tools with side effects (default: in a ``live`` run only; a
            replay or an eval stubs them unless their ``replay = "run"``).

    Raises:
        ConfigError: a step kind is unknown, a step reads a field no step writes, or
            the steps wait for each other in a cycle (checked here, before anything
            is started).
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
        seed_windows: SeedWindows | None = None,
        act: bool | None = None,
    ) -> None:
        self.config = config
        #: carry out side-effecting tools (None: in live runs only; a replay and an eval
        #: stub them, ``[tools.NAME] replay``)
        self.act = (kind == "live") if act is None else act
        self.store = store
        #: seed each hedged step's latency window from the log's recent calls at open
        #: (a new process hedges at the fleet's percentile from its first call)
        self.seed_windows = seed_windows
        if store is not None and config.log.redact:
            store.redactor = Redactor(config.log.redact)  # [log] redact: the record only
        self.kind: RunKind = kind
        self.label = label
        self.source = source
        self.run_id = run_id
        self.quiet = quiet
        try:
            self.steps = build_steps(config)
            self.graph: TurnGraph = build_graph(
                self.steps, config.order, config.answer_step, config.off_path_steps
            )
            # every tool's callable imported now: a bad one is a config error before any call
            self.tools = build_tools(
                config.tools, base_dir=Path(config.path).parent if config.path else None
            )
        except ConfigError as e:
            raise _naming_file(e, config) from None
        self.fields = state_fields(self.steps)
        #: the answer step's prompt template (None: it has none): a turn's history keeps
        #: what that prompt showed when it begins with {history}
        self._answer_template: str | None = getattr(
            config.steps.get(config.answer_step), "prompt", None
        )
        #: what each step asked the chain for (providers, the catalogue, the log)
        self.needs: dict[str, StepNeeds] = {n: s.needs() for n, s in self.steps.items()}
        #: each conversation's place: its history (from the caller, or remembered and
        #: read from the log) and turn indexes
        self.conversations = ConversationSource(config.history)
        self._injected = dict(providers or {})
        self._retriever = retriever
        #: the catalogue's database once open (a tool's product_arguments are looked up there)
        self._catalog_db: sqlite_utils.Database | None = None
        self._providers: dict[str, Provider] = {}
        #: circuit breakers shared by the steps, one registry per distinct breaker setting
        #: (a target found down at open starts open in every one)
        self._breakers: dict[tuple[int, float, float], BreakerRegistry] = {}
        #: each step's registry, by step name (what BuildContext.breakers_for hands it)
        self._step_breakers: dict[str, BreakerRegistry] = {}
        for name, needs in self.needs.items():
            if needs.policy is not None:
                p = needs.policy
                key = (p.breaker_failures, p.breaker_window_s, p.breaker_cooldown_s)
                if key not in self._breakers:
                    self._breakers[key] = BreakerRegistry(*key)
                self._step_breakers[name] = self._breakers[key]
        self._owned: list[Provider] = []
        self._opened: list[Step] = []
        self._loop_lag: LoopLagMonitor | None = None
        self._background: set[asyncio.Task[None]] = set()
        #: the run's creation on the log's writer thread, while it runs (ensure_run)
        self._creating_run: asyncio.Future[int] | None = None
        #: steps that have had an answer: a 401/403/404 after that is not a config error
        self._answered: set[str] = set()
        self._closed = False
        #: the front desk: whether and how each turn runs (made again at :meth:`open`,
        #: with the log the chain then has)
        self.desk = Desk(config, self.conversations, self.tools, store=None, kind=kind,
                         act=self.act, known_products=self._known_products)

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
        chain = cls(cfg, store=None, **kwargs)  # config errors before the log is opened
        chain.store = db if isinstance(db, Store) or db is None else Store.open(db)
        return chain

    # -- lifecycle -------------------------------------------------------------------
    async def __aenter__(self) -> Chain:
        await self.open()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            status = "complete"
        elif exc_type in (KeyboardInterrupt, asyncio.CancelledError):
            status = "interrupted"
        else:
            status = "failed"
        await self.aclose(status)

    def _used_providers(self) -> list[str]:
        """Every provider a step asked for, each once, in step order."""
        return list(dict.fromkeys(p for n in self.needs.values() for p in n.providers))

    def check(self) -> None:
        """What :meth:`open` checks before it starts anything, without starting it: each
        model step against its model's capability entry, and every used provider's
        settings from the environment (its API key variable set). ``chainrun serve``
        calls it (with the chain's build) before it binds, so a config that cannot
        start is one error line, not a server retrying for ever.

        Raises:
            ConfigError: as :meth:`open`, naming the config file.
        """
        cfg = self.config
        try:
            for step_name, needs in self.needs.items():
                if needs.model is not None:
                    check_model_step(step_name, needs.model, needs.providers, cfg.providers,
                                     cfg.capabilities)  # fmt: skip
            for name in self._used_providers():  # every key before anything starts
                if name not in self._injected:
                    self.config.providers[name].check_env(name)
        except ConfigError as e:
            raise _naming_file(e, self.config) from None

    async def open(self) -> None:
        """Build what turns need: providers (starting the local model if one needs it),
        the event-loop lag monitor for hedged steps, and every step.

        Raises:
            ProviderUnavailable: the local model cannot be started, or a provider's
                server cannot be reached (checked before any run is created).
            ConfigError: a provider is misconfigured (e.g. its API key variable is unset),
                or a step asks a model for what its capability entry refuses (before any call).
            ChainClosed: the chain was closed (build a new one).
        """
        self._check_open()
        self.check()
        try:
            await self._open_providers()
            if any(n.hedged for n in self.needs.values()):
                # the client's own event-loop lag, recorded with every attempt of hedged steps
                self._loop_lag = get_loop_lag_monitor()
                await self._loop_lag.__aenter__()
            # the catalogue: in the SQLite log, or (a PostgreSQL log) in a SQLite file of its
            # own, opened only when a step searches it
            # (a tool's product_arguments are checked against it, retriever or not)
            wants_catalog = (self._retriever is None and any(
                n.catalogue for n in self.needs.values()
            )) or any(t.config.product_arguments for t in self.tools.values())
            db = (self.store.db if self.store is not None
                  and (self.store.dialect == "sqlite" or wants_catalog)
                  else sqlite_utils.Database(memory=True))  # fmt: skip
            if wants_catalog:
                ensure_sample_catalog(db)  # a log without a catalogue gets the sample one
            self._catalog_db = db
            ctx = BuildContext(
                config=self.config, providers=self._providers, breakers=self._step_breakers,
                loop_lag=self._loop_lag, db=db, store=self.store, quiet=self.quiet,
                retriever=self._retriever, tools=self.tools, seed_windows=self.seed_windows,
                rate_limits=limiters_for(self.config.providers),
            )  # fmt: skip
            for step_name, step in self.steps.items():
                logs = self.needs[step_name].log
                await step.open(ctx if logs else dataclasses.replace(ctx, store=None))
                self._opened.append(step)
            await self._open_conversations()
        except BaseException:
            await self.aclose("failed")
            raise

    async def _open_conversations(self) -> None:
        """Read unknown conversations from the log; count history tokens with the answer
        step's provider's tokenizer where its server has one (``[history] tokenizer``)."""
        if self.store is not None:
            # a shared log: its reads are waited for longer, and its outages waited out
            ride_out = self.config.log.outage_wait_s
            claim = log_claim(self.store, outage_wait_s=ride_out)
            wait = SHARED_TIMEOUT_S if claim is not None else LOAD_TIMEOUT_S
            load = log_loader(
                self.store, timeout_s=wait, outage_wait_s=ride_out if claim is not None else 0.0
            )
            self.conversations.use_log(load, claim)
        self.desk = Desk(self.config, self.conversations, self.tools, store=self.store,
                         kind=self.kind, act=self.act, known_products=self._known_products)
        await self.desk.open()
        names = self.config.steps[self.config.answer_step].provider_names()
        answer = self._providers.get(names[0]) if names else None
        base_url = getattr(answer, "base_url", None)
        counter = await counter_for(base_url if isinstance(base_url, str) else None,
                                    self.config.history.tokenizer)  # fmt: skip
        self.conversations.use_counter(counter)

    def embedded_model_providers(self) -> list[Provider]:
        """The open providers that talk to the embedded local model (``base_url`` unset in
        their ``[providers.NAME]`` table, so this chain started or found llama-server):
        the ones to point at that server again if it is restarted elsewhere
        (``chainrun serve`` watches it). Injected providers are the caller's and are
        never listed."""
        out = []
        for name, provider in self._providers.items():
            cfg = self.config.providers.get(name)
            if name in self._injected or isinstance(provider, _Down) or cfg is None:
                continue
            if cfg.base_url is None and cfg.kind != "azure" and cfg.replicas is None:
                out.append(provider)
        return out

    def answer_breakers_open(self) -> list[str]:
        """The answer step's targets (its provider and hedge targets), when every one's
        circuit breaker is open: nothing can be sent for an answer until one cools down
        (``[steps.NAME.hedge] breaker_cooldown_s``), so every turn fails ``circuit_open``.
        Empty while any target may be sent to (a half-open breaker takes its probe)."""
        registry = self._step_breakers.get(self.config.answer_step)
        if registry is None:
            return []
        targets = self.config.steps[self.config.answer_step].provider_names()
        states = registry.states()
        shut = [t for t in targets if states.get(t) == "open"]
        return shut if targets and len(shut) == len(targets) else []

    def answer_providers(self) -> dict[str, Provider]:
        """The answer step's primary provider, by name, when this chain opened it (not
        injected, not the embedded local model: see :meth:`embedded_model_providers`):
        the server whose absence fails every turn (``chainrun serve`` watches it)."""
        names = self.config.steps[self.config.answer_step].provider_names()
        embedded = {id(p) for p in self.embedded_model_providers()}
        out: dict[str, Provider] = {}
        for name in names[:1]:
            provider = self._providers.get(name)
            if provider is None or name in self._injected or isinstance(provider, _Down):
                continue
            if id(provider) not in embedded:
                out[name] = provider
        return out

    async def _open_providers(self) -> None:
        """Build every provider a step uses and check that its server answers.

        Only an unreachable *primary* (some step's ``provider``) stops the chain here. A
        provider used only as a hedge target that is unreachable is reported in one
        warning line and its circuit breaker starts open for the chain's life (a copy
        that cannot connect would end its race: errors are not hedged), so the steps
        hedged onto it run unhedged on their primary.
        """
        primaries = {n.providers[0] for n in self.needs.values() if n.providers}
        for name in self._used_providers():
            if name in self._injected:
                self._providers[name] = self._injected[name]
                continue
            try:
                provider = await open_provider(name, self.config.providers[name], quiet=self.quiet)
            except ProviderUnavailable as e:
                if name in primaries:
                    raise
                for registry in self._breakers.values():
                    registry.get(name).trip(math.inf)
                self._providers[name] = _Down(name, str(e))
                logger.warning("hedge target %r is down (%s); its circuit breaker starts "
                               "open: the steps hedged onto it run unhedged", name, e)
                continue
            self._providers[name] = provider
            self._owned.append(provider)

    async def flush(self) -> None:
        """Wait until every turn this chain has returned is committed to the log (turns
        return once their rows are queued, see ``[log] durable_turns``); a no-op
        without a log. Shadow losers still running update their rows later.

        Raises:
            LogWriteError: turns that had returned were refused by the log (a full disk,
                a lock held past the busy timeout): they are named, and are not in the log.
            Exception: any other first failure of a write since the last flush.
        """
        if self.store is not None:
            await self.store.flush()

    async def aclose(self, status: str = "complete") -> None:
        """Wait for background work (shadow losers) and the log writes it queued, close
        steps and providers, end the run. A run any of whose turns the log refused ends
        ``lost_turns`` (unless ``interrupted``), whoever caught the error of an earlier
        :meth:`flush`; a write error not raised before
        (:class:`~chainrun.errors.LogWriteError`) is raised after everything is closed.
        From then on the chain refuses turns (:class:`~chainrun.errors.ChainClosed`);
        closing it again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._background:  # shadow losers (bounded by their step's deadline)
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._creating_run is not None:  # a run being created by a cancelled turn
            await asyncio.gather(self._creating_run, return_exceptions=True)
        write_error: Exception | None = None
        try:
            await self.flush()
        except Exception as e:
            write_error = e
            if not (isinstance(e, LogWriteError) and e.lost):  # lost turns: lost_turns below
                status = "failed"
        if (self.store is not None and self.run_id is not None and status != "interrupted"
                and self.store.lost_turns(self.run_id)):  # fmt: skip
            status = "lost_turns"
        for step in reversed(self._opened):
            await step.aclose()
        self._opened.clear()
        if self._loop_lag is not None:
            await self._loop_lag.__aexit__(None, None, None)
            self._loop_lag = None
        await self.conversations.aclose()
        for p in self._owned:
            await p.aclose()
        self._owned.clear()
        for tool in self.tools.values():
            await tool.aclose()
        if self.store is not None and self.run_id is not None:
            await self.store.afinish_run(self.run_id, status)  # type: ignore[arg-type]
        if write_error is not None:
            raise write_error

    def _check_open(self) -> None:
        if self._closed:
            raise ChainClosed("the chain is closed (after aclose() or its async with block); "
                              "build a new Chain")  # fmt: skip

    async def ensure_run(self) -> int | None:
        """The run this chain logs into, created on first use (None without a store).

        Created off the event loop (:meth:`Store.acreate_run`: on the log's writer
        thread, committed before this returns), once however many turns start together.
        A turn cancelled while it waits leaves the creation running; the next turn, or
        :meth:`aclose`, picks its id up.

        Raises:
            ChainClosed: the chain was closed.
        """
        self._check_open()
        if self.store is None or self.run_id is not None:
            return self.run_id
        if self._creating_run is None:
            self._creating_run = asyncio.ensure_future(
                self.store.acreate_run(
                    self.kind, self.config.snapshot(), label=self.label, source=self.source
                )
            )
            self._creating_run.add_done_callback(self._run_created)
        # (a creation already done is returned by shield at once, before its callback)
        self.run_id = await asyncio.shield(self._creating_run)
        return self.run_id

    def _run_created(self, creating: asyncio.Future[int]) -> None:
        if creating.cancelled() or creating.exception() is not None:
            self._creating_run = None  # the next turn tries again (and sees the error)
            return
        self.run_id = creating.result()

    # -- one turn --------------------------------------------------------------------
    async def run_turn(self, message: str, **kwargs: Any) -> TurnFinished:
        """Run a whole turn and return its :class:`TurnFinished` (events are discarded).

        Raises:
            what :meth:`stream_turn` raises.
        """
        last: TurnFinished | None = None
        async with contextlib.aclosing(self.stream_turn(message, **kwargs)) as events:
            async for ev in events:
                if isinstance(ev, TurnFinished):
                    last = ev
        assert last is not None
        return last

    async def stream_turn(
        self, message: str | TurnRequest, /, **fields: Any
    ) -> AsyncGenerator[Event, None]:
        """Run one turn, yielding typed events as they happen: the front desk admits it
        (:mod:`chainrun.desk`), its steps run, it is logged.

        ``message``: the shopper's text, or a whole :class:`~chainrun.desk.TurnRequest`,
        whose fields ``fields`` are otherwise (``conversation_id``, ``history``, ``user``,
        ``idempotency_key``, ``confirm``, ``deny``, ...). The turn's clock starts with the
        request (here: the first iteration); what the desk waits for is part of it.

        Raises:
            UserInputError: a bad argument (``message: expected a string, got
                NoneType``), or a ``confirm`` / ``deny`` naming no action of the
                conversation: at the first iteration, before anything runs or is logged.
            ConversationForbidden: the desk refused the request (another identity's
                conversation); so do ``IdempotencyKeyReused``, ``RequestInProgress`` and
                ``LogUnavailable``, each with its ``http_status``: nothing ran.
            ChainClosed: the chain was closed.
            ProviderUnavailable: a provider could not be reached (``StepConfigError``:
                it refused a step's request as misconfigured), after the turn was logged
                with status ``error``.
        """
        request = message if isinstance(message, TurnRequest) else TurnRequest(message, **fields)
        self._check_open()  # also when the run exists already (ensure_run is skipped then)
        run_id = self.run_id if self.run_id is not None else await self.ensure_run()
        admitted = await self.desk.admit(request, run_id)
        if isinstance(admitted, Repeated):  # the key's first request: its turn, nothing run
            async for event in admitted.events:
                yield event
            return
        state = TurnState(message=admitted.message, values={"history": admitted.place.history},
                          fields=self.fields, conversation_id=admitted.place.conversation_id,
                          cache_key=admitted.request.cache_key)
        run = TurnRun(self.steps, self.graph, state, self._answered, admitted)
        turn, shown = admitted.turn_row(), []  # the answer's text as it reached the caller
        answered = False  # AnswerDone reached the caller: the shopper has the whole answer
        try:
            async for event in run.events():
                if isinstance(event, TokenDelta) and event.step == self.config.answer_step:
                    shown.append(event.text)
                elif isinstance(event, AnswerDone):
                    event = self._answer_done(admitted, run, turn, event)
                    answered = True
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            # stopped after the whole answer reached the shopper: the turn stays answered
            # (no step still pending could end it, see TurnRun's AnswerDone); only the
            # checks still running are cut, their steps logged ``cancelled``
            turn.status = "ok" if answered else "cancelled"
            raise
        except BaseException as e:
            turn.status, turn.error_type = "error", error_type(e)
            raise
        finally:
            finished = await self._end_turn(admitted, run, turn, "".join(shown))
        yield finished
        if run.unavailable is not None:
            raise run.unavailable

    def _answer_done(self, admitted: Admitted, run: TurnRun, turn: TurnRow,
                     event: AnswerDone) -> AnswerDone:  # fmt: skip
        """``event`` with the turn's conversation and index; the turn is recorded in its
        conversation now, before the checks after the answer end
        (``ConversationSource.answered``): a client that sends its next message as soon
        as it has the answer finds this turn in the history."""
        place = admitted.place
        context, messages = answer_turn(run.calls(), self.config.answer_step,
                                        self._answer_template, place.history.text)
        self.conversations.answered(place, HistoryTurn(
            turn.input, event.text, shown_products(run.rows()), context, messages))
        return dataclasses.replace(event, conversation_id=turn.conversation_id,
                                   turn_index=turn.turn_index)

    async def _end_turn(
        self, admitted: Admitted, run: TurnRun, turn: TurnRow, shown: str
    ) -> TurnFinished:
        """The turn's end: its run stopped, its rows logged, its conversation and key told,
        and the :class:`TurnFinished` the caller gets."""
        try:
            await run.cancel()  # no-op unless the turn was stopped half way
        finally:
            turn_id = await self._log_turn(admitted.run_id, run, turn, shown)
        place, decided = admitted.place, admitted.decided
        products = shown_products(run.rows())
        context, messages = answer_turn(run.calls(), self.config.answer_step,
                                        self._answer_template, place.history.text)
        self.conversations.end(place, turn.input, turn.output, products, context, messages)
        # a turn whose answer was not its question withdrew what it asked (Desk.settle)
        answered = turn.status in ("ok", "cut")
        pending = tuple(run.tools.pending) if run.tools is not None and answered else ()
        await self.desk.settle(admitted, turn.status, run.tools)
        return TurnFinished(
            turn_id=turn_id, run_id=admitted.run_id, output=turn.output, status=turn.status,
            duration_ms=turn.duration_ms or 0.0, label=turn.label, verdicts=turn.verdicts,
            error_type=turn.error_type, answer_ttft_ms=turn.answer_ttft_ms,
            answer_done_ms=turn.answer_done_ms, truncated=bool(turn.truncated),
            conversation_id=place.conversation_id, turn_index=place.turn_index,
            products=products, pending_actions=(*pending, *decided.asked),
            decisions=tuple(decided.decisions), context=context, tool_messages=messages,
            admit_ms=turn.admit_ms,
        )  # fmt: skip

    async def _known_products(self, ids: Sequence[str]) -> list[str]:
        """Which of the product ids ``ids`` the chain's catalogue holds (read off the
        loop); none before :meth:`open`."""
        db = self._catalog_db
        if db is None:
            return []
        found = await reader_for(db).run(lambda d: get_products(d, ids))
        return [p["id"] for p in found]

    async def _log_turn(
        self, run_id: int | None, run: TurnRun, turn: TurnRow, shown: str = ""
    ) -> int | None:
        """Fill the turn's row from the finished run, queue its write (off the loop, on
        the store's writer thread; committed when this returns only with ``[log]
        durable_turns``), start after-log work. ``shown``: the answer text that reached
        the caller (a cancelled or failed turn's output: what the shopper saw, None when
        nothing did)."""
        turn.duration_ms = run.now_ms()
        turn.label = run.state.label
        turn.verdicts = dict(run.verdicts)
        if turn.status == "ok" and run.refused:
            turn.status = "replaced" if run.replaced else "refused"
            turn.error_type = run.error_type_of(run.refused_by)
        elif turn.status == "ok" and run.cut_by is not None:
            # the answer step failed once part of its answer had reached the shopper:
            # that part is the turn's answer, cut (chainrun.scheduler), never a refusal
            turn.status, turn.error_type = "cut", run.error_type_of(run.cut_by)
        elif turn.status == "ok" and run.failed_by is not None:
            # the answer step failed open before any of its answer reached the shopper:
            # there was nothing to let through, the turn failed with the step's error
            turn.status, turn.error_type = "error", run.error_type_of(run.failed_by)
        if run.unavailable is not None and turn.status != "cancelled":
            turn.status, turn.error_type = "error", run.unavailable.error_type
        # the shopper's wait for the first answer token is known once a token reached them,
        # whatever ended the turn afterwards (a cancel, a block mid-stream)
        turn.answer_ttft_ms = run.answer_ttft_ms
        # an answer cut at its token cap is said in the turn, not only in a call column
        turn.truncated = any(r.truncated for r in run.rows() if r.step == self.graph.answer_step)
        if turn.status == "ok":
            turn.output = run.state.answer or ""
            turn.answer_done_ms = run.answer_done_ms
        elif turn.status in ("refused", "replaced"):
            turn.output = run.refusal_text or REFUSAL
        else:  # cut, cancelled or error: the part of the answer that reached the shopper
            turn.output = shown or None
        turn_id = None
        if self.store is not None and run_id is not None:
            log = TurnLog(turn, run.rows(), run.calls(), run.tool_calls())
            turn_id = await self.store.alog_turn(run_id, log,
                                                 durable=self.config.log.durable_turns)
        for callback in run.after_log():
            task = asyncio.create_task(_after_log(callback, turn_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return turn_id
