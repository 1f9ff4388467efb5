"""The one place a configured provider is built: :func:`open_provider`.

Used by the chain, the eval grader and anything else that needs a model behind a
``[providers.NAME]`` table, so that every caller gets the same thing: the local model
started when ``base_url`` is None, the configured pool size and connect timeout, the
wire format ``api`` asks for (Chat Completions or the Responses API), the Chat
Completions streams' ``transport``, Azure when ``kind = "azure"``, and the preflight
check that fails fast on an unreachable server.
"""

from __future__ import annotations

import asyncio
import threading

from chainrun.providers.affinity import SlotTable, resolve_mode
from chainrun.providers.base import Provider
from chainrun.providers.config import ProviderConfig
from chainrun.providers.openai_client import AzureTarget, read_api_key
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.providers.replicas import ReplicaPool
from chainrun.providers.responses import ResponsesProvider
from chainrun.runtime import local_model


async def open_provider(name: str, cfg: ProviderConfig, *, quiet: bool = False) -> Provider:
    """Build, check and return the provider ``[providers.NAME]`` describes.

    Args:
        name: the provider's name in the config (used in messages and the log).
        cfg: its configuration.
        quiet: say nothing on stderr when the local model is started.

    Returns:
        A ready provider; the caller owns it and must ``await provider.aclose()``.

    Raises:
        ConfigError: an API key or Entra ID token variable is not set.
        ProviderUnavailable: the local model cannot be started, or the server cannot
            be reached (the provider is closed before this is raised).
    """
    if cfg.replicas is not None:
        return await _open_replicas(name, cfg)
    base_url = cfg.base_url
    azure: AzureTarget | None = None
    if cfg.kind == "azure":
        assert cfg.endpoint is not None and cfg.api_version is not None  # config validated
        azure = AzureTarget(
            endpoint=cfg.endpoint,
            api_version=cfg.api_version,
            deployment=cfg.deployment,
            entra_token=read_api_key(
                cfg.entra_token_env, field=f"providers.{name}.entra_token_env"
            ),
        )
    elif base_url is None:
        base_url = (await start_local_model(quiet)).base_url
    args = (name, base_url, cfg.api_key_env, cfg.max_connections, cfg.connect_timeout_s)
    provider: OpenAICompatProvider | ResponsesProvider
    if cfg.api == "responses":
        provider = ResponsesProvider(*args, azure=azure, pool_connections=cfg.pool_connections)
    else:
        provider = OpenAICompatProvider(
            *args, azure=azure, pool_connections=cfg.pool_connections, transport=cfg.transport
        )
    provider.reasoning_in_content = cfg.reasoning_in_content
    if isinstance(provider, OpenAICompatProvider) and cfg.cache_prompt is not None:
        provider.cache_prompt = cfg.cache_prompt
    if isinstance(provider, OpenAICompatProvider):
        # llama.cpp's sampler fields: the embedded model (no base_url) serves them
        provider.sampling_fields = (cfg.sampling_fields if cfg.sampling_fields is not None
                                    else cfg.kind == "openai" and cfg.base_url is None)
    provider.affinity = resolve_mode(cfg.prompt_cache, kind=cfg.kind, base_url=cfg.base_url)
    provider.affinity_key = cfg.prompt_cache_key
    if provider.affinity == "slot" and not isinstance(provider, OpenAICompatProvider):
        provider.affinity = "off"  # slots are llama-server's, a Chat Completions server
    try:
        await provider.check()  # an unreachable server fails here, before any run exists
        if provider.affinity == "slot":
            slots = cfg.slots or await provider.server_slots()
            # a server that does not say its slots gets no id_slot (it places requests)
            provider.slot_table = SlotTable(slots) if slots else None
    except BaseException:
        await provider.aclose()
        raise
    return provider


async def _open_replicas(name: str, cfg: ProviderConfig) -> Provider:
    """The :class:`ReplicaPool` of ``cfg.replicas``: one provider a replica, each with
    the table's settings and its own slot table in mode ``slot``; checked together (a
    replica that cannot be reached is marked down, none reachable raises).

    Raises:
        ProviderUnavailable: no replica can be reached.
    """
    assert cfg.replicas is not None
    members: list[OpenAICompatProvider] = []
    pool: ReplicaPool | None = None
    try:
        for url in cfg.replicas:
            p = OpenAICompatProvider(
                name, url, cfg.api_key_env, cfg.max_connections, cfg.connect_timeout_s,
                pool_connections=cfg.pool_connections, transport=cfg.transport,
            )  # fmt: skip
            members.append(p)
            p.reasoning_in_content = cfg.reasoning_in_content
            if cfg.cache_prompt is not None:
                p.cache_prompt = cfg.cache_prompt
            p.sampling_fields = bool(cfg.sampling_fields)
            p.affinity = resolve_mode(cfg.prompt_cache, kind=cfg.kind, base_url=url)
            p.affinity_key = cfg.prompt_cache_key
        pool = ReplicaPool(name, members, cfg.replica_policy)
        await pool.check()
        for i, p in enumerate(members):
            if p.affinity == "slot" and pool.is_up(i):
                slots = cfg.slots or await p.server_slots()
                p.slot_table = SlotTable(slots) if slots else None
    except BaseException:
        for p in members:
            await p.aclose()
        raise
    return pool


async def start_local_model(quiet: bool) -> local_model.LocalServer:
    """This install's local model server, started if none is running:
    :func:`chainrun.runtime.local_model.up` in a worker thread, told to stop waiting
    when this is cancelled: otherwise the thread would wait on for the server (up to
    its start-up timeout) and hold the process's exit (``asyncio.run`` joins its worker
    threads), so a Ctrl-C of ``chainrun serve`` during start-up seemed ignored."""
    cancel = threading.Event()
    try:
        return await asyncio.to_thread(local_model.up, quiet=quiet, cancel=cancel)
    except asyncio.CancelledError:
        cancel.set()
        raise
