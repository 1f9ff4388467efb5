"""Chain configuration: pydantic models, the built-in default chain, and TOML loading.

A ``chainrun.toml`` overrides the built-in default *key by key* (a deep merge), so
pointing the default chain at another OpenAI-compatible server takes only::

    [providers.local]
    base_url = "http://127.0.0.1:8080/v1"

Every mistake is reported as one :class:`~chainrun.errors.ConfigError` naming the
field path and the bad value, before anything is written.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import string
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from chainrun.answer_json import check_schema
from chainrun.checks.patterns import BUILTIN_CHECKS, PatternCheck, PatternChecker
from chainrun.errors import ConfigError, FirstTokenTimeout
from chainrun.hedging.policy import HedgePolicy
from chainrun.retrieval.settings import RetrievalSettings

#: Values the OpenAI API has accepted for ``reasoning_effort`` over time (OpenAI API reference,
#: Chat Completions ``reasoning_effort``).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]

STEP_NAMES_DEFAULT = ("classify", "retrieve", "compose", "validate", "critique")
#: the default classify step's labels (a shop's message categories)
CLASSIFY_LABELS = ("sizing", "product_search", "order_status", "returns", "styling", "other")

#: Step kinds that call a model: their provider must exist and their model, effort and
#: parameters go through the capability check (:mod:`chainrun.capabilities`).
MODEL_STEP_KINDS = frozenset({"llm", "guard"})

#: Placeholders a prompt template may use; filled by the chain at run time.
PROMPT_FIELDS = frozenset({"message", "label", "products", "answer"})

_PERCENTILE_RE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderConfig(_Strict):
    """Where a step's model is served.

    ``kind = "openai"`` (the default): any OpenAI-compatible server at ``base_url``;
    ``base_url = None`` means the embedded local model: chainrun starts llama-server
    on a free loopback port on first use (see :mod:`chainrun.runtime.local_model`).
    ``kind = "azure"``: an Azure OpenAI resource at ``endpoint`` with ``api_version``
    and ``deployment`` (None: the step's ``model`` names the deployment), authenticated
    by the key in ``api_key_env`` or the Entra ID token in ``entra_token_env``.
    ``api`` picks the wire format: Chat Completions or the Responses API.
    Secrets are never stored: ``api_key_env`` / ``entra_token_env`` name the
    environment variables holding them.
    """

    kind: Literal["openai", "azure"] = "openai"
    base_url: str | None = None
    api_key_env: str | None = None
    api: Literal["chat_completions", "responses"] = "chat_completions"
    #: azure: ``https://RESOURCE.openai.azure.com``
    endpoint: str | None = None
    #: azure: the ``api-version`` query parameter, e.g. ``2024-10-21``
    api_version: str | None = None
    #: azure: the deployment name (None: the step's ``model``)
    deployment: str | None = None
    #: azure: environment variable holding an Entra ID (Azure AD) bearer token
    entra_token_env: str | None = None
    #: connect timeout in s (the step deadline bounds the rest)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    #: HTTP connections of this provider's client at most (all its pools together)
    max_connections: int = Field(default=100, ge=1)
    #: connections per pool: the client splits ``max_connections`` into pools of at most
    #: this many and sends each request to the least-loaded one, so that httpcore's
    #: per-request walk over a pool stays short with many calls in flight
    #: (:mod:`chainrun.providers.pool`; 32 = ``POOL_CONNECTIONS``)
    pool_connections: int = Field(default=32, ge=1)

    @field_validator("base_url", "endpoint")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://", v):
            raise ValueError(f"expected an http:// or https:// URL, got {v!r}")
        return v

    @model_validator(mode="after")
    def _kind_fields(self) -> ProviderConfig:
        azure_only = ("endpoint", "api_version", "deployment", "entra_token_env")
        if self.kind == "openai":
            for f in azure_only:
                if getattr(self, f) is not None:
                    raise ValueError(f"{f}: only for kind = 'azure' (this provider is 'openai')")
            return self
        if self.base_url is not None:
            raise ValueError("base_url: kind 'azure' takes endpoint (and api_version) instead")
        for f in ("endpoint", "api_version"):
            if getattr(self, f) is None:
                raise ValueError(f"{f}: required for kind = 'azure'")
        if self.api_key_env is None and self.entra_token_env is None:
            raise ValueError("kind 'azure' needs api_key_env or entra_token_env")
        if self.api_key_env is not None and self.entra_token_env is not None:
            raise ValueError(
                "api_key_env and entra_token_env are both set: give one (an API key or an "
                "Entra ID token, not both)"
            )
        return self

    def check_env(self, name: str) -> None:
        """Check that the environment variables this provider reads are set and non-empty,
        without building anything (so a missing key is said before a local model starts).

        Raises:
            ConfigError: ``providers.NAME.api_key_env`` (or ``entra_token_env``) names a
                variable that is not set, or is set to the empty string.
        """
        for field in ("api_key_env", "entra_token_env"):
            var = getattr(self, field)
            if var is None:
                continue
            value = os.environ.get(var)
            if not value:
                state = "is not set" if value is None else 'is empty (set to "")'
                raise ConfigError(f"providers.{name}.{field}: environment variable {var} {state}")


#: The optional request parameters a capability entry can allow or refuse.
CapabilityParam = Literal["temperature", "seed", "stop"]


class ModelCapabilities(_Strict):
    """One model's entry in the capability table (``[capabilities."MODEL"]``; the
    built-ins and the check are in :mod:`chainrun.capabilities`). None = not known,
    not checked.

    Attributes:
        reasoning_effort: the ``reasoning_effort`` values the model accepts.
        response_format: the ``response_format`` kinds it accepts (a step's
            ``json_schema`` needs ``json_schema``).
        params: which of the optional parameters (temperature, seed, stop) it accepts.
        source: where the entry comes from ("config" or "built-in"; shown in messages).
    """

    reasoning_effort: list[ReasoningEffort] | None = None
    response_format: list[Literal["json_schema", "json_object", "text"]] | None = None
    params: list[CapabilityParam] | None = None
    source: str = "config"


class HedgeConfig(HedgePolicy):
    """Per-step hedging policy (``[steps.NAME.hedge]``).

    The fields, defaults and checks are the engine's :class:`~chainrun.hedging.HedgePolicy`
    (one definition; see its docstring), plus ``targets`` (the providers copies go to) and
    the spelling ``delay = "pNN"`` for ``delay_percentile``: that percentile of the step's
    own recent latency window (Dean & Barroso, "The Tail at Scale", CACM 2013, suggest the
    p95, which bounds extra load near 5%), or ``delay = "auto"`` for ``delay_auto``: the
    delay and attempts re-derived from that window at run time for ``target``
    (:mod:`chainrun.hedging.advisor`). Exactly one of ``delay_ms`` and ``delay`` is set.
    ``deadline_s`` is the step's: :func:`policy_from_config` adds it.
    """

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


CheckAction = Literal["block", "redact", "off"]


class PatternConfig(_Strict):
    """A configured regex check (``[[checks.patterns]]``): Python ``re`` syntax."""

    name: str = Field(min_length=1)
    regex: str
    action: Literal["block", "redact"] = "block"
    ignore_case: bool = False

    @model_validator(mode="after")
    def _compiles(self) -> PatternConfig:
        PatternCheck.custom(self.name, self.regex, self.action, ignore_case=self.ignore_case)
        return self


class _CheckRules(_Strict):
    """The deterministic checks in force: an action per built-in check, plus patterns."""

    card: CheckAction = "block"
    iban: CheckAction = "redact"
    api_key: CheckAction = "redact"
    email: CheckAction = "off"
    phone: CheckAction = "off"
    patterns: list[PatternConfig] = Field(default_factory=list)

    def checker(self) -> PatternChecker:
        """The checks in force, built-ins first (in :data:`BUILTIN_CHECKS` order)."""
        checks = [
            PatternCheck.builtin(name, action)
            for name in BUILTIN_CHECKS
            if (action := getattr(self, name)) != "off"
        ]
        checks += [
            PatternCheck.custom(p.name, p.regex, p.action, ignore_case=p.ignore_case)
            for p in self.patterns
        ]
        return PatternChecker(checks)


class ChecksConfig(_CheckRules):
    """Deterministic checks (``[checks]``), run on the user's message before any step and
    outside every step's budget (microseconds; :mod:`chainrun.checks.patterns`).

    Per built-in check: ``"block"`` refuses the turn with no model call, ``"redact"``
    replaces the match by ``[NAME]`` in what the model sees (and in the log), ``"off"``.
    A blocked or redacted message is logged with its matches masked. A blocked turn
    answers the blocking check's text: ``block_texts[NAME]``, else the built-in one
    (:data:`~chainrun.checks.patterns.BLOCK_TEXTS`: e.g. not to share card numbers in
    chat), never the blocked content.
    """

    #: what the shopper is told when a check blocks their message, by check name (a
    #: built-in or a pattern's name); unnamed checks keep their built-in text
    block_texts: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _block_texts_name_checks(self) -> ChecksConfig:
        known = [*BUILTIN_CHECKS, *(p.name for p in self.patterns)]
        for name, text in self.block_texts.items():
            if name not in known:
                raise ValueError(
                    f"block_texts.{name}: no such check; expected one of {', '.join(known)}"
                )
            if not text.strip():
                raise ValueError(f"block_texts.{name}: expected a non-empty text")
        return self


class OutputCheckConfig(_CheckRules):
    """Checks on the answer step's stream (``[steps.ANSWER.output_check]``), run by the
    hold-back engine (:mod:`chainrun.checks.holdback`).

    The stream is checked in windows of ``window_tokens`` (c) streamed chunks; the last c
    are held back from the user until a check has covered them and what follows, so a
    flagged phrase of at most c chunks never reaches the user, even split across chunks.
    The deterministic checks (the fields of ``[checks]``, same defaults, and
    ``[[...patterns]]``) run on every window: ``block`` stops the stream (the HTTP call is
    closed) and refuses the turn with ``reject_text`` (default: the chain's refusal);
    ``redact`` shows ``[NAME]`` instead of the match. Each token reaches the user about
    c / (tokens per s) + one check later; see :func:`chainrun.checks.holdback.exposure_bound`.
    """

    #: c: streamed chunks held back (a chunk of a streamed answer is about one token)
    window_tokens: int = Field(default=8, ge=1, le=4096)
    #: what the user is told when a window is blocked (None: the chain's refusal)
    reject_text: str | None = None


class StepConfig(_Strict):
    """One step of the chain (``[steps.NAME]``).

    ``kind = "llm"`` steps call a model; ``kind = "retrieve"`` is the retrieval slot;
    other kinds are step classes registered with
    :func:`chainrun.steps.register_step_kind` (checked when the chain is built).
    ``on_failure`` says what a missing answer (error, timeout, truncation) means:
    ``"open"`` continue unchecked, ``"closed"`` refuse the turn.

    When a step starts follows from what it reads (see :mod:`chainrun.graph`);
    ``after`` adds explicit edges.
    """

    kind: str = Field(default="llm", min_length=1)
    provider: str = "local"
    model: str = "gemma-3-270m"
    prompt: str = "{message}"
    system: str | None = None
    reasoning_effort: ReasoningEffort | None = None
    #: Responses API: ask for a reasoning summary (streamed as reasoning before the text)
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = None
    #: cap on generated tokens, visible plus reasoning (sent as max_completion_tokens)
    max_output_tokens: int = Field(default=128, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    seed: int | None = None
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
    on_failure: Literal["open", "closed"] = "open"
    #: a step with side effects (placing an order) must never be hedged
    side_effects: bool = False
    hedge: HedgeConfig | None = None
    #: stop sequences (the server stops generating at any of them)
    stop: list[str] | None = None
    #: a JSON Schema the answer must follow: sent as ``response_format`` (json_schema),
    #: which llama.cpp enforces with a grammar; implies ``expect_json``
    json_schema: dict[str, Any] | None = None
    #: the answer must parse as a JSON object; a hedged step's quality gate then
    #: refuses a fast answer that does not
    expect_json: bool = False
    #: ``kind = "retrieve"`` only: searches in priority order, ``min_results`` (early exit)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    #: an LLM step with labels writes the turn's ``label``: the first of these its
    #: answer names ("other" when none)
    labels: list[str] | None = None
    #: steps that must end before this one starts, besides what it reads
    after: list[str] = Field(default_factory=list)
    #: a checking step's rejection (its JSON verdict has ``"ok": false``): ``flag`` only
    #: records it; ``refuse`` answers ``reject_text`` (default: the chain's refusal);
    #: ``replace`` answers ``reject_text`` (required) instead. With refuse or replace
    #: a streamed answer is held back from the user until this step's verdict.
    on_reject: Literal["flag", "refuse", "replace"] = "flag"
    reject_text: str | None = None
    #: ``kind = "guard"`` only, required: what a missing verdict (timeout, error,
    #: unparseable reply) means: ``open`` lets the turn through, ``closed`` refuses it
    on_missing_verdict: Literal["open", "closed"] | None = None
    #: the answer step only: checks on its stream, in held-back windows
    output_check: OutputCheckConfig | None = None
    #: settings of a custom step kind (read by its class)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("prompt", "system")
    @classmethod
    def _placeholders(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as e:
            raise ValueError(f"malformed template ({e})") from None
        unknown = names - PROMPT_FIELDS
        if unknown:
            raise ValueError(
                f"unknown placeholder {{{sorted(unknown)[0]}}}; expected one of "
                + ", ".join("{" + f + "}" for f in sorted(PROMPT_FIELDS))
            )
        return v

    @field_validator("json_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            check_schema(v)  # Draft 2020-12; a bad schema is a config error, not a bad answer
        return v

    @model_validator(mode="after")
    def _no_hedge_on_retrieve(self) -> StepConfig:
        if self.kind == "retrieve" and self.hedge is not None:
            raise ValueError(
                "hedge: a retrieve step is not hedged this way; name a fallback in "
                "retrieval.fallbacks instead"
            )
        return self

    @model_validator(mode="after")
    def _no_hedge_with_side_effects(self) -> StepConfig:
        if self.side_effects and self.hedge is not None:
            raise ValueError("a step with side_effects = true must not be hedged (remove [hedge])")
        return self

    @model_validator(mode="after")
    def _hedge_fits_deadline(self) -> StepConfig:
        problem = self.hedge.deadline_problem(self.deadline_s) if self.hedge else None
        if problem:
            raise ValueError(f"hedge: {problem}")
        return self


class GraderConfig(_Strict):
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

    provider: str = "local"
    model: str = "gemma-3-270m"
    temperature: float = Field(default=0.0, ge=0, le=0)
    seed: int = 0
    max_output_tokens: int = Field(default=60, ge=1)


class LogConfig(_Strict):
    """What the run log keeps (``[log]``)."""

    #: personal data masked in stored prompts and outputs (see :mod:`chainrun.log.redaction`)
    redact: list[Literal["card", "iban", "api_key", "email", "phone"]] = Field(default_factory=list)
    #: a turn returns only once its rows are committed (false: once they are queued for
    #: the writer thread, which commits them at once when idle; a process crash can then
    #: lose the turns finished in the last moment: README "Run log writes")
    durable_turns: bool = False


class ChainConfig(_Strict):
    """The whole chain: providers, steps and their order (and the eval grader)."""

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
    providers: dict[str, ProviderConfig]
    steps: dict[str, StepConfig]
    #: deterministic checks on the user's message, before any model call
    checks: ChecksConfig = Field(default_factory=ChecksConfig)
    #: what models accept, by model name (on top of the built-ins of chainrun.capabilities)
    capabilities: dict[str, ModelCapabilities] = Field(default_factory=dict)
    #: the ``llm-rubric`` grader of ``chainrun eval``
    grader: GraderConfig = Field(default_factory=GraderConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    #: the file the config came from (None: built in, a dict or a stored snapshot), so
    #: errors found later (the turn's graph) can name it
    _path: str | None = PrivateAttr(default=None)

    @property
    def path(self) -> str | None:
        """The config file this config was loaded from, if any."""
        return self._path

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
                f"answer_step: expected an LLM step named in order, got {self.answer_step!r}"
            )
        if (kind := self.steps[self.answer_step].kind) != "llm":
            raise ValueError(
                f"steps.{self.answer_step}.kind: the answer step must be kind = \"llm\", "
                f"got {kind!r}"
            )
        for name, step in self.steps.items():
            for dep in step.after:
                if dep not in seen or dep == name:
                    raise ValueError(
                        f"steps.{name}.after: {dep!r} is not another step in order {self.order}"
                    )
            if step.output_check is not None and (name != self.answer_step or not step.stream):
                raise ValueError(
                    f"steps.{name}.output_check: only the answer step's stream is checked "
                    f"this way (answer_step is {self.answer_step!r}; it needs stream = true)"
                )
            if step.on_reject == "replace" and not step.reject_text:
                raise ValueError(
                    f"steps.{name}.reject_text: on_reject = 'replace' needs the safe answer "
                    "to show instead"
                )
            if step.kind == "guard" and step.on_missing_verdict is None:
                raise ValueError(
                    f"steps.{name}.on_missing_verdict: required for a guard: 'open' (a turn "
                    "goes on without a verdict) or 'closed' (it is refused); no default"
                )
            if step.kind in MODEL_STEP_KINDS and step.provider not in self.providers:
                raise ValueError(
                    f"steps.{name}.provider: unknown provider {step.provider!r}; "
                    f"expected one of {sorted(self.providers)}"
                )
            if step.hedge:
                for t in step.hedge.targets:
                    if t not in self.providers:
                        raise ValueError(
                            f"steps.{name}.hedge.targets: unknown provider {t!r}; "
                            f"expected one of {sorted(self.providers)}"
                        )
        if self.grader.provider not in self.providers:
            raise ValueError(
                f"grader.provider: unknown provider {self.grader.provider!r}; "
                f"expected one of {sorted(self.providers)}"
            )
        return self

    def snapshot(self) -> str:
        """The configuration as canonical JSON (stored with every run; holds no API key)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


# The default prompts are transcripts for the model to continue: the embedded local
# model is the pre-trained Gemma 3 270M, which continues text well and follows
# instructions badly. A chat-tuned model (e.g. OpenAI's) reads them just as well.
_CLASSIFY_PROMPT = (
    "Messages sent to an online fashion shop, each with its category "
    "(sizing, product_search, order_status, returns, styling or other).\n\n"
    'Message: "Does this dress run small?"\nCategory: sizing\n\n'
    'Message: "Where is my parcel?"\nCategory: order_status\n\n'
    'Message: "{message}"\nCategory:'
)
_COMPOSE_SYSTEM = (
    "A chat between a shopper and the friendly stylist of an online fashion shop. "
    "The stylist answers in two or three sentences, recommends only products from the "
    "catalogue matches, and never invents order details."
)
_COMPOSE_PROMPT = "Catalogue matches:\n{products}\n\nShopper: {message}\nStylist:"
_VALIDATE_PROMPT = (
    "Shopper: {message}\nStylist:{answer}\n\n"
    "Review: is the stylist's reply polite, on topic and free of invented facts? "
    "Review as JSON:"
)
_CRITIQUE_PROMPT = (
    "Shopper: {message}\nStylist:{answer}\n\n"
    "One sentence on how the stylist's reply could be more helpful:"
)
_VALIDATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        # short enough that the JSON closes inside the validate step's max_output_tokens
        # (a 270M model may spend one token per character: measured on the replay set)
        "reason": {"type": "string", "maxLength": 40},
    },
    "required": ["ok", "reason"],
}

