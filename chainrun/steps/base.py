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

Adding a kind of step::

    from chainrun.steps import Step, StepResult, register_step_kind

    @register_step_kind
    class Shout(Step):
        kind = "shout"

        @property
        def reads(self): return frozenset({"answer"})
        @property
        def writes(self): return frozenset({"answer"})

        async def run(self, state, ctx):
            yield StepResult(updates={"answer": (state.answer or "").upper()})

and ``kind = "shout"`` in ``[steps.NAME]`` of chainrun.toml.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from chainrun.events import TokenDelta
from chainrun.log.rows import CallRow, StepRow

if TYPE_CHECKING:
    import sqlite_utils

    from chainrun.config import ChainConfig, StepConfig
    from chainrun.hedging import BreakerRegistry, HedgePolicy, LoopLagMonitor
    from chainrun.log.store import Store
    from chainrun.providers.base import Provider

#: Turn-state fields every turn starts with.
INITIAL_FIELDS = frozenset({"message"})
#: Turn-state fields a step may read or write (the prompt placeholders of the same names).
STATE_FIELDS = frozenset({"message", "label", "products", "answer"})


@dataclass(frozen=True)
class TurnState:
    """What a turn knows so far. Immutable: steps return updates, the chain folds them.

    Attributes:
        message: the shopper's message.
        label: the classify step's label (None until a step writes it).
        products: the retrieved products as the prompt shows them (None until retrieved).
        answer: the answer step's text (None until it finished).
        verdicts: per step name, the parsed verdict of checking steps (validate, guards).
    """

    message: str
    label: str | None = None
    products: str | None = None
    answer: str | None = None
    verdicts: Mapping[str, Any] = field(default_factory=dict)

    def prompt_vars(self) -> dict[str, str]:
        """The values prompt templates see (``{message}``, ``{label}``, ``{products}``,
        ``{answer}``); a field not set yet is empty (products: ``(none)``)."""
        return {
            "message": self.message,
            "label": self.label or "",
            "products": self.products or "(none)",
            "answer": self.answer or "",
        }

    def updated(self, updates: Mapping[str, Any]) -> TurnState:
        """A copy with ``updates`` applied.

        Raises:
            KeyError: an update names a field the state does not have.
        """
        unknown = set(updates) - STATE_FIELDS
        if unknown:
            raise KeyError(f"unknown turn-state field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **updates)


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


@dataclass
class BuildContext:
    """What a step may use when it is built (:meth:`Step.open`): shared for the chain."""

    config: ChainConfig
    providers: Mapping[str, Provider]
    #: the chain's circuit breakers, one registry per distinct breaker setting
    #: ``(breaker_failures, breaker_window_s, breaker_cooldown_s)``: steps with the same
    #: settings share their targets' breakers (a failing target is kept away from all)
    breakers: Mapping[tuple[int, float, float], BreakerRegistry]
    loop_lag: LoopLagMonitor | None
    #: the log database (the catalogue lives there), or an in-memory one without a log
    db: sqlite_utils.Database
    #: the run log (None: nothing is logged)
    store: Store | None = None
    #: a retriever to use instead of building one over the catalogue (tests, benchmarks)
    retriever: Any = None
    quiet: bool = False

    def breakers_for(self, policy: HedgePolicy) -> BreakerRegistry:
        """The breaker registry with ``policy``'s breaker settings.

        Raises:
            KeyError: the chain built no registry with those settings (a bug).
        """
        return self.breakers[breaker_key(policy)]


def breaker_key(policy: HedgePolicy) -> tuple[int, float, float]:
    """A policy's circuit-breaker settings: failures, window (s), cooldown (s)."""
    return (policy.breaker_failures, policy.breaker_window_s, policy.breaker_cooldown_s)


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

    def elapsed_ms(self) -> float:
        """ms since the step started."""
        return (time.perf_counter() - self.started) * 1000.0


StepItem = TokenDelta | StepResult


class Step(ABC):
    """One kind of step. Subclasses set ``kind`` and implement ``reads``, ``writes``
    and ``run``; ``open``/``aclose`` are for what the step holds across turns.

    Args:
        name: the step's name in the config (``[steps.NAME]``).
        config: the step's settings.
    """

    kind: ClassVar[str]
    #: the step calls model providers (its ``provider`` and hedge targets are opened)
    uses_providers: ClassVar[bool] = False
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
    @abstractmethod
    def writes(self) -> frozenset[str]:
        """Turn-state fields the step sets."""

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
    """Make ``cls`` the step class for ``kind = cls.kind`` (usable as a decorator).

    Raises:
        ValueError: another class already has that kind.
    """
    existing = _KINDS.get(cls.kind)
    if existing is not None and existing is not cls:
        raise ValueError(f"step kind {cls.kind!r} is already registered by {existing.__name__}")
    _KINDS[cls.kind] = cls
    return cls


def step_kinds() -> Mapping[str, StepFactory]:
    """Every registered step kind, by name."""
    return dict(_KINDS)
