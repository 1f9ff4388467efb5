"""The step protocol: a step reads a :class:`TurnState` and hands back updates to it.

A step is an object with a ``name`` and ``run(state, ctx)``: an async generator that
yields the events the user should see as they happen (``TokenDelta`` for a streamed
answer) and ends by yielding one :class:`StepResult` (the fields of the turn state it
sets, its verdict, whether the turn must be refused). The shape follows inspect_ai's
solvers (``async (state) -> state``) with events on the side.

A step declares which turn-state fields it ``reads`` and ``writes``; the turn's graph
(:mod:`chainrun.graph`) is derived from those declarations, so a step starts as soon
as what it reads exists and steps that do not depend on each other run concurrently.

While it runs, a step records itself in its :class:`StepContext`: ``ctx.row`` (its
``steps`` row: status, duration, output, hedging summary) and ``ctx.calls`` (one
``calls`` row per model call attempt). The chain logs them even when the step is
cancelled half way (the caller went away, a sibling failed closed), so what was sent
is never lost.

Adding a kind of step, with its own config model and turn-state field::

    from typing import Literal
    from chainrun.steps import StateField, Step, StepConfig, StepResult, register_step_kind

    class OrderLookupConfig(StepConfig):
        kind: Literal["order_lookup"] = "order_lookup"
        #: the shop's order API
        api_url: str

    @register_step_kind
    class OrderLookup(Step):
        kind = "order_lookup"
        config_model = OrderLookupConfig
        state_fields = (StateField("order", "the shopper's order", empty="(no order)"),)

        @property
        def reads(self): return frozenset({"message"})
        @property
        def writes(self): return frozenset({"order"})

        async def run(self, state, ctx):
            yield StepResult(updates={"order": await lookup(self.config.api_url, state.message)})

and ``kind = "order_lookup"`` in ``[steps.NAME]`` of chainrun.toml (with ``plugins =
["the_module"]`` so that the CLI imports it); other steps' prompts read ``{order}``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, get_args, get_origin

from chainrun.conversations.history import History
from chainrun.events import ProductsShown, TokenDelta, ToolCallEvent
from chainrun.log.rows import CallRow, StepRow, ToolCallRow
from chainrun.steps.config import StepConfig

if TYPE_CHECKING:
    import sqlite_utils

    from chainrun.hedging import BreakerRegistry, HedgePolicy, LoopLagMonitor
    from chainrun.log.reads import SeedWindows
    from chainrun.log.store import Store
    from chainrun.providers.base import Provider
    from chainrun.providers.rate_limit import RateLimiter
    from chainrun.retrieval.products import ShownProduct
    from chainrun.steps.model_config import ModelStepConfig
    from chainrun.tools import Tool, TurnTools


@dataclass(frozen=True)
class StateField:
    """A named field of the turn state: prompts read it as ``{NAME}``.

    Attributes:
        name: the field's name (and its placeholder).
        doc: what it holds, in one line.
        empty: what a prompt shows while no step has set it (a step that failed open, or
            was skipped by its ``when``, leaves it unset).
        render: turns a set value into prompt text (None: ``str``).
        dump: turns a set value into JSON data for the writing step's row in the log
            (``steps.updates``; None: the value itself when it is JSON data, else its
            prompt text).
        again: renders a set value for a prompt whose history already shows some of it:
            ``(value, history text) -> text``, naming what the history shows instead of
            repeating it (None: the field renders the same whatever the history).
    """

    name: str
    doc: str
    empty: str = ""
    render: Callable[[Any], str] | None = None
    dump: Callable[[Any], Any] | None = None
    again: Callable[[Any, str], str] | None = None

    def text(self, value: Any, seen: str = "") -> str:
        """The prompt text for ``value`` (None: the field's ``empty`` text); ``seen``: the
        history text the prompt already holds (the field's ``again`` renders it then)."""
        if value is None:
            return self.empty
        if seen and self.again is not None:
            return self.again(value, seen)
        return self.render(value) if self.render is not None else str(value)

    def logged(self, value: Any) -> Any:
        """``value`` as JSON data for the log (see ``dump``)."""
        if self.dump is not None:
            return self.dump(value)
        if value is None or isinstance(value, str | int | float | bool):
            return value
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return self.text(value)
        return value


#: The turn-state fields of every chain (filled by the chain, written by no step).
BUILTIN_FIELDS: dict[str, StateField] = {
    f.name: f
    for f in (
        StateField("message", "the shopper's message"),
        StateField(
            "history",
            "the conversation's earlier turns, cut to the [history] budget (a transcript)",
            render=lambda h: h.text,
        ),
    )
}
#: Turn-state fields every turn starts with (filled by the chain, written by no step):
#: the message, and the conversation's earlier turns (a
#: :class:`~chainrun.conversations.history.History`, "" on a first turn)
INITIAL_FIELDS = frozenset(BUILTIN_FIELDS)

#: The message's category: declared by the kinds that write it (``classify``, an ``llm``
#: step with ``labels``)
LABEL = StateField("label", "the message's category, written by a step with labels")
#: The answer's text: declared by the kinds that can be the answer step (``llm``)
ANSWER = StateField("answer", "the answer step's text")


@dataclass(frozen=True)
class TurnState:
    """What a turn knows so far. Immutable: steps return updates, the chain folds them.

    Attributes:
        message: the shopper's message.
        values: the other fields set so far, by name (a field no step has set is absent).
        verdicts: per step name, the parsed verdict of checking steps (validate, guards).
        fields: the fields this chain knows (built-ins plus those its steps' kinds
            declare), with what a prompt shows while one is unset (default: every
            field of every registered kind, :func:`known_fields`).
        conversation_id: the turn's conversation (None: not known).
        cache_key: the turn's prompt-cache affinity key when it is not the conversation
            (a client's hint: OpenAI's ``prompt_cache_key``); None: the conversation's.
    """

    message: str
    values: Mapping[str, Any] = field(default_factory=dict)
    verdicts: Mapping[str, Any] = field(default_factory=dict)
    fields: Mapping[str, StateField] = field(default_factory=lambda: known_fields())
    #: the conversation the turn belongs to (None: not known); model calls send it as
    #: their prompt-cache affinity key (:attr:`chainrun.providers.base.ChatRequest.cache_key`)
    conversation_id: str | None = None
    #: the prompt-cache affinity key model calls send instead of the conversation id
    #: (None: the conversation id)
    cache_key: str | None = None

    @property
    def affinity_key(self) -> str | None:
        """What keeps the turn's model calls on one prompt cache: :attr:`cache_key`, else
        the conversation id (None: neither)."""
        return self.cache_key if self.cache_key is not None else self.conversation_id

    def get(self, name: str) -> Any:
        """The value of field ``name`` (None while unset)."""
        return self.message if name == "message" else self.values.get(name)

    @property
    def history(self) -> History:
        """The conversation's earlier turns (none on a first turn)."""
        value = self.values.get("history")
        return value if isinstance(value, History) else History()

    @property
    def label(self) -> str | None:
        """The classify step's label (None until a step writes it)."""
        return self.values.get("label")

    @property
    def products(self) -> tuple[ShownProduct, ...] | None:
        """The products the turn was shown, as data (a tuple of
        :class:`~chainrun.retrieval.products.ShownProduct`, in the order found), whichever
        step wrote the ``products`` field; None until one did (or it failed)."""
        return self.values.get("products")

    @property
    def answer(self) -> str | None:
        """The answer step's text (None until it finished)."""
        return self.values.get("answer")

    def prompt_vars(self, *, after_history: bool = False) -> dict[str, str]:
        """The values prompt templates see, by placeholder: every field the chain knows;
        a field not set yet shows its ``empty`` text (``{products}``: ``(none)``).
        ``after_history``: the prompt shows them after ``{history}``, so a field that
        can (its ``again``) names what the history already shows rather than repeat it
        (a follow-up's products shown by the turn before: their ids only)."""
        seen = self.history.text if after_history else ""
        out = {name: f.text(self.values.get(name), seen if name != "history" else "")
               for name, f in self.fields.items()}  # fmt: skip
        out["message"] = self.message
        return out

    def updated(self, updates: Mapping[str, Any]) -> TurnState:
        """A copy with ``updates`` applied.

        Raises:
            KeyError: an update names a field the chain does not know (or ``message``).
        """
        unknown = set(updates) - (set(self.fields) - INITIAL_FIELDS)
        if unknown:
            raise KeyError(f"unknown turn-state field(s): {sorted(unknown)}")
        return dataclasses.replace(self, values={**self.values, **updates})


@dataclass
class StepResult:
    """What a step hands back when it ends (the last item its ``run`` yields).

    Attributes:
        updates: turn-state fields to set; each must be in the step's ``writes``.
        verdict: stored as the turn's ``verdicts[step name]`` when not None.
        error: why the step has no answer (the chain applies the step's ``on_failure``).
        refuse: the step judged that the turn must be refused (an ``unsafe`` verdict);
            a refusal cancels the turn's running steps and skips the rest.
        refusal_text: what the user is told instead of the answer (None: the chain's
            default refusal).
        replaced: with ``refuse``: ``refusal_text`` is a safe answer that replaces the
            answer (``on_reject = "replace"``): the turn's status is ``replaced``.
    """

    updates: dict[str, Any] = field(default_factory=dict)
    verdict: Any = None
    error: BaseException | None = None
    refuse: bool = False
    refusal_text: str | None = None
    replaced: bool = False


class ChainSettings(Protocol):
    """What a step may read of the chain's config (a :class:`chainrun.config.ChainConfig`
    is one): its order, answer step, providers and step tables."""

    @property
    def order(self) -> list[str]: ...
    @property
    def answer_step(self) -> str: ...
    @property
    def providers(self) -> Mapping[str, Any]: ...
    @property
    def steps(self) -> Mapping[str, StepConfig]: ...


@dataclass
class BuildContext:
    """What a step may use when it is built (:meth:`Step.open`): shared for the chain."""

    #: the chain's config
    config: ChainSettings
    providers: Mapping[str, Provider]
    #: each step's circuit breakers, by step name (steps with the same breaker settings
    #: share one registry: a failing target is kept away from all of them)
    breakers: Mapping[str, BreakerRegistry]
    loop_lag: LoopLagMonitor | None
    #: the catalogue's database: the log's (the sample catalogue loaded when a step
    #: needs the catalogue and it has none), or an in-memory one without a log
    db: sqlite_utils.Database
    #: the run log (None: nothing is logged, or the step did not ask for it)
    store: Store | None = None
    #: a retriever to use instead of building one over the catalogue (tests, benchmarks)
    retriever: Any = None
    #: the chain's tools by name (``[tools.NAME]``), built before any call
    tools: Mapping[str, Tool] = field(default_factory=dict)
    quiet: bool = False
    #: seed each hedged step's latency window from the log's recent calls (None: do not)
    seed_windows: SeedWindows | None = None
    #: each provider's rate limiter in this process, by provider name (shared by every
    #: step that calls it; absent: no limit)
    rate_limits: Mapping[str, RateLimiter] = field(default_factory=dict)

    def breakers_for(self, step: str) -> BreakerRegistry:
        """Step ``step``'s breaker registry (built by the chain for the policy its
        :meth:`Step.needs` named).

        Raises:
            KeyError: the step's needs named no policy (a bug of its kind).
        """
        return self.breakers[step]


@dataclass(frozen=True)
class StepNeeds:
    """What a step asks the chain to build before it opens (:meth:`Step.needs`).

    Attributes:
        providers: the providers the step calls, its own first, then hedge targets (the
            chain opens each once, starting the embedded model if one needs it; an
            unreachable first one stops the chain, an unreachable target is skipped).
        policy: the hedging policy its calls run under (the chain builds the circuit
            breakers for its settings); None: no calls.
        hedged: its calls may send copies (the chain starts the event-loop lag monitor).
        model: its request settings, checked against the capability table on each of
            ``providers`` before the first call (None: it calls no model).
        catalogue: it searches the shop's catalogue (the chain loads the sample
            catalogue into the log database when it has none).
        log: it updates its rows after the turn is logged (``BuildContext.store``).
    """

    providers: tuple[str, ...] = ()
    policy: HedgePolicy | None = None
    hedged: bool = False
    model: ModelStepConfig | None = None
    catalogue: bool = False
    log: bool = False


@dataclass
class StepContext:
    """One step's run within one turn: what it may use and where it records itself.

    Attributes:
        row: the step's ``steps`` row; the step fills status, duration, output, ...
        calls: the step's ``calls`` rows, appended as attempts are known.
        started: ``time.perf_counter()`` when the step started, in s.
        after_log: callbacks run with the turn id once the turn is logged (e.g. shadow
            losers finishing unseen update their rows later).
    """

    row: StepRow
    started: float = field(default_factory=time.perf_counter)
    calls: list[CallRow] = field(default_factory=list)
    after_log: list[Callable[[int | None], Awaitable[None]]] = field(default_factory=list)
    #: the answer's time to first token and generated tokens, for ``StepFinished``
    ttft_ms: float | None = None
    output_tokens: int | None = None
    #: the turn's tool calls (each run at most once per turn); None: the chain has no tools
    tools: TurnTools | None = None
    #: the step's ``tool_calls`` rows, filled by a step with tools
    tool_calls: list[ToolCallRow] = field(default_factory=list)

    def elapsed_ms(self) -> float:
        """ms since the step started."""
        return (time.perf_counter() - self.started) * 1000.0


StepItem = TokenDelta | ToolCallEvent | ProductsShown | StepResult


class Step(ABC):
    """One kind of step. Subclasses set ``kind`` and implement ``reads``, ``writes``
    and ``run``; ``open``/``aclose`` are for what the step holds across turns.

    A kind brings its config model (``config_model``, a :class:`StepConfig` subclass;
    ``[steps.NAME]`` is validated by it), may declare turn-state fields of its own
    (``state_fields``) and says what the chain must build for it (:meth:`needs`).

    Args:
        name: the step's name in the config (``[steps.NAME]``).
        config: the step's settings (an instance of ``config_model``).
    """

    kind: ClassVar[str]
    #: the model that validates ``[steps.NAME]`` of this kind
    config_model: ClassVar[type[StepConfig]] = StepConfig
    #: turn-state fields this kind adds beside the built-ins (prompts read them)
    state_fields: ClassVar[tuple[StateField, ...]] = ()
    #: a check whose pass the answer's tokens wait for while it runs (an input guard
    #: raced against the answer step): the answer's tokens are held back until it ends
    holds_answer: bool = False

    def __init__(self, name: str, config: StepConfig) -> None:
        self.name = name
        self.config = config

    @property
    def may_end_turn(self) -> bool:
        """Whether the step can end the turn early (refuse it, or fail closed): such a
        step is never deferred until after the answer (see ``off_path_steps``)."""
        return self.holds_answer or self.config.on_failure == "closed"

    @property
    @abstractmethod
    def reads(self) -> frozenset[str]:
        """Turn-state fields the step needs before it can start."""

    @property
    def writes(self) -> frozenset[str]:
        """Turn-state fields the step sets: by default every field it declares
        (:attr:`fields`). An update of a field not in it is the step's failure (under
        its ``on_failure``), not the turn's."""
        return frozenset(f.name for f in self.fields)

    @property
    def fields(self) -> tuple[StateField, ...]:
        """The turn-state fields this step adds: its kind's ``state_fields``, and one
        for each name its settings add (:meth:`StepConfig.added_fields`)."""
        own = tuple(
            StateField(n, f"written by step {self.name}")
            for n in self.config.added_fields()
            if n not in {f.name for f in self.state_fields}
        )
        return (*self.state_fields, *own)

    @property
    def routes_on(self) -> frozenset[str]:
        """Turn-state fields its ``when`` matches (it waits for their writers too)."""
        return self.config.route_fields()

    @property
    def model(self) -> str | None:
        """The model the step calls: its config's ``model`` (None: it calls none)."""
        return getattr(self.config, "model", None)

    @property
    def reasoning_effort(self) -> str | None:
        """The reasoning effort it asks for: its config's (None: none asked)."""
        return getattr(self.config, "reasoning_effort", None)

    def needs(self) -> StepNeeds:
        """What the chain must build before :meth:`open` (nothing by default)."""
        return StepNeeds()

    def bind(self, answer_step: str) -> None:  # noqa: B027 (optional hook)
        """Told the chain's answer step before the graph is built.

        Raises:
            ConfigError: this step cannot be the answer step but is.
        """

    def beside(self, steps: Mapping[str, Step]) -> str | None:
        """What is wrong with this step beside the chain's other built steps, as ``KEY:
        reason`` (None: nothing): a check of what the step read when it was built (a
        file) against another step's settings. Nothing here."""
        return None

    async def open(self, ctx: BuildContext) -> None:  # noqa: B027 (optional hook)
        """Acquire what the step keeps across turns (a hedger, a retriever)."""

    async def aclose(self) -> None:  # noqa: B027 (optional hook)
        """Release what :meth:`open` acquired."""

    @abstractmethod
    def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        """Run the step on ``state``: yield events, end with one :class:`StepResult`."""


StepFactory = type[Step]
_KINDS: dict[str, StepFactory] = {}


def register_step_kind(cls: StepFactory) -> StepFactory:
    """Make ``cls`` the step class for ``kind = cls.kind`` (usable as a decorator); its
    ``config_model`` validates the kind's tables from then on.

    The kind's name may be given once, on the config model (``kind:
    Literal["order_lookup"] = "order_lookup"``): a class without ``kind`` takes it from
    there; a class that sets both must agree with its model.

    Raises:
        ValueError: another class already has that kind; ``config_model`` is not a
            :class:`StepConfig`; the class's ``kind`` and its config model's differ (or
            neither names one); a declared state field is a built-in one, or another kind
            declares a field of that name differently.
    """
    if not (isinstance(cls.config_model, type) and issubclass(cls.config_model, StepConfig)):
        raise ValueError(
            f"step kind {getattr(cls, 'kind', cls.__name__)!r}: config_model must be a "
            "subclass of chainrun.steps.StepConfig"
        )
    model_kind = _model_kind(cls.config_model)
    own = cls.__dict__.get("kind")
    if own is None:
        inherited = model_kind or getattr(cls, "kind", None)
        if inherited is None:
            raise ValueError(
                f"step class {cls.__name__}: no kind (set kind = '...' on the class, or "
                "kind: Literal['...'] on its config_model)"
            )
        cls.kind = inherited
    elif model_kind is not None and model_kind != own:
        raise ValueError(
            f"step kind {own!r}: its config_model {cls.config_model.__name__} says kind "
            f"{model_kind!r}"
        )
    existing = _KINDS.get(cls.kind)
    if existing is not None and existing is not cls:
        raise ValueError(f"step kind {cls.kind!r} is already registered by {existing.__name__}")
    others = _declared_fields(k for k in _KINDS.values() if k is not cls)
    for f in cls.state_fields:
        if f.name in BUILTIN_FIELDS:
            raise ValueError(f"step kind {cls.kind!r}: {f.name!r} is a built-in state field")
        if f.name in others and others[f.name] != f:
            raise ValueError(
                f"step kind {cls.kind!r}: state field {f.name!r} is declared differently "
                "by another kind"
            )
    _KINDS[cls.kind] = cls
    return cls


def _model_kind(model: type[StepConfig]) -> str | None:
    """The kind a config model narrows ``kind`` to (``Literal["retrieve"]``), or None
    when it does not narrow it (:class:`StepConfig` itself)."""
    info = model.model_fields.get("kind")
    if info is None or get_origin(info.annotation) is not Literal:
        return None
    args = get_args(info.annotation)
    return str(args[0]) if len(args) == 1 else None


def step_kinds() -> Mapping[str, StepFactory]:
    """Every registered step kind, by name."""
    return dict(_KINDS)


def _declared_fields(kinds: Iterable[StepFactory]) -> dict[str, StateField]:
    return {f.name: f for k in kinds for f in k.state_fields}


def known_fields() -> dict[str, StateField]:
    """Every turn-state field a prompt may name: the built-ins and those every registered
    kind declares."""
    return {**BUILTIN_FIELDS, **_declared_fields(_KINDS.values())}
