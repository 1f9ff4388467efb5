"""chainrun's own work per call, layer by layer, with no network: where hedge_overhead's
added time goes, measured rather than reasoned.

A scripted in-process provider yields the chunks the lab's ``fast`` scenario sends for
16 tokens (a role-only first chunk, 16 content chunks, the finish chunk, the usage
chunk) after one wait on the event loop (as a network read would), so every layer
below runs chainrun's real code and nothing else:

* ``bare``: the provider's chunks iterated and joined (the floor);
* ``chatstream``: ``ChatStream(pump=False).collect()`` (timing accumulator, as a
  non-streamed step reads its answer);
* ``unhedged``: that inside ``Hedger.run`` with no policy (one attempt task);
* ``hedged``: with a 10 s hedge delay, never due (the budget, the delay, a timer);
* ``chain_nolog``: a one-step ``Chain.run_turn`` without a log (checks, scheduler, the
  LLM step, records, events);
* ``chain``: the same chain logging to a temporary SQLite file, the turn's commit
  awaited after every call (``Chain.flush``) so each call's row building, queueing and
  the writer thread's commit are inside its count.

Per layer: the median wall time per call (µs), the event-loop iterations per call, and
with ``--callgrind`` the exact instruction count per call (valgrind's callgrind, all
threads: the process re-runs itself under valgrind and dumps its counters around each
layer's measured calls at an ``os.getppid()`` marker; about 2 minutes). Instruction
counts do not move with the machine's load, wall times do.

Run: ``python benchmarks/own_cost.py [--calls 3000] [--callgrind] [--callgrind-calls 100]
[--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as c

from chainrun.chain import Chain
from chainrun.hedging import AttemptInfo, HedgePolicy, Hedger
from chainrun.log.store import Store
from chainrun.providers import ChatRequest, ChatStream
from chainrun.timing import Chunk, Usage

LAYERS = ("bare", "chatstream", "unhedged", "hedged", "chain_nolog", "chain")
MESSAGE = "Does the linen shirt run small?"
CHUNKS = (
    [Chunk(role="assistant", model="m", response_id="r", nbytes=100)]
    + [Chunk(content=f"w{i} ", model="m", response_id="r", nbytes=120) for i in range(16)]
    + [Chunk(finish_reason="stop", model="m", response_id="r", nbytes=100)]
    + [Chunk(usage=Usage(10, 16), model="m", response_id="r", nbytes=150)]
)


class ScriptedProvider:
    """A provider answering every request with :data:`CHUNKS` after one loop turn."""

    name = "lab"
    server_address: str | None = None

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        await asyncio.sleep(0)  # the wait for the network
        for chunk in CHUNKS:
            yield chunk

    async def aclose(self) -> None:
        pass


class Layers:
    """One coroutine function per layer, each making one call."""

    def __init__(self, store: Store) -> None:
        self.provider = ScriptedProvider()
        self.request = ChatRequest(
            model="m", messages=[{"role": "user", "content": MESSAGE}], max_output_tokens=16
        )
        self.unhedged: Hedger[ChatStream] = Hedger(None, ["lab"])
        self.hedged: Hedger[ChatStream] = Hedger(
            HedgePolicy(delay_ms=10_000.0, max_attempts=2, deadline_s=30.0), ["lab"]
        )
        step = {"model": "m", "max_output_tokens": 16, "deadline_s": 30.0, "stream": False,
                "hedge": {"delay_ms": 10_000.0, "max_attempts": 2}}  # fmt: skip
        config = c.one_step_config("http://127.0.0.1:9/v1", step, max_connections=100)
        providers = {"lab": self.provider}
        self.chain_nolog = Chain(config, providers=providers, quiet=True)
        self.chain = Chain(config, store=store, providers=providers, quiet=True)

    async def __aenter__(self) -> Layers:
        await self.chain_nolog.open()
        await self.chain.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.chain.aclose()
        await self.chain_nolog.aclose()
        await self.hedged.aclose()
        await self.unhedged.aclose()

    def calls(self) -> dict[str, Callable[[], Awaitable[object]]]:
        return {
            "bare": self.bare,
            "chatstream": self.chatstream,
            "unhedged": lambda: self.via(self.unhedged),
            "hedged": lambda: self.via(self.hedged),
            "chain_nolog": lambda: self.turn(self.chain_nolog),
            "chain": self.logged_turn,
        }

    async def bare(self) -> str:
        parts = [ch.content async for ch in self.provider.chunks(self.request) if ch.content]
        return "".join(parts)

    async def chatstream(self) -> str:
        s = ChatStream(self.provider, self.request, pump=False)
        await s.collect()
        await s.aclose()
        return s.timer.text

    async def via(self, hedger: Hedger[ChatStream]) -> str:
        async def attempt(info: AttemptInfo) -> ChatStream:
            s = ChatStream(self.provider, self.request, pump=False)
            try:
                return await s.collect()
            except BaseException:
                await s.aclose()
                raise

        async def release(s: ChatStream) -> None:
            await s.aclose()

        winner = (await hedger.run(attempt, release=release)).result()
        await winner.aclose()
        return winner.timer.text

    @staticmethod
    async def turn(chain: Chain) -> str:
        done = await chain.run_turn(MESSAGE)
        if done.status != "ok":
            raise RuntimeError(f"turn ended {done.status}: {done.error_type}")
        return done.output or ""

    async def logged_turn(self) -> str:
        text = await self.turn(self.chain)
        await self.chain.flush()  # its rows built, queued and committed
        return text


def count_loop_iterations(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Count the loop's iterations (``_run_once`` calls) into the returned one-item list."""
    counter = [0]
    run_once = loop._run_once  # type: ignore[attr-defined]

    def counted() -> None:
        counter[0] += 1
        run_once()

    loop._run_once = counted  # type: ignore[attr-defined]
    return counter


