"""The chain's config model: providers, steps (each validated by its kind's model), order.

``[steps.NAME]`` tables are validated through a union of the registered kinds' config
models discriminated on ``kind`` (:func:`step_config_adapter`): the built-in kinds'
(:mod:`chainrun.steps`) and those of every kind registered with
:func:`chainrun.steps.register_step_kind` (in a module the config names in ``plugins``,
or imported by the caller). A key the kind's model does not take is one error naming
the key, the step and the kind.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union

from pydantic import (
    Discriminator,
    Field,
    PrivateAttr,
    SerializeAsAny,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from chainrun.checks.config import ChecksConfig
from chainrun.config.capabilities import ModelCapabilities
from chainrun.config.defaults import STEP_NAMES_DEFAULT
from chainrun.conversations.history import HistorySettings
from chainrun.conversations.memory import OUTAGE_WAIT_S
from chainrun.pricing import Price
from chainrun.providers.config import ProviderConfig
from chainrun.steps import StateField, known_fields, step_kinds
from chainrun.steps.config import StepConfig, Strict
from chainrun.steps.model_config import ModelStepConfig, template_fields
from chainrun.tools.spec import ToolConfig, check_tool_name

#: The kind of a step table that names none.
DEFAULT_KIND = "llm"


class GraderConfig(Strict):
    """The ``llm-rubric`` grader (``[grader]`` in chainrun.toml), stored with every verdict.

    ``provider`` names one of ``[providers]``; the default is the embedded local model,
    a *pre-trained* 270M model that seldom answers in a form the scorer can read (its
    rubric assertions are then skipped, with that reason): point it at a chat model::

        [grader]
        provider = "openai"
        model = "gpt-5-mini"

    The grading call itself is whatever async ``grade(prompt) -> str`` the caller
    injects; it must be built from this configuration (temperature 0 and a fixed seed so
    that re-grading the same answer gives the same verdict where the server honours seeds).
    """

    #: the provider (a ``[providers.NAME]``) serving the grader
    provider: str = "local"
    #: the grader's model name
    model: str = "gemma-3-270m"
    #: sampling temperature (0: the same answer grades the same)
    temperature: float = Field(default=0.0, ge=0, le=0)
    #: sampling seed (fixed, for servers that honour seeds)
    seed: int = 0
    #: cap on the grader's generated tokens
    max_output_tokens: int = Field(default=60, ge=1)


class LogConfig(Strict):
    """What the run log keeps (``[log]``)."""

    #: personal data masked in stored prompts and outputs (see :mod:`chainrun.log.redaction`)
    redact: list[Literal["card", "iban", "api_key", "email", "phone"]] = Field(default_factory=list)
    #: a turn returns only once its rows are committed (false: once they are queued for
    #: the writer thread, which commits them at once when idle; a process crash can then
    #: lose the turns finished in the last moment: [Run log writes and what a crash can
    #: lose](../guides/reliability.md#run-log-writes-and-what-a-crash-can-lose))
    durable_turns: bool = False
    #: how long a turn on a log several processes share (PostgreSQL) waits out an
    #: outage of the log (a pooler's restart, a reset connection) for its turn index and
    #: earlier turns, counted from the outage's start, before it goes on from this
    #: process's memory (its index may then repeat one another process gave, its
    #: history miss their turns); 0: go on from memory at once
    outage_wait_s: float = Field(default=OUTAGE_WAIT_S, ge=0, le=60)


def _kind_of(value: Any) -> str | None:
    if isinstance(value, dict):
        kind = value.get("kind", DEFAULT_KIND)
        return kind if isinstance(kind, str) else None
    return getattr(value, "kind", None)


_adapters: dict[tuple[tuple[str, type[StepConfig]], ...], TypeAdapter[dict[str, StepConfig]]] = {}


def step_config_models() -> dict[str, type[StepConfig]]:
    """Every registered kind's config model, by kind (the members of the union)."""
    return {kind: cls.config_model for kind, cls in sorted(step_kinds().items())}


