"""Shared plumbing of the hedging benchmarks (``benchmarks/hedge_*.py``).

Each benchmark starts its own :class:`~chainrun.lab.LabServer`, drives it through
chainrun's real stack (a one-step :class:`~chainrun.chain.Chain`, the
``OpenAICompatProvider`` and the real ``openai`` client over loopback HTTP), logs to a
temporary SQLite file and writes ``benchmarks/results/NAME.json``:
``{benchmark, command, date, machine, parameters, results}``.

Not a chainrun module on purpose: the scripts run as ``python benchmarks/NAME.py``
and import this file from their own directory.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import gc
import json
import math
import os
import platform
import shlex
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chainrun.analysis.summary import hedge_stats
from chainrun.chain import Chain
from chainrun.config import ChainConfig, config_from_dict
from chainrun.log.rows import CallRow
from chainrun.log.store import Store

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: the name of the single step every benchmark chain runs
STEP = "guard"

#: a turn whose client loop lagged more than this (ms) is reported as "client late"
LAG_THRESHOLD_MS = 100.0


# ------------------------------------------------------------------ the result file


def machine_info() -> dict[str, Any]:
    """Platform, Python, CPU count and the 1-minute load average (the machine is shared)."""
    try:
        load1: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load1 = None
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_start": load1,
    }


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``--out``, the options every benchmark takes."""
    parser.add_argument("--json", action="store_true", help="print the result document")
    parser.add_argument(
        "--out", help="where to write the result document (default benchmarks/results/NAME.json)"
    )


def new_document(name: str, argv: Sequence[str], parameters: dict[str, Any]) -> dict[str, Any]:
    """The result document's header; ``results`` is filled in by the benchmark."""
    return {
        "benchmark": name,
        "command": shlex.join(["python", f"benchmarks/{name}.py", *argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "parameters": parameters,
        "results": {},
    }


def finish(
    doc: dict[str, Any],
    *,
    as_json: bool,
    summary: Callable[[dict[str, Any]], str],
    out: str | None = None,
) -> Path:
    """Write the document (``out``, default ``results/NAME.json``) and print it or a summary."""
    path = Path(out) if out else RESULTS_DIR / f"{doc['benchmark']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2, sort_keys=False)
    path.write_text(text + "\n", encoding="utf-8")
    if as_json:
        print(text)
    else:
        m = doc["machine"]
        print(f"{doc['command']}\n{doc['date']}  {m['platform']}  python {m['python']}  "
              f"{m['cpu_count']} cpus  load {m['load_avg_1m_at_start']}")  # fmt: skip
        print(summary(doc))
        print(f"\nwritten to {path}")
    return path


# ------------------------------------------------------------------ small statistics


def wilson(passed: int, n: int, z: float = 1.959964) -> list[float] | None:
    """95% Wilson score interval of ``passed / n`` (Wilson, JASA 1927); None when n = 0."""
    if n <= 0:
        return None
    p = passed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def median(values: Sequence[float]) -> float | None:
    """The median (mean of the middle two for even n); None for no values."""
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def quantile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank ``p``-th percentile (p in percent); None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(1, math.ceil(p / 100 * len(s))) - 1]


def r(x: float | None, digits: int = 1) -> float | None:
    """Round for the JSON document, keeping None."""
    return None if x is None else round(x, digits)


# ------------------------------------------------------------------ client loop lag


class GcPauses:
    """The garbage collector's own pauses while measuring (``gc.callbacks``): per
    generation, collections and their total and longest time in ms (a tail source
    that grows with what the arms allocate)."""

    def __init__(self) -> None:
        self.by_gen: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._t0 = 0.0

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.by_gen[info["generation"]].append((time.perf_counter() - self._t0) * 1000.0)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._cb)

    def summary(self) -> dict[str, Any]:
        return {
            f"gen{g}": {
                "n": len(ms),
                "total_ms": r(sum(ms), 3),
                "max_ms": r(max(ms), 3) if ms else None,
            }
            for g, ms in self.by_gen.items()
        }


class LagSampler:
    """Samples the client's own event-loop lag every ``interval_s`` (s), with timestamps.

    The same measurement as :class:`chainrun.hedging.LoopLagMonitor` (how late a timer
    wakes up), but every sample is kept with the loop time it was taken, so that the
    worst lag *during* each turn can be read back (:meth:`max_between`). A late client
    makes a primary look slow and fires copies that measure the client, not the server.
    """

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (loop time s, lag ms)
        self._times: list[float] = []  # the samples' loop times, for bisection
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LagSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        # The lag is read on time.monotonic (which asyncio's loop.time() is): uvloop's
        # loop.time() is libuv's clock in whole ms, which would floor every lag to a
        # whole ms. Samples are stamped with loop.time(), the clock turns are timed on.
        loop = asyncio.get_running_loop()
        clock = time.monotonic
        while True:
            asked = clock() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = loop.time()
            self.samples.append((now, max(0.0, clock() - asked) * 1000.0))
            self._times.append(now)

    def max_between(self, t0: float, t1: float) -> float:
        """Largest lag (ms) of the samples taken in [t0, t1 + interval] (loop seconds).

        Samples are in time order, so the window is found by bisection: a scan of every
        sample per turn made the harness itself quadratic (thousands of turns times
        thousands of samples, on the loop it measures)."""
        lo = bisect.bisect_left(self._times, t0)
        hi = bisect.bisect_right(self._times, t1 + self.interval_s)
        return max((lag for _, lag in self.samples[lo:hi]), default=0.0)

    def summary(self) -> dict[str, Any]:
        lags = [lag for _, lag in self.samples]
        return {
            "n_samples": len(lags),
            "interval_ms": self.interval_s * 1000,
            "p50_ms": r(median(lags)),
            "p99_ms": r(quantile(lags, 99)),
            "max_ms": r(max(lags, default=None)),
        }


