"""What each model accepts, checked before the first call.

A step that asks a model for something it refuses (a ``reasoning_effort`` it does not
take, a ``stop`` it rejects) fails at run time with HTTP 400 on every call. chainrun
checks the chain against a capability table first and refuses to start with one line
naming the step, the value and what the model accepts (:func:`check_chain`).

The table: the config's ``[capabilities."MODEL"]`` entries, then the built-ins below
(:data:`BUILTIN`). A model is looked up by its exact name, then without a dated
snapshot suffix (``gpt-5-mini-2025-08-07`` → ``gpt-5-mini``); a step on the embedded
local model (a provider with neither ``base_url`` nor Azure) uses the ``llama-server``
entry when its model is not in the table. A model the table does not know is not
checked here: the provider's first 400 refusal naming a parameter stops the run
instead (the reliability work, in the chain).

Sources of the built-ins (as of 2026): OpenAI's reasoning guide and model pages for
the ``reasoning_effort`` values per family (low/medium/high for o1, o3-mini, o3,
o4-mini; minimal added with gpt-5; none as the default and minimal dropped with
gpt-5.1; xhigh added with gpt-5.2; high only for gpt-5-pro); the 400 "Unsupported
parameter: 'stop' is not supported with this model" (``param: stop``, code
``unsupported_parameter``) reported for o3, o4-mini and gpt-5 through gpt-5.2
(e.g. huggingface/smolagents#1671 and #1893, crewAIInc/crewAI#2738), and "Only the
default (1) value is supported" for ``temperature`` on reasoning models. llama-server
takes every parameter chainrun sends and ignores ``reasoning_effort`` (checked
with openai 3.57 against llama-server).

The Responses API itself has no ``stop`` and no ``seed``: a step on an ``api =
"responses"`` provider that sets them is refused the same way, whatever the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from chainrun.errors import ConfigError
from chainrun.providers.config import ProviderConfig, ReasoningEffort
from chainrun.steps.config import StepConfig
from chainrun.steps.model_config import ModelStepConfig

#: The optional request parameters a capability entry can allow or refuse.
CapabilityParam = Literal["temperature", "seed", "stop"]


class ModelCapabilities(BaseModel):
    """One model's entry in the capability table (``[capabilities."MODEL"]``; the
    built-ins are :data:`BUILTIN`). None = not known, not checked.

    Attributes:
        reasoning_effort: the ``reasoning_effort`` values the model accepts.
        response_format: the ``response_format`` kinds it accepts (a step's
            ``json_schema`` needs ``json_schema``).
        params: which of the optional parameters (temperature, seed, stop) it accepts.
        source: where the entry comes from ("config" or "built-in"; shown in messages).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the ``reasoning_effort`` values the model accepts (None: not checked)
    reasoning_effort: list[ReasoningEffort] | None = None
    #: the ``response_format`` kinds it accepts (None: not checked)
    response_format: list[Literal["json_schema", "json_object", "text"]] | None = None
    #: which of the optional parameters temperature, seed, stop it accepts (None: not checked)
    params: list[CapabilityParam] | None = None
    #: where the entry comes from ("config" or "built-in"; shown in messages)
    source: str = "config"


#: The optional request parameters a capability entry can allow or refuse.
PARAMS: tuple[CapabilityParam, ...] = ("temperature", "seed", "stop")

#: Parameters the Responses API has no field for.
RESPONSES_API_LACKS: tuple[CapabilityParam, ...] = ("seed", "stop")

_DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")

#: The table key for a model served by the embedded llama-server.
LLAMA_SERVER = "llama-server"


def _reasoning(efforts: list[ReasoningEffort], source: str) -> ModelCapabilities:
    return ModelCapabilities(
        reasoning_effort=efforts,
        response_format=["json_schema", "json_object", "text"],
        params=["seed"],  # no stop, and temperature only at its default (1)
        source=source,
    )


_O_SERIES: list[ReasoningEffort] = ["low", "medium", "high"]
_GPT5: list[ReasoningEffort] = ["minimal", "low", "medium", "high"]

#: The built-in entries (sources in this module's docstring).
BUILTIN: dict[str, ModelCapabilities] = {
    "o1": _reasoning(_O_SERIES, "built-in"),
    "o3-mini": _reasoning(_O_SERIES, "built-in"),
    "o3": _reasoning(_O_SERIES, "built-in"),
    "o4-mini": _reasoning(_O_SERIES, "built-in"),
    "gpt-5": _reasoning(_GPT5, "built-in"),
    "gpt-5-mini": _reasoning(_GPT5, "built-in"),
    "gpt-5-nano": _reasoning(_GPT5, "built-in"),
    "gpt-5-pro": _reasoning(["high"], "built-in"),
    "gpt-5.1": _reasoning(["none", "low", "medium", "high"], "built-in"),
    "gpt-5.2": _reasoning(["none", "low", "medium", "high", "xhigh"], "built-in"),
    # llama-server accepts every effort value (and ignores it) and every parameter
    LLAMA_SERVER: ModelCapabilities(
        reasoning_effort=None,
        response_format=["json_schema", "json_object", "text"],
        params=list(PARAMS),
        source="built-in",
    ),
}