async def measure(calls: int, warmup: int, markers: bool) -> dict[str, Any]:
    """Per layer: median wall µs and loop iterations per call (rounds interleaved)."""
    iterations = count_loop_iterations(asyncio.get_running_loop())
    out: dict[str, Any] = {}
    with c.temp_store() as store:
        async with Layers(store) as layers:
            fns = layers.calls()
            for name in LAYERS:
                fn = fns[name]
                for _ in range(warmup):
                    await fn()
                if markers:
                    os.getppid()  # callgrind dumps its counters here (--dump-before=getppid)
                walls: list[float] = []
                turns: list[int] = []
                for _ in range(calls):
                    i0 = iterations[0]
                    t0 = time.perf_counter()
                    await fn()
                    walls.append((time.perf_counter() - t0) * 1e6)
                    turns.append(iterations[0] - i0)
                if markers:
                    os.getppid()
                out[name] = {
                    "n": calls,
                    "median_us": c.r(statistics.median(walls), 2),
                    "loop_iterations": statistics.median(turns),
                }
    return out


def callgrind(calls: int) -> dict[str, float]:
    """Instructions per call by layer (thousands), from a run of this script under
    valgrind's callgrind; the measured calls of layer k are between its markers."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="chainrun-callgrind-") as tmp:
        cmd = [
            valgrind, "--tool=callgrind", "--dump-before=getppid", "--dump-instr=no",
            f"--callgrind-out-file={tmp}/cg.out", os.path.realpath(sys.executable),
            __file__, "--markers", "--calls", str(calls), "--warmup", "30",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
        dumps = sorted(glob.glob(f"{tmp}/cg.out.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
        totals = [_total(Path(f)) for f in dumps]
    # dump 2k+1 (0-based) holds layer k's measured calls
    return {name: c.r(totals[2 * k + 1] / calls / 1000, 1) for k, name in enumerate(LAYERS)}


def _total(dump: Path) -> int:
    for line in dump.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no totals line")


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = [f"{'layer':12} {'median us':>10} {'+':>8} {'loop its':>8} {'kIr/call':>9} {'+':>8}"]
    prev: dict[str, Any] | None = None
    for name in LAYERS:
        row = res[name]
        ir = row.get("k_instructions")
        d_us = "" if prev is None else f"{row['median_us'] - prev['median_us']:+8.1f}"
        d_ir = "" if prev is None or ir is None else f"{ir - prev['k_instructions']:+8.1f}"
        lines.append(
            f"{name:12} {row['median_us']:10.1f} {d_us:>8} {row['loop_iterations']:8.1f} "
            f"{c.fmt(ir, '.1f'):>9} {d_ir:>8}"
        )
        prev = row
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="measured calls per layer")
    parser.add_argument("--warmup", type=int, default=200, help="calls per layer not measured")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions")
    parser.add_argument(
        "--callgrind-calls", type=int, default=100, help="measured calls per layer under valgrind"
    )
    parser.add_argument("--markers", action="store_true", help=argparse.SUPPRESS)
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    if args.markers:  # the run under valgrind: only the calls between the markers count
        asyncio.run(measure(args.calls, args.warmup, markers=True))
        return 0
    params = {"calls": args.calls, "warmup": args.warmup, "chunks": len(CHUNKS),
              "callgrind_calls": args.callgrind_calls if args.callgrind else None}  # fmt: skip
    doc = c.new_document("own_cost", sys.argv[1:], params)
    results = asyncio.run(measure(args.calls, args.warmup, markers=False))
    if args.callgrind:
        for name, k in callgrind(args.callgrind_calls).items():
            results[name]["k_instructions"] = k
    doc["results"] = results
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
