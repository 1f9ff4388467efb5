"""LoopLagMonitor: measures how late the loop runs a timer (real event loop, small times)."""

from __future__ import annotations

import asyncio
import time

from chainrun.hedging import LoopLagMonitor, get_loop_lag_monitor


async def test_measures_a_blocked_loop() -> None:
    monitor = LoopLagMonitor(interval_s=0.01, history=50)
    async with monitor:
        await asyncio.sleep(0.03)
        time.sleep(0.08)  # block the loop on purpose  # noqa: ASYNC251
        await asyncio.sleep(0.03)
        lag = monitor.lag_ms
    assert lag is not None and lag >= 50
    assert not monitor.running


async def test_no_lag_known_before_the_first_tick() -> None:
    monitor = LoopLagMonitor(interval_s=0.01)
    assert monitor.lag_ms is None
    async with monitor:
        assert monitor.running
        await asyncio.sleep(0.05)
        assert monitor.lag_ms is not None and monitor.lag_ms >= 0  # a first tick measured


async def test_nested_entries_share_one_timer() -> None:
    monitor = get_loop_lag_monitor()
    assert get_loop_lag_monitor() is monitor
    async with monitor:
        async with monitor:
            assert monitor.running
        assert monitor.running  # the outer user still needs it
    assert not monitor.running
    current = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not current] == []
