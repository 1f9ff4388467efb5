"""Steps: the protocol (:mod:`.base`) and the built-in kinds, one module each.

``llm`` (:mod:`.llm`): a hedged model call; ``retrieve`` (:mod:`.retrieve`): early-exit
catalogue search; ``guard`` (:mod:`.guard`): a moderation model's verdict. Register your
own kind with :func:`register_step_kind`.
"""

from chainrun.steps.base import (
    BuildContext,
    Step,
    StepContext,
    StepResult,
    TurnState,
    register_step_kind,
    step_kinds,
)
from chainrun.steps.guard import GuardStep
from chainrun.steps.llm import LLMStep
from chainrun.steps.retrieve import Retriever, RetrieveStep

__all__ = [
    "BuildContext",
    "GuardStep",
    "LLMStep",
    "RetrieveStep",
    "Retriever",
    "Step",
    "StepContext",
    "StepResult",
    "TurnState",
    "register_step_kind",
    "step_kinds",
]