def lookup(
    model: str,
    provider: ProviderConfig | None = None,
    table: dict[str, ModelCapabilities] | None = None,
) -> tuple[str, ModelCapabilities] | None:
    """The entry for ``model`` (config table first, then built-ins) and its key, or None.

    Args:
        model: the model name a step sends.
        provider: the step's provider; the embedded local model falls back to the
            ``llama-server`` entry.
        table: the config's ``capabilities`` entries.
    """
    merged = {**BUILTIN, **(table or {})}
    for key in (model, _DATED.sub("", model)):
        if key in merged:
            return key, merged[key]
    local = (provider is not None and provider.kind == "openai" and provider.base_url is None
             and provider.replicas is None)
    if local and LLAMA_SERVER in merged:
        return LLAMA_SERVER, merged[LLAMA_SERVER]
    return None


def _listed(values: Iterable[str]) -> str:
    return ", ".join(values) or "none"


def check_step(
    name: str,
    step: ModelStepConfig,
    provider_name: str,
    provider: ProviderConfig,
    table: dict[str, ModelCapabilities] | None = None,
) -> None:
    """Check one LLM step on one of its providers.

    Raises:
        ConfigError: ``steps.NAME.FIELD: ...`` naming the value and the accepted ones.
    """
    if provider.api == "responses":
        for param in RESPONSES_API_LACKS:
            if getattr(step, param) is not None and getattr(step, param) != []:
                raise ConfigError(
                    f"steps.{name}.{param}: provider {provider_name!r} uses the Responses "
                    f"API, which has no {param!r} parameter; remove it from the step"
                )
    found = lookup(step.model, provider, table)
    if found is None:
        return
    key, caps = found
    whose = f"model {step.model!r}" + (f" ({key})" if key != step.model else "")
    where = f"{caps.source} capability table"
    effort = step.reasoning_effort
    if effort is not None and caps.reasoning_effort is not None:
        if effort not in caps.reasoning_effort:
            raise ConfigError(
                f"steps.{name}.reasoning_effort: {effort!r} is not accepted by {whose}; "
                f"accepted: {_listed(caps.reasoning_effort)} ({where})"
            )
    if step.json_schema is not None and caps.response_format is not None:
        if "json_schema" not in caps.response_format:
            raise ConfigError(
                f"steps.{name}.json_schema: {whose} does not take a json_schema "
                f"response_format; accepted: {_listed(caps.response_format)} ({where})"
            )
    if caps.params is not None:
        for param in PARAMS:
            value = getattr(step, param)
            if value is None or value == [] or param in caps.params:
                continue
            if param == "temperature" and value == 1:
                continue  # reasoning models take their default, 1 (TOML cannot unset a key)
            fix = "set temperature = 1, its default" if param == "temperature" else "remove it"
            raise ConfigError(
                f"steps.{name}.{param}: {whose} does not accept {param!r} (set to "
                f"{value!r}; {fix}); accepted optional parameters: {_listed(caps.params)} "
                f"({where})"
            )


def check_model_step(
    name: str,
    step: ModelStepConfig,
    targets: Iterable[str],
    providers: Mapping[str, ProviderConfig],
    table: dict[str, ModelCapabilities] | None = None,
) -> None:
    """Check a step's request settings on each provider it calls (its own and its hedge
    targets: a guard's model, effort and parameters are sent like any other step's).

    Raises:
        ConfigError: the first target whose model does not accept what the step asks
            (see :func:`check_step`).
    """
    for target in dict.fromkeys(targets):
        check_step(name, step, target, providers[target], table)


class ChainTables(Protocol):
    """What :func:`check_chain` reads of a chain's config (a
    :class:`chainrun.config.ChainConfig` is one)."""

    @property
    def order(self) -> list[str]: ...
    @property
    def steps(self) -> Mapping[str, StepConfig]: ...
    @property
    def providers(self) -> Mapping[str, ProviderConfig]: ...
    @property
    def capabilities(self) -> dict[str, ModelCapabilities]: ...


def check_chain(config: ChainTables) -> None:
    """Check every step whose config is a model step's (``llm``, ``guard``, a registered
    kind that calls a model) on its provider and its hedge targets, in ``order``.

    Raises:
        ConfigError: the first step asking a model for what it does not accept
            (see :func:`check_step`).
    """
    for name in config.order:
        step = config.steps[name]
        if isinstance(step, ModelStepConfig):
            check_model_step(name, step, step.provider_names(), config.providers,
                             config.capabilities)  # fmt: skip
