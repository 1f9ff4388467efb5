"""The guard step (``kind = "guard"``): a moderation or classifier model's verdict.

A guard is a hedged model call (like any model step, by its ``[hedge]`` table) whose answer is
read in Llama Guard's reply format (:func:`chainrun.checks.verdict.parse_llama_guard`):
``safe``, or ``unsafe`` with category codes. Only an explicit ``unsafe`` refuses the turn;
its categories go into the turn's verdicts. A missing verdict (``timeout``, ``error``,
``unparseable``) is logged with its reason and decided by the step's
``on_missing_verdict`` (``open`` or ``closed``, required: there is no default).

An *input* guard (its prompt does not read ``{answer}``) starts with the turn's first
steps and races them: while it runs, the answer's tokens are held back
(:attr:`~chainrun.steps.base.Step.holds_answer`), and an ``unsafe`` verdict cancels the
running steps (their streams are closed) so nothing of their output reaches the user.
An *output* guard reads ``{answer}`` and runs once the answer is there.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Literal

from chainrun.answer_json import answer_problem
from chainrun.checks.verdict import GuardVerdict, missing_verdict, parse_llama_guard
from chainrun.errors import ConfigError
from chainrun.steps.base import (
    BuildContext,
    Step,
    StepContext,
    StepItem,
    StepNeeds,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.llm import missing_reason
from chainrun.steps.model_call import CallResult, HedgedCall
from chainrun.steps.model_config import ModelStepConfig, template_fields


class GuardConfig(ModelStepConfig):
    """A ``guard`` step (``[steps.NAME]`` with ``kind = "guard"``): a model call whose
    reply is read as a Llama Guard verdict (see the module text)."""

    kind: Literal["guard"] = "guard"
    #: required: what a missing verdict (timeout, error, unparseable reply) means:
    #: ``open`` lets the turn through, ``closed`` refuses it (no default)
    on_missing_verdict: Literal["open", "closed"]


@register_step_kind
class GuardStep(Step):
    """A guard (``kind = "guard"``): the step's hedged model call
    (:class:`~chainrun.steps.model_call.HedgedCall`) read as a verdict; see the module
    text. It writes no field.

    Raises:
        ConfigError: the guard is the answer step.
    """

    config_model = GuardConfig
    config: GuardConfig

    def __init__(self, name: str, config: GuardConfig) -> None:
        super().__init__(name, config)
        self.on_missing = config.on_missing_verdict
        schema = config.json_schema
        wants_json = config.expect_json or schema is not None
        #: the guard's hedged model call
        self.call = HedgedCall(
            name, config,
            answer_problem=(lambda text: answer_problem(text, schema)) if wants_json else None,
        )  # fmt: skip
        # an input guard races the answer step: hold the answer back until it has passed
        self.holds_answer = "answer" not in self.reads

    @property
    def reads(self) -> frozenset[str]:
        return template_fields(*self.config.templates().values())

    @property
    def may_end_turn(self) -> bool:
        return True  # an ``unsafe`` verdict refuses the turn

    def needs(self) -> StepNeeds:
        """What its model call needs (:meth:`HedgedCall.needs`)."""
        return self.call.needs()

    def bind(self, answer_step: str) -> None:
        if self.name == answer_step:
            raise ConfigError(f"answer_step: {self.name!r} is a guard, not an answer")

    async def open(self, ctx: BuildContext) -> None:
        await self.call.open(ctx)

    async def aclose(self) -> None:
        await self.call.aclose()

    def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        return self.call.step_items(ctx, self.call.request(state),
                                    lambda call: self._verdict(ctx, call))  # fmt: skip

    def _verdict(self, ctx: StepContext, call: CallResult) -> StepResult:
        """The guard's verdict of its call: Llama Guard's reply read, or a missing verdict
        with its reason, decided by ``on_missing_verdict``."""
        if call.error is not None:
            verdict: GuardVerdict = missing_verdict(missing_reason(call.error))
        else:
            verdict = parse_llama_guard(ctx.row.output)
        refuse = verdict.refuses(self.on_missing)
        if verdict.status == "missing":
            # the log's error vocabulary (chainrun.errors.error_type); the reason itself
            # (timeout / error / unparseable) is in the verdict
            ctx.row.error_type = ctx.row.error_type or "invalid_answer"
            ctx.row.status = "failed_closed" if refuse else "failed_open"
        ctx.row.detail = {**(ctx.row.detail or {}), "verdict": verdict.as_json()}
        return StepResult(verdict=verdict.as_json(), refuse=refuse)


__all__ = ["GuardConfig", "GuardStep"]