def step_config_adapter() -> TypeAdapter[dict[str, StepConfig]]:
    """A validator of ``{name: step table}`` through the union of the registered kinds'
    config models, discriminated on ``kind`` (a missing ``kind`` is ``llm``). Built again
    when a kind has been registered since."""
    models = tuple(step_config_models().items())
    adapter = _adapters.get(models)
    if adapter is None:
        members = tuple(Annotated[model, Tag(kind)] for kind, model in models)
        union = Annotated[Union[members], Discriminator(_kind_of)]  # type: ignore[valid-type]  # noqa: UP007
        adapter = _adapters[models] = TypeAdapter(dict[str, union])
    return adapter


def steps_calling_models(steps: Any) -> frozenset[str]:
    """The names of the step tables (a stored config's ``steps``) whose kind's config
    model is a model step's (:class:`~chainrun.steps.ModelStepConfig`: ``llm``,
    ``guard``, a registered kind built on it). A table of a kind not registered in this
    process is left out."""
    if not isinstance(steps, dict):
        return frozenset()
    models = step_config_models()
    out = set()
    for name, table in steps.items():
        model = models.get(_kind_of(table) or "") if isinstance(table, dict) else None
        if model is not None and issubclass(model, ModelStepConfig):
            out.add(name)
    return frozenset(out)


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the name of ``known`` closest to ``name``
    (:func:`difflib.get_close_matches`, its default cutoff 0.6), else ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown_kind(name: str, kind: Any, answer_step: str | None) -> InitErrorDetails:
    kinds = sorted(step_kinds())
    close = difflib.get_close_matches(kind, kinds, n=1) if isinstance(kind, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    what = f"unknown step kind {kind!r}{hint}"
    if name == answer_step:
        what = f"the answer step needs a kind that answers; {what}"
    msg = (
        f"{what}; expected one of {', '.join(kinds)}, or a kind registered with "
        "chainrun.steps.register_step_kind in a module named in plugins"
    )
    return InitErrorDetails(
        type=PydanticCustomError("unknown_kind", msg), loc=(name, "kind"), input=kind
    )


def _key_not_taken(name: str, kind: str, key: str, value: Any) -> InitErrorDetails:
    model = step_config_models()[kind]
    keys = sorted(model.model_fields)
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"its keys: {', '.join(keys)}"
    msg = f"a step of kind {kind!r} takes no key {key!r} ({hint})"
    return InitErrorDetails(
        type=PydanticCustomError("key_not_taken", msg), loc=(name, key), input=value
    )


class ChainConfig(Strict):
    """The whole chain: providers, steps and their order (and the eval grader)."""

    #: the steps of a turn, in display order (and the tie-break between ready steps)
    order: list[str] = Field(default_factory=lambda: list(STEP_NAMES_DEFAULT))
    #: the step whose output is the turn's answer (streamed to the user)
    answer_step: str = "compose"
    #: when steps off the answer's critical path start (steps the answer step does not
    #: wait for, that do not wait for it and that cannot end the turn: in the default
    #: chain, classify). ``"after_answer"``: once the answer is complete, so they do not
    #: share a compute-bound model server with the answer's prefill (measured on the
    #: embedded model: benchmarks/README.md). ``"when_ready"``: as soon as their
    #: inputs exist, for capacity the answer does not share (remote APIs, other servers).
    off_path_steps: Literal["after_answer", "when_ready"] = "after_answer"
    #: Python modules imported before the config is validated, e.g. ones that register
    #: step kinds (``chainrun.steps.register_step_kind``): a module name, or
    #: ``module:function`` to also call that function (an entry point's object reference)
    plugins: list[str] = Field(default_factory=list)
    #: where models are served, by provider name
    providers: dict[str, ProviderConfig]
    #: the steps by name, each validated by its kind's config model
    steps: dict[str, SerializeAsAny[StepConfig]]
    #: deterministic checks on the user's message, before any model call
    checks: ChecksConfig = Field(default_factory=ChecksConfig)
    #: what models accept, by model name (on top of the built-ins of chainrun.config.capabilities)
    capabilities: dict[str, ModelCapabilities] = Field(default_factory=dict)
    #: the ``llm-rubric`` grader of ``chainrun eval``
    grader: GraderConfig = Field(default_factory=lambda: GraderConfig())
    #: what the run log keeps
    log: LogConfig = Field(default_factory=lambda: LogConfig())
    #: tools the steps' models may call, by name (``[tools.NAME]``)
    tools: dict[str, ToolConfig] = Field(default_factory=dict)
    #: the earlier turns prompts see as ``{history}``: how many, and how many tokens
    history: HistorySettings = Field(default_factory=HistorySettings)
    #: prices by model name, USD per million tokens (input, cached_input, output), over
    #: the shipped table (chainrun/data/prices.toml; chainrun.pricing)
    prices: dict[str, Price] = Field(default_factory=dict)
    #: the file the config came from (None: built in, a dict or a stored snapshot), so
    #: errors found later (the turn's graph) can name it
    _path: str | None = PrivateAttr(default=None)

    @property
    def path(self) -> str | None:
        """The config file this config was loaded from, if any."""
        return self._path

    def loaded_from(self, path: str | None) -> None:
        """Record the config file this config was read from (:attr:`path`; the model is
        frozen, its fields unchanged)."""
        self._path = path

    @field_validator("steps", mode="wrap")
    @classmethod
    def _by_kind(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        """Each table through its kind's model (the union discriminated on ``kind``)."""
        if not isinstance(value, dict):
            return handler(value)
        kinds = step_kinds()
        answer_step = info.data.get("answer_step")
        unknown = [
            _unknown_kind(name, _kind_of(table), answer_step)
            for name, table in value.items()
            if _kind_of(table) not in kinds
        ]
        if unknown:
            raise ValidationError.from_exception_data("steps", unknown[:1])
        try:
            validated = step_config_adapter().validate_python(value)
        except ValidationError as e:
            raise ValidationError.from_exception_data(
                "steps", [_step_error(value, err) for err in e.errors()]
            ) from None
        return handler(validated)

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, v: dict[str, ToolConfig]) -> dict[str, ToolConfig]:
        for name in v:
            check_tool_name(name)
        return v

    @model_validator(mode="after")
    def _references(self) -> ChainConfig:
        if not self.order:
            raise ValueError("order: expected at least one step")
        seen: set[str] = set()
        for name in self.order:
            if name not in self.steps:
                raise ValueError(f"order names step {name!r} which has no [steps.{name}] table")
            if name in seen:
                raise ValueError(f"order: step {name!r} appears twice")
            seen.add(name)
        for name in self.steps:
            if name not in seen:
                close = difflib.get_close_matches(name, self.order, n=1)
                hint = f" (did you mean [steps.{close[0]}]?)" if close else ""
                raise ValueError(
                    f"steps.{name}: step is not in order {self.order}{hint}; "
                    "add it to order or remove the table"
                )
        if self.answer_step not in seen:
            raise ValueError(
                f"answer_step: expected a step named in order, got {self.answer_step!r}"
            )
        answer = self.steps[self.answer_step]
        if not answer.answers:
            raise ValueError(
                f"steps.{self.answer_step}.kind: the answer step needs a kind that answers "
                f"(e.g. \"llm\"); kind {answer.kind!r} does not"
            )
        if answer.when is not None:
            raise ValueError(
                f"steps.{self.answer_step}.when: the answer step always runs; route the "
                "steps before it instead"
            )
        fields = known_fields()
        for step in self.steps.values():  # fields a step's settings add (named by a key)
            fields.update({n: StateField(n, "") for n in step.added_fields() if n not in fields})
        for name, step in self.steps.items():
            self._check_step(name, step, seen, fields)
        self._check_labels()
        if self.grader.provider not in self.providers:
            raise ValueError(
                f"grader.provider: unknown provider {self.grader.provider!r}"
                f"{did_you_mean(self.grader.provider, sorted(self.providers))}; "
                f"expected one of {sorted(self.providers)}"
            )
        return self

    def _check_labels(self) -> None:
        """Every label a step's ``tools_by_label`` names is one a step of the chain gives
        (its ``labels``): a label no step gives would never offer its tools. Not
        checked when no step names its labels (a step kind that gives ``label`` some
        other way)."""
        given = [lab for step in self.steps.values() for lab in (getattr(step, "labels", None)
                                                                  or [])]  # fmt: skip
        if not given:
            return
        for name, step in self.steps.items():
            for label in getattr(step, "tools_by_label", None) or {}:
                if label not in given:
                    raise ValueError(
                        f"steps.{name}.tools_by_label.{label}: no step gives the label "
                        f"{label!r}{did_you_mean(label, given)}; the labels: "
                        + ", ".join(dict.fromkeys(given))
                    )

    def _check_step(
        self, name: str, step: StepConfig, seen: set[str], fields: dict[str, StateField]
    ) -> None:
        for dep in step.after:
            if dep not in seen or dep == name:
                others = [n for n in self.order if n != name]
                raise ValueError(
                    f"steps.{name}.after: {dep!r} is not another step in order {self.order}"
                    + did_you_mean(dep, others)
                )
        for key, names in step.provider_refs().items():
            for provider in names:
                if provider not in self.providers:
                    raise ValueError(
                        f"steps.{name}.{key}: unknown provider {provider!r}"
                        f"{did_you_mean(provider, sorted(self.providers))}; "
                        f"expected one of {sorted(self.providers)}"
                    )
        expected = ", ".join("{" + f + "}" for f in sorted(fields))
        for key, template in step.templates().items():
            unknown = sorted(template_fields(template) - set(fields))
            if unknown:
                raise ValueError(
                    f"steps.{name}.{key}: unknown placeholder {{{unknown[0]}}}; "
                    f"expected one of {expected}"
                )
        for field in sorted(step.route_fields() - set(fields)):
            raise ValueError(
                f"steps.{name}.when.{field}: not a turn-state field; expected one of "
                + ", ".join(sorted(fields))
            )
        for tool in step.tool_refs():
            if tool not in self.tools:
                known = ", ".join(sorted(self.tools)) or "none configured"
                hint = did_you_mean(tool, sorted(self.tools))
                raise ValueError(f"steps.{name}.tools: unknown tool {tool!r}{hint} (tools: "
                                 f"{known})")  # fmt: skip
        problem = step.chain_problem(name, self.answer_step)
        if problem is not None:
            raise ValueError(f"steps.{name}.{problem}")

    def snapshot(self) -> str:
        """The configuration as canonical JSON (stored with every run; holds no API key).
        :func:`chainrun.config.config_from_snapshot` gives the same config back."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


def _step_error(tables: dict[str, Any], err: Any) -> InitErrorDetails:
    """One error of the union, located as ``NAME.KEY...`` (the union's tag dropped) and,
    for a key the kind does not take, said in the config's words."""
    loc = tuple(err["loc"])
    name = str(loc[0]) if loc else ""
    rest = loc[2:]  # (name, tag, *path): the tag is the kind
    kind = _kind_of(tables.get(name))
    if err["type"] == "extra_forbidden" and len(rest) == 1 and isinstance(kind, str):
        return _key_not_taken(name, kind, str(rest[0]), err.get("input"))
    msg = str(err["msg"]).removeprefix("Value error, ")
    return InitErrorDetails(
        type=PydanticCustomError(err["type"], msg), loc=(name, *rest), input=err.get("input")
    )


__all__ = [
    "ChainConfig",
    "GraderConfig",
    "LogConfig",
    "step_config_adapter",
    "step_config_models",
    "steps_calling_models",
]
