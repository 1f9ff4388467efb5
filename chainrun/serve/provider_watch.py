"""``chainrun serve`` says when the model server it answers with is away, and keeps the
embedded one.

**The answer step's provider** (:class:`ProviderWatch`). When a turn fails because its
answer step's provider could not be reached (error type ``unavailable``), serve says so
in one warning line, ``/readyz`` answers 503 with the reason (a load balancer stops
sending chats here), and the provider's preflight (``GET /models``) is tried every
``every_s`` seconds (2 s) until it answers; then one line says it is back and
``/readyz`` is 200 again. Nothing is probed while turns are answered.

**The embedded local model** (:class:`LocalModelWatch`). A chain whose provider has no
``base_url`` talks to this install's llama-server (:mod:`chainrun.runtime.local_model`),
started or found when the chain opened. That server is a process of its own: it can be
killed, crash or be stopped by ``chainrun local down`` while serve runs. Every
``every_s`` seconds the watch asks whether it is alive
(:func:`chainrun.runtime.local_model.status`: its recorded pid, a few ms). When it is
not:

* serve says so in one warning line, and ``/readyz`` answers 503 with the reason
  (:attr:`LocalModelWatch.down`); turns sent meanwhile fail fast (``unavailable``), as
  they did;
* the watch starts the server again, or finds the one ``chainrun local up`` started
  (one install runs one server), points the providers at it
  (:meth:`~chainrun.providers.openai_client.OpenAIClientProvider.repoint`: it may have
  another port) and says in one line that the model is back; ``/readyz`` is 200 again.

A start that fails is said once and tried again every ``every_s`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from chainrun.errors import ProviderUnavailable
from chainrun.events import TurnFinished
from chainrun.providers.factory import start_local_model
from chainrun.providers.openai_client import OpenAIClientProvider
from chainrun.runtime import local_model

log = logging.getLogger("chainrun.serve")

#: how often the watch asks whether the local model server is alive, in s
WATCH_EVERY_S = 2.0


class LocalModelWatch:
    """Watches this install's llama-server for ``providers`` (the chain's
    :meth:`~chainrun.chain.Chain.embedded_model_providers`) and starts it again when it
    is gone.

    Args:
        providers: the providers to point at the server (each an
            :class:`~chainrun.providers.openai_client.OpenAIClientProvider`; others are
            left alone).
        every_s: seconds between checks.
        find: this install's live server or None (default
            :func:`chainrun.runtime.local_model.status`; called in a worker thread).
        start: starts (or finds) the server, given ``quiet`` (default
            :func:`chainrun.providers.factory.start_local_model`).
    """

    def __init__(
        self,
        providers: Sequence[Any],
        *,
        every_s: float = WATCH_EVERY_S,
        find: Callable[[], local_model.LocalServer | None] = local_model.status,
        start: Callable[[bool], Awaitable[local_model.LocalServer]] = start_local_model,
    ) -> None:
        self.providers = [p for p in providers if isinstance(p, OpenAIClientProvider)]
        self.every_s = every_s
        self._find = find
        self._start = start
        #: why the model cannot answer now (None: it can); ``/readyz`` reports it
        self.down: str | None = None

    async def check(self) -> None:
        """One round: find the server; start it when it is gone; point the providers at
        it. Says each change of state in one warning line."""
        server = await asyncio.to_thread(self._find)
        if server is None:
            where = ", ".join(sorted({p.where for p in self.providers}))
            if self.down is None:
                log.warning("the local model server (%s) is not running; starting it again "
                            "(/readyz says not ready meanwhile)", where)  # fmt: skip
                self.down = f"the local model server ({where}) is not running; starting it again"
            try:
                server = await self._start(False)
            except ProviderUnavailable as e:
                reason = f"the local model server could not be started again: {e}"
                if reason != self.down:
                    log.warning("%s; trying again every %g s", reason, self.every_s)
                self.down = reason
                return
        url = server.base_url
        moved = [p for p in self.providers if p.base_url != url]
        for provider in moved:
            provider.repoint(url)
        if self.down is not None or moved:
            log.warning("the local model answers again at %s (pid %d); serving with it",
                        url, server.pid)  # fmt: skip
        self.down = None

    async def run(self) -> None:
        """Check every :attr:`every_s` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.check()
            except Exception as e:  # one failed round (an unreadable state file) ends nothing
                log.warning("checking the local model server failed (%s: %s); again in %g s",
                            type(e).__name__, e, self.every_s)  # fmt: skip


class ProviderWatch:
    """Says when the answer step's provider cannot be reached, and when it answers again.

    Args:
        providers: provider name -> provider (the answer step's primary; a provider
            without a ``check()`` preflight is not watched).
        every_s: seconds between preflight tries while a provider is away.
    """

    def __init__(self, providers: dict[str, Any], *, every_s: float = WATCH_EVERY_S) -> None:
        self.providers = {n: p for n, p in providers.items() if hasattr(p, "check")}
        self.every_s = every_s
        #: provider name -> why it cannot answer now; ``/readyz`` reports it
        self.down: dict[str, str] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}

    def turn_finished(self, done: TurnFinished) -> None:
        """Told about every finished turn (on the event loop): a turn that failed because
        its provider could not be reached starts the watch of that provider."""
        if done.error_type != "unavailable":
            return
        for name, provider in self.providers.items():
            if name not in self._probes or self._probes[name].done():
                self._probes[name] = asyncio.create_task(self._watch(name, provider))

    async def _watch(self, name: str, provider: Any) -> None:
        where = getattr(provider, "where", "?")
        while True:
            try:
                await provider.check()
            except ProviderUnavailable as e:
                if name not in self.down:
                    log.warning("provider %r at %s cannot be reached (%s); turns fail until it "
                                "answers, /readyz says not ready; trying it every %g s",
                                name, where, e, self.every_s)  # fmt: skip
                self.down[name] = f"provider {name!r} at {where} cannot be reached: {e}"
                await asyncio.sleep(self.every_s)
                continue
            if self.down.pop(name, None) is not None:
                log.warning("provider %r at %s answers again", name, where)
            return

    async def aclose(self) -> None:
        """Stop watching."""
        for task in self._probes.values():
            task.cancel()
        for task in self._probes.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
