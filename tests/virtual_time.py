"""A virtual-time event loop for tests: its clock jumps to the next timer instead of
sleeping, so scripted latencies of seconds take no wall time and every offset is exact."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

R = TypeVar("R")

class _JumpingSelector(selectors.DefaultSelector):
    """Instead of waiting ``timeout`` seconds for I/O, move the loop's clock forward."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> Any:
        if timeout is not None and timeout > 0:
            self._loop.now += timeout
            timeout = 0
        return super().select(timeout)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer: a 3 s race takes no wall time.

    ``block(seconds)`` moves the clock without yielding: the loop was busy (a stall).
    """

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now

    def block(self, seconds: float) -> None:
        self.now += seconds


def run_virtual(main: Callable[[], Coroutine[Any, Any, R]]) -> R:
    """Run ``main()`` on a fresh virtual-time loop; fail if it leaves any task behind."""

    async def checked() -> R:
        result = await main()
        current = asyncio.current_task()
        leftover = [t for t in asyncio.all_tasks() if t is not current]
        assert leftover == [], f"leaked tasks: {leftover}"
        return result

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(checked())


def vloop() -> VirtualClockLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    return loop


