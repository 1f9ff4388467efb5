"""A provider's config model (``[providers.NAME]`` of chainrun.toml).

Read by :func:`chainrun.providers.open_provider`; the chain's config
(:class:`chainrun.config.ChainConfig`) holds one per name.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chainrun.errors import ConfigError
from chainrun.pricing import Price
from chainrun.providers.affinity import PromptCacheMode

#: Values the OpenAI API has accepted for ``reasoning_effort`` over time: low, medium,
#: high; then minimal (gpt-5); then none (gpt-5.1); then xhigh (gpt-5.2) (OpenAI's
#: reasoning guide and model pages).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]

#: the HTTP client of a Chat Completions provider's streams
#: (:class:`~chainrun.providers.openai_compat.OpenAICompatProvider`)
Transport = Literal["httpx", "aiohttp"]

#: the transport a provider uses unless told (benchmarks/README.md, "CPU per streamed
#: call by transport")
DEFAULT_TRANSPORT: Transport = "aiohttp"


def http_url(v: str | None) -> str | None:
    """``v`` unchanged when it is None or an ``http://``/``https://`` URL (the check every
    config URL gets: providers, URL tools).

    Raises:
        ValueError: anything else (pydantic turns it into the field's config error).
    """
    if v is not None and not re.match(r"^https?://", v):
        raise ValueError(f"expected an http:// or https:// URL, got {v!r}")
    return v


class ProviderConfig(BaseModel):
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

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: ``openai`` (any OpenAI-compatible server) or ``azure`` (Azure OpenAI)
    kind: Literal["openai", "azure"] = "openai"
    #: the server's base URL, e.g. ``http://127.0.0.1:8080/v1`` (None: the embedded local model)
    base_url: str | None = None
    #: environment variable holding the API key (never the key itself)
    api_key_env: str | None = None
    #: the wire format: Chat Completions or the Responses API
    api: Literal["chat_completions", "responses"] = "chat_completions"
    #: azure: ``https://RESOURCE.openai.azure.com``
    endpoint: str | None = None
    #: azure: the ``api-version`` query parameter, e.g. ``2024-10-21``
    api_version: str | None = None
    #: azure: the deployment name (None: the step's ``model``)
    deployment: str | None = None
    #: azure: environment variable holding an Entra ID (Azure AD) bearer token
    entra_token_env: str | None = None
    #: where the server puts a reasoning model's thought: ``auto`` splits an answer that
    #: begins with ``<think>`` (MiniMax, llama-server's ``reasoning_format: none``);
    #: ``think_tags``: everything before the first ``</think>`` is the thought, opener or
    #: not, and the step's stops apply to the answer only; ``off``: content is the answer
    #: (:mod:`chainrun.providers.think`)
    reasoning_in_content: Literal["auto", "think_tags", "off"] = "auto"
    #: connect timeout in s (the step deadline bounds the rest)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    #: the HTTP client of the Chat Completions streams: ``aiohttp`` (chainrun's request
    #: on an aiohttp session, its errors mapped by chainrun; about 0.6x the CPU a call)
    #: or ``httpx`` (the ``openai`` client's request path on httpx2 and chainrun's
    #: pools); the Responses API and the startup check always use httpx
    #: (:mod:`chainrun.providers.aiohttp_transport`)
    transport: Transport = DEFAULT_TRANSPORT
    #: HTTP connections of this provider's client at most (all its pools together)
    max_connections: int = Field(default=100, ge=1)
    #: connections per pool (transport ``httpx``, the startup check and the Responses
    #: API): the client splits ``max_connections`` into pools of at most
    #: this many and sends each request to the least-loaded one, so that httpcore's
    #: per-request walk over a pool stays short with many calls in flight
    #: (:mod:`chainrun.providers.pool`; 32 = ``POOL_CONNECTIONS``)
    pool_connections: int = Field(default=32, ge=1)
    #: llama-server's per-request prompt cache switch, sent with every Chat Completions
    #: request when set: false = the server neither reuses nor keeps a cached prompt
    #: prefix (every TTFT includes the whole prompt). None = not sent (the server
    #: decides). OpenAI and Azure cache prefixes of 1,024+ tokens on their own and refuse
    #: unknown parameters: leave it None for them (``chainrun replay --prompt-cache off``
    #: sets it for the run's Chat Completions providers)
    cache_prompt: bool | None = None
    #: whether the server takes llama.cpp's sampler fields (a step's ``sampling``:
    #: ``repeat_penalty``, the DRY sampler...) in the request body: true for a
    #: llama-server; None = only the embedded local model (OpenAI and Azure refuse
    #: unknown fields with HTTP 400, so a step's ``sampling`` is not sent to them)
    sampling_fields: bool | None = None
    #: prompt-cache affinity, how a conversation is kept on the cache holding its
    #: earlier prompts (chainrun.providers.affinity): ``key`` sends ``prompt_cache_key``
    #: (OpenAI, Azure); ``slot``: on a llama-server, the conversation's answer step keeps
    #: one slot (``id_slot``) and the other steps go to other slots; ``off``: neither;
    #: ``auto``: ``slot`` for the embedded local model, ``key`` for Azure and
    #: api.openai.com, ``off`` for any other server
    prompt_cache: PromptCacheMode = "auto"
    #: the ``prompt_cache_key`` sent in mode ``key`` (None: the turn's conversation id)
    prompt_cache_key: str | None = Field(default=None, min_length=1, max_length=1024)
    #: the llama-server's slot count for mode ``slot`` (None: its ``GET /props``
    #: ``total_slots``, read when the provider starts)
    slots: int | None = Field(default=None, ge=1, le=1024)
    #: the price of every model this provider serves, USD per million tokens (input,
    #: cached_input, output); None: by model (``[prices]``, then the shipped table)
    price: Price | None = None
    #: requests per minute this process sends the provider at most (None: no limit): a
    #: call's first attempt waits for room within its step's deadline, a hedge copy is
    #: not sent without room (chainrun.providers.rate_limit); per process: with N
    #: processes sharing the provider's quota of R, give each R/N
    requests_per_minute: int | None = Field(default=None, ge=1)
    #: replicas of one model server, each an OpenAI-compatible base URL (``base_url``
    #: then unset): every call goes to one of them, as ``replica_policy`` says
    #: (:mod:`chainrun.providers.replicas`); each replica gets this table's other
    #: settings (``prompt_cache = "slot"``: a slot table per replica)
    replicas: list[str] | None = Field(default=None, min_length=1, max_length=64)
    #: how a call's replica is picked: ``affinity`` (a conversation's calls on one
    #: replica by rendezvous hashing, the same in every process; a hedge copy on the
    #: next), ``round_robin`` or ``random``
    replica_policy: Literal["affinity", "round_robin", "random"] = "affinity"
    #: tokens per minute at most (None: no limit), a request counted as its prompt's
    #: estimated tokens plus its max_tokens until the usage it reports comes back
    tokens_per_minute: int | None = Field(default=None, ge=1)

    @field_validator("base_url", "endpoint")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return http_url(v)

    @field_validator("replicas")
    @classmethod
    def _replica_urls(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            for i, url in enumerate(v):
                try:
                    http_url(url)
                except ValueError as e:
                    raise ValueError(f"replicas[{i}]: {e}") from None
            if len(set(v)) != len(v):
                raise ValueError("replicas: a URL is listed twice")
        return v

    @model_validator(mode="after")
    def _kind_fields(self) -> ProviderConfig:
        if self.replicas is not None:
            if self.kind != "openai" or self.api != "chat_completions":
                raise ValueError("replicas: only for kind 'openai' with api 'chat_completions'")
            if self.base_url is not None:
                raise ValueError("replicas and base_url are both set: give one")
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


__all__ = ["DEFAULT_TRANSPORT", "ProviderConfig", "ReasoningEffort", "Transport"]