#: The built-in default chain as a plain dict (what a chainrun.toml is merged onto).
DEFAULT_CHAIN: dict[str, Any] = {
    "order": list(STEP_NAMES_DEFAULT),
    "providers": {"local": {}},
    "steps": {
        "classify": {
            "prompt": _CLASSIFY_PROMPT,
            "labels": list(CLASSIFY_LABELS),
            "stop": ["\n"],
            "max_output_tokens": 8,
            "temperature": 0.0,
            "deadline_s": 30.0,
            "on_failure": "open",
        },
        "retrieve": {"kind": "retrieve", "deadline_s": 5.0},
        "compose": {
            "system": _COMPOSE_SYSTEM,
            "prompt": _COMPOSE_PROMPT,
            "stop": ["\nShopper:", "\n\n"],
            "max_output_tokens": 120,
            "temperature": 0.7,
            "stream": True,
            "deadline_s": 60.0,
            "on_failure": "closed",
        },
        "validate": {
            "prompt": _VALIDATE_PROMPT,
            "json_schema": _VALIDATE_SCHEMA,
            "max_output_tokens": 96,
            "temperature": 0.0,
            "deadline_s": 30.0,
            "on_failure": "open",
        },
        "critique": {
            "prompt": _CRITIQUE_PROMPT,
            "stop": ["\n"],
            "max_output_tokens": 40,
            "temperature": 0.0,
            "deadline_s": 30.0,
            "on_failure": "open",
        },
    },
}


