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
from collections.abc import Iterable

from chainrun.config import (
    MODEL_STEP_KINDS,
    CapabilityParam,
    ChainConfig,
    ModelCapabilities,
    ProviderConfig,
    ReasoningEffort,
    StepConfig,
)
from chainrun.errors import ConfigError

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
    local = provider is not None and provider.kind == "openai" and provider.base_url is None
    if local and LLAMA_SERVER in merged:
        return LLAMA_SERVER, merged[LLAMA_SERVER]
    return None


def _listed(values: Iterable[str]) -> str:
    return ", ".join(values) or "none"


def check_step(
    name: str,
    step: StepConfig,
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


def check_chain(config: ChainConfig) -> None:
    """Check every step that calls a model (``llm`` and ``guard`` steps: a guard's model,
    effort and parameters are sent like any other) on its provider and its hedge targets.

    Raises:
        ConfigError: the first step asking a model for what it does not accept
            (see :func:`check_step`).
    """
    for name in config.order:
        step = config.steps[name]
        if step.kind not in MODEL_STEP_KINDS:
            continue
        targets = [step.provider, *(step.hedge.targets if step.hedge else [])]
        for target in dict.fromkeys(targets):
            check_step(name, step, target, config.providers[target], config.capabilities)
