"""Repro: with calls in flight together, the hedge budget refused copies they paid for.

Each call deposits ``max_extra_load`` tokens and a copy costs 1. Before commit abe3a47
``HedgeBudget``'s default capacity was ``max(1, reserve, max_extra_load)``: deposits of
calls that start together overflowed the bucket, so at most ``capacity`` copies could be
paid for at once, whatever the concurrency. abe3a47 made the default hold 100 calls'
deposits. Expected: 0 refused with the current default; the old capacity is rebuilt
here for comparison.

Run: ``python benchmarks/repro/budget_concurrency.py``.
"""

from __future__ import annotations

import asyncio

from chainrun.hedging import AttemptInfo, HedgeBudget, HedgePolicy, Hedger


async def main() -> None:
    for old, load in [(old, load) for old in (False, True) for load in (1.0, 2.0, 4.0)]:
        hedger: Hedger[int] = Hedger(
            HedgePolicy(delay_ms=10, max_attempts=2, max_extra_load=load), ["a"]
        )
        if old:  # the default before abe3a47
            hedger.budget = HedgeBudget(load, capacity=max(1.0, load))

        async def attempt(info: AttemptInfo) -> int:
            await asyncio.sleep(0.1)  # every primary is still running at d = 10 ms
            return info.number

        await asyncio.gather(*(hedger.run(attempt) for _ in range(20)))
        s = hedger.stats
        print(
            f"{'old' if old else 'current'} capacity, max_extra_load={load:g}: "
            f"20 concurrent calls deposited {20 * load:g} tokens; "
            f"{s.fires} copies due, {s.copies_sent} sent, {s.budget_exhausted} refused"
        )


if __name__ == "__main__":
    asyncio.run(main())
