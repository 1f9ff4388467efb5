"""Steps: the protocol (:mod:`.base`), the config models, and the built-in kinds.

``llm`` (:mod:`.llm`): a hedged model call; ``retrieve`` (:mod:`.retrieve`): early-exit
catalogue search; ``classify`` (:mod:`.classify`): a label with no model call (nearest
examples, keyword rules or both); ``guard`` (:mod:`.guard`): a moderation model's
verdict; ``policy`` (:mod:`.policy`): the shop's policy text for the turn's label. Each
kind owns its config model next to its step (``LLMConfig``, ``RetrieveConfig``,
``GuardConfig``), extending :class:`StepConfig` (or :class:`ModelStepConfig` for a kind
that calls a model, composing :class:`HedgedCall`, the step's hedged model call, from
:mod:`.model_call`). Register your own kind with :func:`register_step_kind`.
"""

from chainrun.steps.base import (
    ANSWER,
    BUILTIN_FIELDS,
    INITIAL_FIELDS,
    LABEL,
    BuildContext,
    StateField,
    Step,
    StepContext,
    StepNeeds,
    StepResult,
    TurnState,
    known_fields,
    register_step_kind,
    step_kinds,
)
from chainrun.steps.classify import ClassifyStep
from chainrun.steps.config import StepConfig, route_problem
from chainrun.steps.guard import GuardConfig, GuardStep
from chainrun.steps.llm import LLMConfig, LLMStep
from chainrun.steps.model_call import CallResult, HedgedCall
from chainrun.steps.model_config import HedgeConfig, ModelStepConfig, policy_from_config
from chainrun.steps.policy import PolicyConfig, PolicyStep
from chainrun.steps.retrieve import PRODUCTS, RetrieveConfig, Retriever, RetrieveStep

__all__ = [
    "ANSWER",
    "BUILTIN_FIELDS",
    "INITIAL_FIELDS",
    "LABEL",
    "PRODUCTS",
    "BuildContext",
    "CallResult",
    "ClassifyStep",
    "GuardConfig",
    "GuardStep",
    "HedgeConfig",
    "HedgedCall",
    "LLMConfig",
    "LLMStep",
    "ModelStepConfig",
    "PolicyConfig",
    "PolicyStep",
    "RetrieveConfig",
    "RetrieveStep",
    "Retriever",
    "StateField",
    "Step",
    "StepConfig",
    "StepContext",
    "StepNeeds",
    "StepResult",
    "TurnState",
    "known_fields",
    "policy_from_config",
    "register_step_kind",
    "route_problem",
    "step_kinds",
]
