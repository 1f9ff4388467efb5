"""Chain configuration: the chain's model, the built-in default chain, TOML loading.

Each concept owns its config model and this package assembles the chain's:

* :mod:`chainrun.config.chain`: :class:`ChainConfig` (order, providers, steps, checks,
  capabilities, grader, log, plugins); each ``[steps.NAME]`` is validated by its kind's
  model, a union discriminated on ``kind``.
* :mod:`chainrun.config.defaults`: the built-in default chain (:data:`DEFAULT_CHAIN`).
* :mod:`chainrun.config.loading`: :func:`load_config` (TOML merged onto the default
  chain key by key), :func:`config_from_dict`, :func:`config_from_snapshot`, ``plugins``.
* :mod:`chainrun.config.effective`: the effective config as TOML (``chainrun config show``).

The models it holds live with what reads them: :class:`ProviderConfig`
(:mod:`chainrun.providers.config`), :class:`StepConfig` (the base every kind's model
extends, :mod:`chainrun.steps.config`), :class:`ModelStepConfig` and
:class:`HedgeConfig` (:mod:`chainrun.steps.model_config`), each kind's model next to its
step (``LLMConfig`` in :mod:`chainrun.steps.llm`, ``RetrieveConfig``, ``GuardConfig``),
the checks' (:mod:`chainrun.checks.config`) and :class:`ModelCapabilities`
(:mod:`chainrun.config.capabilities`). Every mistake is one
:class:`~chainrun.errors.ConfigError` naming the field path and the bad value.
"""

from chainrun.checks.config import CheckAction, ChecksConfig, OutputCheckConfig, PatternConfig
from chainrun.config.capabilities import CapabilityParam, ModelCapabilities
from chainrun.config.chain import (
    ChainConfig,
    GraderConfig,
    LogConfig,
    step_config_adapter,
    step_config_models,
    steps_calling_models,
)
from chainrun.config.defaults import (
    DEFAULT_CHAIN,
    LLM_CLASSIFY_STEP,
    POLICY_LABELS,
    STEP_NAMES_DEFAULT,
)
from chainrun.config.effective import effective_toml
from chainrun.config.loading import (
    config_from_dict,
    config_from_snapshot,
    deep_merge,
    load_config,
    load_plugins,
)
from chainrun.providers.config import ProviderConfig, ReasoningEffort
from chainrun.steps.config import StepConfig
from chainrun.steps.guard import GuardConfig
from chainrun.steps.llm import LLMConfig
from chainrun.steps.model_config import HedgeConfig, ModelStepConfig, policy_from_config
from chainrun.steps.retrieve import RetrieveConfig

__all__ = [
    "DEFAULT_CHAIN",
    "LLM_CLASSIFY_STEP",
    "POLICY_LABELS",
    "STEP_NAMES_DEFAULT",
    "CapabilityParam",
    "ChainConfig",
    "CheckAction",
    "ChecksConfig",
    "GraderConfig",
    "GuardConfig",
    "HedgeConfig",
    "LLMConfig",
    "LogConfig",
    "ModelCapabilities",
    "ModelStepConfig",
    "OutputCheckConfig",
    "PatternConfig",
    "ProviderConfig",
    "ReasoningEffort",
    "RetrieveConfig",
    "StepConfig",
    "config_from_dict",
    "config_from_snapshot",
    "deep_merge",
    "effective_toml",
    "load_config",
    "load_plugins",
    "policy_from_config",
    "step_config_adapter",
    "step_config_models",
    "steps_calling_models",
]
