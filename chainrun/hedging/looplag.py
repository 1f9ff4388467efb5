"""Event-loop lag: how late the asyncio loop wakes up a timer.

A hedge copy is fired by a timer. When the loop is busy (CPU work, a blocking call),
the timer fires late, and the "slow" primary may in fact have answered already, its
bytes waiting in a socket the loop has not read yet. Copies fired then measure the
client, not the server; the engine can suppress them and records the lag either way.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from types import TracebackType


class LoopLagMonitor:
    """A periodic timer that measures how late the event loop runs it.

    Every ``interval_s`` seconds (default 50 ms) it sleeps and compares when it woke with
    when it asked to wake. :attr:`lag_ms` is the **maximum** of the last ``history``
    measurements (default 20, about the last second): a single long stall is what spoils
    a hedge decision, and a moving average would dilute it.

    Start and stop it as an async context manager (``async with monitor:``); entering is
    reference-counted, so nested users share one running timer, which stops when the last
    one leaves. Without a running monitor, :attr:`lag_ms` is None (unknown).
    """

    def __init__(self, interval_s: float = 0.05, *, history: int = 20) -> None:
        if interval_s <= 0 or history < 1:
            raise ValueError(f"need interval_s > 0 and history >= 1, got {interval_s=}, {history=}")
        self.interval_s = interval_s
        self._samples: deque[float] = deque(maxlen=history)
        self._task: asyncio.Task[None] | None = None
        self._users = 0

    @property
    def lag_ms(self) -> float | None:
        """Largest lag of the recent measurements, in ms; None before the first one."""
        return max(self._samples) if self._samples else None

    @property
    def running(self) -> bool:
        """Whether the measuring timer is running."""
        return self._task is not None and not self._task.done()

    async def __aenter__(self) -> LoopLagMonitor:
        self._users += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._measure(), name="chainrun-loop-lag-monitor"
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._users = max(0, self._users - 1)
        if self._users == 0:
            await self.stop()

    async def stop(self) -> None:
        """Stop the timer now, whoever entered it, and wait until it has stopped."""
        task, self._task, self._users = self._task, None, 0
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    async def _measure(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self._samples.append(max(0.0, loop.time() - asked) * 1000)


_monitors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLagMonitor] = (
    weakref.WeakKeyDictionary()
)


def get_loop_lag_monitor() -> LoopLagMonitor:
    """The one :class:`LoopLagMonitor` of the running event loop (created, not started).

    Start it with ``async with get_loop_lag_monitor():`` around the work to watch.

    Raises:
        RuntimeError: no event loop is running.
    """
    loop = asyncio.get_running_loop()
    monitor = _monitors.get(loop)
    if monitor is None:
        monitor = _monitors[loop] = LoopLagMonitor()
    return monitor