def policy_from_config(step: StepConfig) -> HedgePolicy:
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


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge ``override`` onto ``base`` key by key (tables recursively, other values replaced).

    Returns a new dict; neither input is changed.
    """
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _format_validation_error(source: str, err: ValidationError) -> str:
    first = err.errors()[0]
    path = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    value = first.get("input")
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    if "(got" in msg or "got " in msg:
        shown = ""
    return f"{source}: {path + ': ' if path else ''}{msg}{shown}"


def config_from_dict(
    data: dict[str, Any], source: str = "config", *, path: str | None = None
) -> ChainConfig:
    """Validate a config dict merged onto the default chain (``path``: the file it came
    from, recorded on the error).

    Raises:
        ConfigError: one line naming ``source``, the field path and the bad value.
    """
    merged = deep_merge(DEFAULT_CHAIN, data)
    # A built-in step the user's order leaves out is dropped (a shorter chain needs only
    # `order`); a step the user wrote but left out of order is a mistake, reported below.
    order = merged.get("order")
    user_steps = data.get("steps", {}) if isinstance(data.get("steps"), dict) else {}
    if isinstance(order, list) and isinstance(merged.get("steps"), dict):
        merged["steps"] = {
            k: v for k, v in merged["steps"].items() if k in order or k in user_steps
        }
    # a JSON Schema is one value: the user's replaces the default's whole (merged key by
    # key, its "properties" and "required" would mix with the default verdict's)
    merged_steps: dict[str, Any] = merged["steps"] if isinstance(merged.get("steps"), dict) else {}
    for name, step in user_steps.items():
        target = merged_steps.get(name)
        if isinstance(step, dict) and "json_schema" in step and isinstance(target, dict):
            target["json_schema"] = copy.deepcopy(step["json_schema"])
    try:
        config = ChainConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(source, e), path=path) from None
    config._path = path
    return config


def config_from_snapshot(snapshot: str, source: str = "run") -> ChainConfig:
    """The config a run was made with, from its stored snapshot (:meth:`ChainConfig.snapshot`).

    Raises:
        ConfigError: the snapshot is not a valid config (written by another version).
    """
    try:
        return ChainConfig.model_validate(json.loads(snapshot))
    except ValidationError as e:
        raise ConfigError(_format_validation_error(f"{source} (stored config)", e)) from None
    except ValueError as e:
        raise ConfigError(f"{source}: stored config is not JSON ({e})") from None


def load_config(path: str | Path | None = None) -> ChainConfig:
    """Load ``chainrun.toml`` (or the built-in default chain when ``path`` is None).

    When ``path`` is None and ``./chainrun.toml`` exists, that file is used.

    Raises:
        ConfigError: the file is missing, is not valid TOML, or fails validation.
    """
    if path is None:
        default = Path("chainrun.toml")
        if not default.exists():
            return config_from_dict({}, "built-in default")
        path = default
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file ({e.strerror})", path=str(p)) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file (expected UTF-8 TOML)", path=str(p)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        at = re.search(r"at line (\d+)", str(e))
        raise ConfigError(
            f"{p}: not valid TOML ({e})", path=str(p), line=int(at.group(1)) if at else None
        ) from None
    return config_from_dict(data, str(p), path=str(p))
