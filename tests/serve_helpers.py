"""Helpers for the serve tests: the app under a real uvicorn on loopback, and an SSE reader."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider
from chainrun.serve import ServeState, create_app
from chainrun.serve.head_limit import HeadLimitedProtocol
from chainrun.serve.identity import IdentitySource
from chainrun.serve.server import bind
from chainrun.serve.turns import TurnObserver


def fake_chain(config: ChainConfig, store: Store, fake: FakeProvider) -> Callable[[], Chain]:
    """A factory of live chains answering with ``fake``, logging to ``store``."""
    return lambda: Chain(config, store=store, providers={"local": fake}, kind="live", quiet=True)


def n_turns(store: Store) -> int:
    """The turns in ``store``'s log."""
    return int(store.log.scalar("select count(*) from turns", []) or 0)


#: the Content-Type header of a JSON body sent as raw bytes (serve refuses any other, 415)
JSON_TYPE = {"Content-Type": "application/json"}


@contextlib.asynccontextmanager
async def serving(
    factory: Callable[[], Chain],
    *,
    token: str | None = None,
    observers: list[TurnObserver] | None = None,
    wait_ready: bool = True,
    retry_s: float = 2.0,
    max_body_bytes: int | None = None,
    watch_options: dict[str, Any] | None = None,
    identity: IdentitySource | None = None,
    allowed_hosts: tuple[str, ...] | None = None,
    cors_origins: list[str] | None = None,
    **state_options: Any,
) -> AsyncIterator[tuple[str, ServeState]]:
    """The serve app on a free loopback port in this event loop; yields (base URL, state).
    ``identity``: where the caller's identity is read; ``allowed_hosts`` / ``cors_origins``:
    :func:`~chainrun.serve.create_app`'s; ``state_options``: more keyword
    arguments of :class:`ServeState` (keep-alives, background patterns...)."""
    # the tests read the operator's events (step, tool, grounding) unless they say not
    state_options.setdefault("step_events", True)
    state = ServeState(
        factory, observers=observers or [], retry_s=retry_s, watch_options=watch_options,
        **state_options,
    )
    limit = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
    app = create_app(state, token=token, identity=identity, allowed_hosts=allowed_hosts,
                     cors_origins=cors_origins or (), **limit)
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2,
                                           http=HeadLimitedProtocol))  # as serve runs it
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        if wait_ready:
            await asyncio.wait_for(state.wait_ready(), 30)
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        await task
        sock.close()


async def sse(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """(event, data) pairs of a text/event-stream response; data JSON-decoded when it is JSON."""
    event, data = "message", []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                raw = "\n".join(data)
                try:
                    yield event, json.loads(raw)
                except ValueError:
                    yield event, raw
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


async def chat(client: httpx.AsyncClient, message: str, **body: Any) -> list[tuple[str, Any]]:
    """All events of one ``POST /chat``."""
    events = []
    async with client.stream("POST", "/chat", json={"message": message, **body}) as r:
        assert r.status_code == 200, await r.aread()
        async for ev in sse(r):
            events.append(ev)
    return events


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rpartition(")")[2].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def kill_with_workers(pid: int) -> None:
    """SIGKILL ``pid`` and its children: the workers of ``serve --workers N`` are forked
    into process groups of their own and hold its stderr open, so killing the parent
    alone leaves a reader of that stderr waiting for them forever."""
    for child in children(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def workers_ready(base: str, workers: int, timeout_s: float = 60.0) -> bool:
    """Whether ``GET {base}/readyz`` answered 200 on 10 × ``workers`` new connections in a
    row within ``timeout_s``: the kernel spreads connections over the workers of ``serve
    --workers N``, so every worker has most likely answered (one 200 says only that one
    of them is ready)."""
    deadline = time.monotonic() + timeout_s
    ready = 0
    while time.monotonic() < deadline and ready < 10 * workers:
        try:
            r = httpx.get(f"{base.rstrip('/')}/readyz", timeout=2)
            ready = ready + 1 if r.status_code == 200 else 0
        except httpx.HTTPError:
            ready = 0
        time.sleep(0.1 if ready == 0 else 0.01)
    return ready >= 10 * workers
