"""The keys every model-calling step kind takes, and its ``[hedge]`` table.

:class:`ModelStepConfig` extends :class:`~chainrun.steps.config.StepConfig` with the
request (provider, model, templates, sampling, stop, JSON Schema), the step's deadline
and stream timers, and hedging. The ``llm`` and ``guard`` kinds extend it
(:class:`~chainrun.steps.llm.LLMConfig`, :class:`~chainrun.steps.guard.GuardConfig`);
so may a registered kind that calls a model. :func:`policy_from_config` is the one place
a step's config becomes the hedging engine's policy.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from chainrun.answer_json import check_schema
from chainrun.errors import FirstTokenTimeout
from chainrun.hedging.policy import HedgePolicy
from chainrun.providers.config import ReasoningEffort
from chainrun.steps.config import StepConfig

#: JSON Schemas (canonical JSON) already checked valid against the metaschema
_CHECKED_SCHEMAS: set[str] = set()

_PERCENTILE_RE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")

#: The llama.cpp server's per-request sampler fields a step's ``sampling`` may set
#: (llama.cpp tools/server/README.md, "POST /completion" options, which its
#: OpenAI-compatible route also reads): repetition penalty over the last n tokens, the
#: DRY ("don't repeat yourself") sampler's multiplier, base, allowed length and window,
#: top-k and min-p.
SAMPLING_FIELDS = (
    "repeat_penalty", "repeat_last_n", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "top_k", "min_p",
)  # fmt: skip

class HedgeConfig(HedgePolicy):
    """Per-step hedging policy (``[steps.NAME.hedge]``).

    The fields, defaults and checks are the engine's :class:`~chainrun.hedging.HedgePolicy`
    (one definition; see its docstring), plus ``targets`` (the providers copies go to) and
    the spelling ``delay = "pNN"`` for ``delay_percentile``: that percentile of the step's
    own recent latency window (Dean & Barroso, "The Tail at Scale", CACM 2013, suggest the
    p95, which bounds extra load near 5%), or ``delay = "auto"`` for ``delay_auto``: the
    delay and attempts re-derived from that window at run time for ``target``
    (:mod:`chainrun.hedging.advisor`). Exactly one of ``delay_ms`` and ``delay`` is set.
    ``deadline_s`` is the step's: :func:`policy_from_config` adds it. A table dumps to its
    keys only (:attr:`not_config_keys` left out, and ``target`` unless ``delay = "auto"``),
    so a stored config validates again.
    """

    #: HedgePolicy fields that are not ``[hedge]`` keys: the step's ``deadline_s`` (added
    #: by :func:`policy_from_config`), ``delay_percentile`` (spelled ``delay = "pNN"``)
    #: and ``delay_auto`` (spelled ``delay = "auto"``)
    not_config_keys: ClassVar[frozenset[str]] = frozenset(
        {"deadline_s", "delay_percentile", "delay_auto"}
    )

    #: the hedge delay as a percentile of the step's latency window, e.g. "p95"
    delay: str | None = None
    #: provider names copies rotate over; empty = copies go to the step's own provider
    targets: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, hint in (
            ("deadline_s", "set deadline_s on the step ([steps.NAME] deadline_s)"),
            ("delay_percentile", "write delay = 'p95'"),
            ("delay_auto", "write delay = 'auto'"),
        ):
            if key in data:
                raise ValueError(f"{key} is not a [hedge] key: {hint}")
        delay = data.get("delay")
        if delay is not None and data.get("delay_ms") is not None:
            # said here, in the config's words (the engine's check names delay_percentile)
            raise ValueError("set exactly one of delay_ms or delay (e.g. delay = 'p95')")
        if delay == "auto":
            return {**data, "delay_auto": True}
        m = _PERCENTILE_RE.match(delay) if isinstance(delay, str) else None
        if m is None:
            return data  # a bad `delay` is reported by _percentile, with its path
        return {**data, "delay_percentile": float(m.group(1))}

    @field_validator("delay")
    @classmethod
    def _percentile(cls, v: str | None) -> str | None:
        if v is None or v == "auto":
            return v
        m = _PERCENTILE_RE.match(v)
        if not m or not 0 < float(m.group(1)) < 100:
            raise ValueError(f"expected a percentile such as 'p95', or 'auto', got {v!r}")
        return v

    @model_validator(mode="after")
    def _one_delay(self) -> HedgeConfig:
        if (self.delay_ms is None) == (self.delay is None):
            raise ValueError("set exactly one of delay_ms or delay (e.g. delay = 'p95')")
        if self.delay != "auto" and "target" in self.model_fields_set:
            raise ValueError("target applies to delay = 'auto' only (the advisor's objective)")
        if self.max_attempts < 2:
            # max_attempts counts the original: 1 leaves no room for a copy
            raise ValueError(
                "max_attempts: a hedge needs at least 2 (the original plus one copy); "
                "with 1 it can never fire: remove the [hedge] table for one attempt"
            )
        return self

    @model_serializer(mode="wrap")
    def _keys_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in self.not_config_keys:
            data.pop(key, None)
        if self.delay != "auto":
            data.pop("target", None)  # the advisor's objective: a key of delay = "auto" only
        if isinstance(data.get("non_fatal"), list | tuple | set | frozenset):
            data["non_fatal"] = sorted(data["non_fatal"], key=str)  # a set: stored sorted
        return data


class ModelStepConfig(StepConfig):
    """The keys of every step that calls a model (``llm``, ``guard``, a registered kind
    that calls one): its request, deadline, stream timers and ``[hedge]``."""

    #: the provider (a ``[providers.NAME]``) serving the step's model
    provider: str = "local"
    #: the model name sent in the request
    model: str = "gemma-3-270m"
    #: the user message template; ``{placeholders}`` are turn-state fields
    prompt: str = "{message}"
    #: the system message template (None: no system message)
    system: str | None = None
    #: how a prompt that begins with ``{history}`` shows the earlier turns: ``transcript``
    #: (their text inside the user message, for completion-style models such as the
    #: embedded one), ``messages`` (as role messages before it: each turn's user message,
    #: its tool calls with their results, and the answer, as chat models read a
    #: conversation); ``auto``: ``messages`` on Azure and api.openai.com, else
    #: ``transcript`` (the step's provider)
    history_layout: Literal["auto", "transcript", "messages"] = "auto"
    #: sent as ``reasoning_effort`` (None: not sent)
    reasoning_effort: ReasoningEffort | None = None
    #: Responses API: ask for a reasoning summary (streamed as reasoning before the text)
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = None
    #: cap on generated tokens, visible plus reasoning (sent as max_completion_tokens)
    max_output_tokens: int = Field(default=128, ge=1)
    #: an answer cut by the token cap (finish reason ``length``): ``answer`` keeps it (the
    #: cut is shown in the step and turn rows), ``fail`` fails the step (error_type
    #: ``length``; its ``on_failure`` decides)
    on_truncated: Literal["answer", "fail"] = "answer"
    #: sampling temperature (None: the server's default)
    temperature: float | None = Field(default=None, ge=0, le=2)
    #: sampling seed (None: not sent)
    seed: int | None = None
    #: llama.cpp server sampler settings sent with the step's requests (keys of
    #: :data:`SAMPLING_FIELDS`: repetition penalties, the DRY sampler, top-k, min-p);
    #: only a provider that serves them gets them ([providers.NAME] sampling_fields)
    sampling: dict[str, float] | None = None
    #: stream the answer to the user as it is generated (the answer step)
    stream: bool = False
    #: deadline for the whole step (all attempts), in s
    deadline_s: float = Field(default=60.0, gt=0)
    #: per attempt: no first content/reasoning token within this many s (counted from the
    #: request, so a server that never sends headers is caught) abandons the attempt as
    #: ``first_token_timeout``; a hedged step then starts its next copy at once. None = off
    first_token_timeout_s: float | None = Field(default=None, gt=0)
    #: per attempt, after the first token: a gap between chunks longer than this many s
    #: abandons the attempt as ``idle_timeout``. None = off
    idle_timeout_s: float | None = Field(default=None, gt=0)
    #: a step with side effects (placing an order) must never be hedged
    side_effects: bool = False
    #: hedged requests: copies after a delay (None: one attempt)
    hedge: HedgeConfig | None = None
    #: stop sequences (the server stops generating at any of them)
    stop: list[str] | None = None
    #: a JSON Schema the answer must follow: sent as ``response_format`` (json_schema),
    #: which llama.cpp enforces with a grammar; implies ``expect_json``
    json_schema: dict[str, Any] | None = None
    #: the answer must parse as a JSON object; a hedged step's quality gate then
    #: refuses a fast answer that does not
    expect_json: bool = False

    @field_validator("sampling")
    @classmethod
    def _sampling(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key in v or {}:
            if key not in SAMPLING_FIELDS:
                raise ValueError(f"{key!r} is not a llama.cpp server sampler field (one of "
                                 f"{', '.join(SAMPLING_FIELDS)})")  # fmt: skip
        return v

    @field_validator("prompt", "system")
    @classmethod
    def _well_formed(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                list(string.Formatter().parse(v))
            except ValueError as e:
                raise ValueError(f"malformed template ({e})") from None
        return v

    @field_validator("json_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        try:
            key = json.dumps(v, sort_keys=True)
        except (TypeError, ValueError):
            key = None
        if key is None or key not in _CHECKED_SCHEMAS:
            # Draft 2020-12; a bad schema is a config error, not a bad answer. Checking
            # against the metaschema takes ~10 ms: a schema seen valid is not checked again
            check_schema(v)
            if key is not None:
                if len(_CHECKED_SCHEMAS) >= 256:
                    _CHECKED_SCHEMAS.clear()
                _CHECKED_SCHEMAS.add(key)
        return v

    @model_validator(mode="after")
    def _no_hedge_with_side_effects(self) -> ModelStepConfig:
        if self.side_effects and self.hedge is not None:
            raise ValueError("a step with side_effects = true must not be hedged (remove [hedge])")
        return self

    @model_validator(mode="after")
    def _hedge_fits_deadline(self) -> ModelStepConfig:
        problem = self.hedge.deadline_problem(self.deadline_s) if self.hedge else None
        if problem:
            raise ValueError(f"hedge: {problem}")
        return self

    def provider_refs(self) -> dict[str, list[str]]:
        """``provider`` and ``hedge.targets``."""
        refs = {"provider": [self.provider]}
        if self.hedge is not None:
            refs["hedge.targets"] = list(self.hedge.targets)
        return refs

    def templates(self) -> dict[str, str]:
        """``prompt`` and ``system`` (when set)."""
        out = {"prompt": self.prompt}
        if self.system is not None:
            out["system"] = self.system
        return out


def template_fields(*templates: str | None) -> frozenset[str]:
    """The ``{placeholders}`` the templates use."""
    names: set[str] = set()
    for t in templates:
        if t:
            names.update(f for _, f, _, _ in string.Formatter().parse(t) if f)
    return frozenset(names)


def policy_from_config(step: ModelStepConfig) -> HedgePolicy:
    """The hedging engine's policy for a step: its ``[hedge]`` table with the step's
    ``deadline_s``, or one attempt inside the deadline when the step has no ``[hedge]``.

    The only place config becomes engine policy (the table *is* a
    :class:`~chainrun.hedging.HedgePolicy`, validated when the config was loaded).
    """
    if step.hedge is None:
        return HedgePolicy(deadline_s=step.deadline_s, max_attempts=1)
    policy = step.hedge.for_deadline(step.deadline_s)
    if step.first_token_timeout_s is None:
        return policy
    # a first-token timeout is silence, not an error: it starts the next copy at once
    return policy.model_copy(update={"non_fatal": policy.non_fatal | {FirstTokenTimeout.status}})


__all__ = ["HedgeConfig", "ModelStepConfig", "policy_from_config", "template_fields"]
