"""Repro: a shadow loser held up the step, and so the turn, until it finished.

``HedgePolicy.shadow_fraction`` leaves losers running "unseen" to measure the time saved
per win, but before commit abe3a47 ``Chain._llm_step`` awaited them (``_wait_shadows``)
before the step ended: 2001 ms instead of ~150 ms with ``shadow_fraction = 1``.
Primary 2 s, copy at 100 ms answering in 50 ms: the turn should take ~150 ms either way.

Run: ``python benchmarks/repro/shadow_wait.py``.
"""

from __future__ import annotations

import asyncio
import time

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.providers import ChatRequest, FakeProvider, FakeReply


def script(request: ChatRequest) -> FakeReply:
    primary = request.headers.get("x-chainrun-attempt") == "1"
    return FakeReply("ok", ttft_s=2.0 if primary else 0.05)


async def main() -> None:
    for shadow in (0.0, 1.0):
        hedge = {"delay_ms": 100, "max_attempts": 2, "shadow_fraction": shadow}
        config = config_from_dict(
            {
                "order": ["guard"],
                "answer_step": "guard",
                "providers": {"fake": {}},
                "steps": {"guard": {"provider": "fake", "deadline_s": 10, "hedge": hedge}},
            }
        )
        async with Chain(config, providers={"fake": FakeProvider("fake", script)}) as chain:
            t0 = time.perf_counter()
            done = await chain.run_turn("hi")
            ms = (time.perf_counter() - t0) * 1000
        print(f"shadow_fraction={shadow:g}: turn took {ms:.0f} ms ({done.status}, {done.output!r})")


if __name__ == "__main__":
    asyncio.run(main())
