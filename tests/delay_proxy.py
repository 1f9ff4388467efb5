"""A TCP proxy for tests that delays every byte by a fixed time each way: a slow link (a
database in another region) between a client and a server on this machine.

Runs an asyncio loop in a thread of its own, so that a test (sync or async) and
subprocesses (``chainrun serve``) can connect to it. Bytes read from one side are
written to the other ``delay_s`` after they were read, in order (a queue per direction:
the link's latency, not its bandwidth).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any


class DelayProxy:
    """Forwards ``127.0.0.1:port`` to ``(host, target_port)`` with ``delay_s`` each way.

    Attributes:
        port: the proxy's own loopback port (a free one), set once started.
        connections: connections accepted so far.
    """

    def __init__(self, host: str, target_port: int, delay_s: float) -> None:
        self.target = (host, target_port)
        self.delay_s = delay_s
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                up_r, up_w = await asyncio.open_connection(*self.target)
            except OSError:
                writer.close()
                return
            try:
                await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))
            except asyncio.CancelledError:
                pass  # the proxy is closing: its connections end with it
            finally:
                for w in (writer, up_w):
                    w.close()
                tasks.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy ``src`` to ``dst``, each read written ``delay_s`` after it arrived."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    with contextlib.suppress(OSError):
                        dst.write_eof()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                dst.write(data)
                await dst.drain()

        sender = asyncio.create_task(deliver())
        try:
            while True:
                data = await src.read(65536)
                queue.put_nowait((time.monotonic() + self.delay_s, data))
                if not data:
                    break
            await sender
        except (OSError, asyncio.IncompleteReadError):
            sender.cancel()
        finally:
            if not sender.done():
                sender.cancel()