# ------------------------------------------------------------------ the chain


def one_step_config(base_url: str, step: dict[str, Any], *, max_connections: int) -> ChainConfig:
    """A chain with the single LLM step ``guard`` on the lab provider ``lab``.

    ``step`` holds the StepConfig fields (``deadline_s``, ``stream``, ``hedge``, ...);
    ``max_connections`` sizes the HTTP pool so that copies never queue for a connection
    in the client (the default pool of 100 is smaller than 50 turns x 3 attempts).
    """
    return config_from_dict(
        {
            "order": [STEP],
            "answer_step": STEP,
            "providers": {"lab": {"base_url": base_url, "max_connections": max_connections}},
            "steps": {STEP: {"provider": "lab", "prompt": "{message}", **step}},
        },
        source="benchmark",
    )


@contextlib.contextmanager
def temp_store() -> Iterator[Store]:
    """A run log in a temporary SQLite file (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="chainrun-bench-") as tmp:
        store = Store.open(Path(tmp) / "bench.db")
        try:
            yield store
        finally:
            store.close()


@dataclass
class TurnResult:
    """What the driver saw of one turn (times in ms)."""

    index: int
    turn_id: int | None
    status: str
    duration_ms: float
    max_lag_ms: float


async def drive_turns(
    chain: Chain,
    messages: Sequence[str],
    *,
    concurrency: int,
    lag: LagSampler,
) -> list[TurnResult]:
    """Run one turn per message with at most ``concurrency`` turns in flight.

    Workers pull the next message as soon as their turn ends (a closed loop), so the
    offered load follows the turns' own latency.
    """
    loop = asyncio.get_running_loop()
    results: list[TurnResult] = []
    queue = iter(enumerate(messages))

    async def worker() -> None:
        for index, message in queue:
            t0 = loop.time()
            finished = await chain.run_turn(message)
            t1 = loop.time()
            results.append(
                TurnResult(
                    index,
                    finished.turn_id,
                    finished.status,
                    (t1 - t0) * 1000.0,
                    lag.max_between(t0, t1),
                )
            )

    async with asyncio.TaskGroup() as tg:
        for _ in range(min(concurrency, len(messages))):
            tg.create_task(worker())
    results.sort(key=lambda t: t.index)
    return results


@contextlib.asynccontextmanager
async def open_chain(config: ChainConfig, store: Store, label: str) -> AsyncIterator[Chain]:
    """A chain logging into ``store`` under a new run labelled ``label``."""
    async with Chain(config, store=store, kind="live", label=label, quiet=True) as chain:
        yield chain


def step_hedge_stats(store: Store, run_id: int) -> dict[str, Any]:
    """``hedge_stats`` of the benchmark's single step (empty dict if it never ran)."""
    return hedge_stats(store, run_id)["steps"].get(STEP, {})


def lag_report(
    turns: Sequence[TurnResult],
    calls: Sequence[CallRow],
    lag: LagSampler,
    first_wave: int,
) -> dict[str, Any]:
    """Whether the client was late: per-turn worst loop lag, and the copies' timer lateness.

    ``first_wave``: the turns started together at the beginning (the concurrency); the
    client's warm-up (imports, connections) lags once, which only they see.
    ``copies_timer_late_*`` comes from the log (``calls.loop_lag_ms`` of copies due: the
    loop lag the engine saw when it fired them, sent or refused).
    """
    late = [t for t in turns if t.max_lag_ms > LAG_THRESHOLD_MS]
    later = [t for t in turns if t.index >= first_wave]
    late_later = sum(1 for t in later if t.max_lag_ms > LAG_THRESHOLD_MS)
    copy_lags = [c.loop_lag_ms for c in calls if c.attempt > 1 and c.loop_lag_ms is not None]
    return {
        "threshold_ms": LAG_THRESHOLD_MS,
        "share_turns_lagging": round(len(late) / len(turns), 4) if turns else None,
        "n_turns_lagging": len(late),
        "share_turns_lagging_after_first_wave": (
            round(late_later / len(later), 4) if later else None
        ),
        "n_lag_spikes": sum(1 for _, ms in lag.samples if ms > LAG_THRESHOLD_MS),
        "turn_max_lag_p50_ms": r(median([t.max_lag_ms for t in turns])),
        "turn_max_lag_p99_ms": r(quantile([t.max_lag_ms for t in turns], 99)),
        "copies_timer_late_n": len(copy_lags),
        "copies_timer_late_p50_ms": r(median(copy_lags)),
        "copies_timer_late_max_ms": r(max(copy_lags, default=None)),
        # the engine's own flag (calls.fired_late, where the log has it): a copy due while
        # the loop lagged over max_loop_lag_ms, or over half the hedge delay if unset
        "copies_fired_late": sum(1 for c in calls if c.attempt > 1 and c.fired_late),
        "sampler": lag.summary(),
    }


def elapsed(t0: float) -> float:
    """Seconds since ``t0`` (``time.perf_counter``), rounded for the document."""
    return round(time.perf_counter() - t0, 2)


def fmt(x: Any, spec: str = ".3f") -> str:
    """Format a number for the summary ("-" for None)."""
    return "-" if x is None else format(x, spec)


def fmt_ci(ci: list[float] | None) -> str:
    """An interval ``[lo, hi]`` to 3 decimals, or "-" when there is none."""
    return "-" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"
