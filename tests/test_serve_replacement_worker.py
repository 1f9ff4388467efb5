"""A worker of ``serve --workers N`` started while another serves (one replacing a dead
worker) takes no connection until its chain is open; the fleet's first worker takes
them at once and says why it is not ready.

Before: the replacement accepted connections on the shared socket as it started, and
a request the kernel gave it was answered 503 ``not_ready`` while the other worker was
serving (1 of 12 in a restart)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import httpx
import uvicorn
from serve_helpers import fake_chain

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider
from chainrun.serve import ServeState, create_app
from chainrun.serve.server import bind
from chainrun.serve.workers import WorkerBoard


@contextlib.asynccontextmanager
async def _worker(state: ServeState) -> AsyncIterator[str]:
    """The app under uvicorn on a loopback socket, not waiting for its start-up."""
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(state), log_level="warning",
                                           timeout_graceful_shutdown=2))  # fmt: skip
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        state.request_stop()
        await task
        sock.close()


def _gated(config: ChainConfig, store: Store, fake: FakeProvider,
           gate: asyncio.Event) -> Callable[[], Chain]:  # fmt: skip
    """Chains whose open waits for ``gate`` (a model server still starting)."""
    make = fake_chain(config, store, fake)

    def factory() -> Chain:
        chain = make()
        real_open = chain.open

        async def open_later() -> None:
            await gate.wait()
            await real_open()

        chain.open = open_later  # type: ignore[method-assign]
        return chain

    return factory



async def test_a_replacement_takes_connections_once_ready(config, store, fake) -> None:  # type: ignore[no-untyped-def]
    board = WorkerBoard(2)
    board.set(0, True)  # the other worker serves
    gate = asyncio.Event()
    state = ServeState(_gated(config, store, fake, gate), fleet=board.slot(1))
    async with _worker(state) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        asked = asyncio.create_task(client.get("/readyz"))
        await asyncio.sleep(0.5)
        waiting = not asked.done()  # not answered 503: not taken at all
        gate.set()
        answer = await asked
    assert waiting
    assert answer.status_code == 200, answer.text
    assert answer.json()["workers"] == {"serving": 2, "workers": 2}


async def test_the_fleets_first_worker_takes_connections_at_once(config, store, fake) -> None:  # type: ignore[no-untyped-def]
    board = WorkerBoard(2)  # no worker serves yet
    gate = asyncio.Event()
    state = ServeState(_gated(config, store, fake, gate), fleet=board.slot(0))
    async with _worker(state) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        for _ in range(100):
            with contextlib.suppress(httpx.ConnectError):
                first = await asyncio.wait_for(client.get("/readyz"), 5)
                break
            await asyncio.sleep(0.05)
        gate.set()
    assert first.status_code == 503 and first.json()["status"] == "starting", first.text
