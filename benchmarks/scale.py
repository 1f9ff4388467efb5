"""The default chain (classify without a model call, retrieve or the shop policy, and
three model steps: compose, validate, critique) against the lab at 1 to 1,000
concurrent turns in one process: a saturating run and a paced run.

Each run starts its own lab server in its own process (sharing the machine's cores with
this one) and logs to a temporary SQLite file through the store's writer thread. The
retrieve step embeds with ``--embedding`` (``hash`` by default, so the figures are
chainrun's and not the MiniLM model's CPU). For each concurrency level N (ascending),
turns run with N in flight (a closed loop: a finished turn starts the next), messages
cycled from the commerce replay set. The chain is opened (catalogue indexed) and warmed
by one turn (not counted) before the level's clock, lag sampler and the lab's request
log start.

**Saturating run** (``results``): the ``lognormal`` lab, median ``--median-ms`` (100 ms)
and 16 tokens 2 ms apart: ``max(N, --min-turns)`` turns per level, all workers started
at once. At 100 and more in flight it offers far more turns per second than two shared
cores can serve, so it gives the throughput ceiling (turns/s at most, CPU per turn);
its loop lag then measures saturation, not scaling.

**Paced run** (``results_paced``): the ``llm-paced`` lab scenario, latencies of
reasoning-model steps: TTFT log-normal with median ``--paced-ttft-ms`` (15 s, sigma
0.25: p99 about 27 s, inside the default steps' 30 s deadlines), then
``--paced-tokens`` (24) tokens ``--paced-token-ms`` (40 ms, 25 tokens/s) apart. Why
this and not a TTFT of a few hundred ms: by Little's law 1,000 turns in flight of D s
each complete 1,000 / D turns/s, and at about 25 ms of client CPU per turn (the
saturating run) one process's loop is saturated at 40 turns/s; staying well under it
(about half) needs D of 50 s or more. With a TTFT of a few hundred ms and tens of
tokens/s a turn of the default chain takes 3 to 10 s (100 to 300 turns/s at 1,000 in
flight), and 1,000 streams at tens of tokens/s are tens of thousands of SSE chunks per
second, each parsed by the ``openai`` client (about 0.1 ms each): several cores, in any
Python process. A step that spends seconds before its first visible token is what a
reasoning model does. ``max(N * --paced-turns-per-slot, --paced-min-turns)`` turns per
level; at N > 1 the workers' starts are spread over ``--paced-ramp-s`` (45 s, about
one turn), and ``turns_per_s`` and the loop lag are taken over the steady window (from
the end of the ramp to the start of the last turn: exactly N turns in flight).

Each level's chain is opened and warmed up, then its start-up objects are frozen out of
the garbage collector and full collections made rare, as ``chainrun serve`` does
(:mod:`chainrun.runtime.gc_settings`; ``--no-gc-freeze`` to compare). ``--uvloop-levels`` (1000)
runs those paced levels again on uvloop, in the same run, when the ``uvloop`` extra is
installed (``results_paced_uvloop``).

Per level (both runs): ``turns_per_s``, ``loop_lag_p99_ms`` (how late a 10 ms timer
wakes up, p99; with n, a 95% interval, p50 and max), ``peak_rss_mb`` (the process's
peak resident set so far: ``ru_maxrss``; levels run ascending so it is the peak up to
this level), ``log_rows_per_s`` (turn + step + call rows written / wall s),
``turns_logged`` (turns of the level in the log; every turn must be there once:
``turns_logged_once`` checks ids and inputs), ``added_ms_per_call`` (median over calls
of the client's call ``duration_ms`` minus the lab's own time for that same request,
``finished_at - received_at``, paired by the response id the lab sent: what the client
side (the ``openai`` client, chainrun, loopback and the shared loop's queueing) adds to
a call; with its p99 and n), ``client_cpu_ms_per_turn`` (this process's CPU over the
level per turn, and by thread: the loop, the log writer, the catalogue readers) and
``lab_cpu_ms_per_turn`` (the lab process's, from ``/proc``), ``gc_pauses`` (the
garbage collector's collections over the level per generation: n, total and longest ms;
they stop the loop).

Run: ``python benchmarks/scale.py [--runs saturating,paced] [--levels 10,100,1000]
[--paced-levels 1,10,100,1000] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import _common as c

from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.lab.scenarios import Lognormal, Scenario
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.replay.run import load_requests
from chainrun.runtime import event_loop
from chainrun.runtime.gc_settings import freeze_startup_objects, rare_full_collections
from chainrun.statistics import intervals as stats

REPLAY = "replays/commerce-12.jsonl"

# The paced run's defaults (why these values: the module docstring).
PACED_LEVELS = "1,10,100,1000"
PACED_TURNS_PER_SLOT = 2
PACED_MIN_TURNS = 3
PACED_RAMP_S = 45.0
PACED_TTFT_MS = 15000.0
PACED_SIGMA = 0.25
PACED_TOKEN_MS = 40.0
PACED_TOKENS = 24


def process_cpu_s() -> float:
    """CPU time (user + system, s) this process has used, all threads (the log writer too)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def thread_cpu_s() -> dict[str, float]:
    """CPU time (user + system, s) of each live thread of this process, by kind: the
    event loop's thread (``loop``), the log writer (``log_writer``), the catalogue
    readers (``catalog_readers``) and any other (``other``), from
    ``/proc/self/task/TID/stat`` (fields 14 and 15, clock ticks; proc(5)). Empty where
    ``/proc`` is not available."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            text = open(f"/proc/self/task/{t.native_id}/stat", encoding="ascii").read()
        except (OSError, TypeError):
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if t is threading.main_thread():
            kind = "loop"
        elif t.name.startswith("chainrun-log-writer"):
            kind = "log_writer"
        elif t.name.startswith("chainrun-catalog"):
            kind = "catalog_readers"
        else:
            kind = "other"
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def peak_rss_mb() -> float:
    """The process's peak resident set size in MB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class Turn:
    """One turn as the driver saw it (times in loop s)."""

    index: int
    turn_id: int | None
    status: str
    started: float
    ended: float


async def drive(
    chain: Any, messages: list[str], n_flight: int, ramp_s: float
) -> tuple[list[Turn], float]:
    """Run one turn per message with ``n_flight`` workers (a closed loop: a finished turn
    starts the next). Worker i starts ``i / n_flight * ramp_s`` s late, so the turns of
    a paced level do not all send their first call in the same millisecond (a burst no
    chat backend sees; 0: all start at once). Returns the turns and the loop time the
    last message was taken (until then exactly ``n_flight`` turns were in flight)."""
    loop = asyncio.get_running_loop()
    turns: list[Turn] = []
    queue = iter(enumerate(messages))
    last_start = loop.time()

    async def worker(delay: float) -> None:
        nonlocal last_start
        if delay > 0:
            await asyncio.sleep(delay)
        for index, message in queue:
            last_start = t0 = loop.time()
            finished = await chain.run_turn(message)
            turns.append(Turn(index, finished.turn_id, finished.status, t0, loop.time()))

    async with asyncio.TaskGroup() as tg:
        for i in range(min(n_flight, len(messages))):
            tg.create_task(worker(i / n_flight * ramp_s))
    turns.sort(key=lambda t: t.index)
    return turns, last_start


def paired_added_ms(calls: list[Any], lab_records: list[dict[str, Any]]) -> list[float]:
    """Per call, the client's ``duration_ms`` minus the lab's own time for the same request
    (``finished_at - received_at``), paired by the response id the lab sent (its record
    id, logged as ``calls.response_id``): what the client side adds to that call."""
    lab_ms = {
        r["id"]: (r["finished_at"] - r["received_at"]) * 1000.0
        for r in lab_records
        if r["finished_at"] is not None and r["completed"]
    }
    return [
        x.duration_ms - lab_ms[x.response_id]
        for x in calls
        if x.duration_ms is not None and x.response_id in lab_ms
    ]


async def level(
    lab: LabServer,
    store: Any,
    n_flight: int,
    n_turns: int,
    messages: list[str],
    embedding: str,
    *,
    ramp_s: float = 0.0,
    pool_connections: int | None = None,
    gc_freeze: bool = False,
    gc_thresholds: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """Run ``n_turns`` turns with ``n_flight`` in flight; the level's figures.

    With ``ramp_s`` > 0 (the paced run) the workers' starts are spread over the ramp and
    the throughput and loop-lag figures are taken over the steady window: from the end
    of the ramp to the start of the last turn, while exactly ``n_flight`` turns were in
    flight; without a ramp, over the whole level (the saturating run, as before).
    ``pool_connections``: the provider's connections per pool (None: the config's
    default; 0: one pool). ``gc_freeze``: after the warm-up turn, freeze the objects
    alive then and make full collections rare, as ``chainrun serve`` does once its
    chain is open (:mod:`chainrun.runtime.gc_settings`; undone after the level);
    ``gc_thresholds``: the collector's thresholds during the level (None: Python's
    700, 10, 10).
    """
    provider: dict[str, Any] = {"base_url": lab.base_url, "max_connections": 4 * n_flight}
    if pool_connections is not None:  # 0: one pool of max_connections (as before pools)
        provider["pool_connections"] = pool_connections or provider["max_connections"]
    config = config_from_dict(
        {
            "providers": {"local": provider},
            "steps": {"retrieve": {"retrieval": {"embedding": {"backend": embedding}}}},
        },
        source="benchmark",
    )
    msgs = [f"{messages[i % len(messages)]} [{i}]" for i in range(n_turns)]
    loop = asyncio.get_running_loop()
    async with c.open_chain(config, store, f"scale-{n_flight}") as chain:
        warm = await chain.run_turn("warm-up")  # first-use work stays out of the level
        lab.reset()
        gc_before = gc.get_threshold()
        if gc_thresholds:
            gc.set_threshold(*gc_thresholds)
        # as chainrun serve does once its chain is open (chainrun.runtime.gc_settings)
        if gc_freeze:
            freeze_startup_objects()
            if not gc_thresholds:
                rare_full_collections()
        async with c.LagSampler(interval_s=0.01) as lag:
            with c.GcPauses() as gc_pauses:
                t0, lt0 = time.perf_counter(), loop.time()
                cpu0, lab_cpu0, threads0 = process_cpu_s(), lab.cpu_s(), thread_cpu_s()
                results, last_start = await drive(chain, msgs, n_flight, ramp_s)
                # turns return once their rows are queued: the level ends when its last
                # commit is in, so that the log writer's tail is inside its time and rows/s
                await chain.flush()
                cpu1, lab_cpu1, threads1 = process_cpu_s(), lab.cpu_s(), thread_cpu_s()
                wall = time.perf_counter() - t0
        run_id = chain.run_id
        gc.set_threshold(*gc_before)
        gc.unfreeze()
    assert run_id is not None
    turns = [t for t in store.turns(run_id) if t.id != warm.turn_id]
    steps = [x for x in store.steps(run_id) if x.turn_id != warm.turn_id]
    calls = [x for x in store.calls(run_id) if x.turn_id != warm.turn_id]
    records = lab.requests()
    lab_ms = [
        (r["finished_at"] - r["received_at"]) * 1000.0
        for r in records
        if r["finished_at"] is not None
    ]
    client_ms = [x.duration_ms for x in calls if x.duration_ms is not None]
    added = paired_added_ms(calls, records)
    if ramp_s > 0:  # the steady window: exactly n_flight turns in flight
        w0, w1 = lt0 + ramp_s, last_start
        window_s = max(0.0, w1 - w0)
        done_in_window = sum(1 for t in results if w0 <= t.ended <= w1)
        lags = [ms for t, ms in lag.samples if w0 <= t <= w1]
        rate = done_in_window / window_s if window_s > 0 else None
    else:
        window_s, lags, rate = wall, [ms for _, ms in lag.samples], n_turns / wall
    lag_ci = stats.quantile_ci(lags, 99)
    ids = [t.turn_id for t in results]
    once = len(set(ids)) == len(ids) == len(turns) and sorted(t.input for t in turns) == sorted(
        msgs
    )
    durations = [(t.ended - t.started) * 1000.0 for t in results]
    return {
        "concurrency": n_flight,
        "event_loop": event_loop.loop_name(loop),
        "turns": n_turns,
        "wall_s": round(wall, 3),
        "ramp_s": ramp_s,
        "window_s": round(window_s, 3),
        "turns_per_s": c.r(rate, 2),
        "loop_lag_p99_ms": c.r(stats.percentile(lags, 99), 2) if lags else None,
        "loop_lag_p99_ci": [c.r(lag_ci[0], 2), c.r(lag_ci[1], 2)] if lag_ci else None,
        "loop_lag_n": len(lags),
        "loop_lag_p50_ms": c.r(stats.percentile(lags, 50), 2) if lags else None,
        "loop_lag_max_ms": c.r(max(lags), 2) if lags else None,
        "peak_rss_mb": c.r(peak_rss_mb(), 1),
        "log_rows_per_s": c.r((len(turns) + len(steps) + len(calls)) / wall, 1),
        "turns_logged": len(turns),
        "turns_logged_once": once,
        "statuses": {s: sum(1 for t in turns if t.status == s) for s in {t.status for t in turns}},
        "turn_p50_ms": c.r(statistics.median(durations), 1),
        "calls": len(calls),
        "client_cpu_ms_per_turn": c.r((cpu1 - cpu0) * 1000.0 / n_turns, 2),
        "client_cpu_ms_per_turn_by_thread": {
            k: c.r((v - threads0.get(k, 0.0)) * 1000.0 / n_turns, 2) for k, v in threads1.items()
        },
        "lab_cpu_ms_per_turn": c.r((lab_cpu1 - lab_cpu0) * 1000.0 / n_turns, 2)
        if lab_cpu0 is not None and lab_cpu1 is not None
        else None,
        "client_cpu_share": c.r((cpu1 - cpu0) / wall, 3),
        # the collector's pauses over the level (gc.callbacks; any thread: they hold the GIL)
        "gc_pauses": gc_pauses.summary(),
        "client_call_p50_ms": c.r(statistics.median(client_ms), 2) if client_ms else None,
        "lab_request_p50_ms": c.r(statistics.median(lab_ms), 2) if lab_ms else None,
        "added_ms_per_call": c.r(statistics.median(added), 2) if added else None,
        "added_ms_per_call_p99": c.r(stats.percentile(added, 99), 2) if added else None,
        "added_ms_per_call_n": len(added),
    }


def paced_scenario(args: argparse.Namespace) -> Scenario:
    """The paced run's lab scenario (see ``--paced-*`` and the module docstring)."""
    return Scenario(
        name="llm-paced",
        latency=Lognormal(median_ms=args.paced_ttft_ms, sigma=args.paced_sigma),
        per_token_ms=args.paced_token_ms,
        n_tokens=args.paced_tokens,
    )


async def saturating_run(
    args: argparse.Namespace, levels: list[int], messages: list[str]
) -> dict[str, Any]:
    """The saturating run's levels (its own lab and log)."""
    out: dict[str, Any] = {}
    with (
        LabServer("lognormal", median_ms=args.median_ms, n_tokens=args.tokens) as lab,
        c.temp_store() as store,
    ):
        for n in levels:
            out[str(n)] = await level(
                lab, store, n, max(n, args.min_turns), messages, args.embedding,
                pool_connections=args.pool_connections,
                gc_freeze=args.gc_freeze, gc_thresholds=args.gc_thresholds,
            )  # fmt: skip
    return out


async def paced_run(
    args: argparse.Namespace, scenario: Scenario, levels: list[int], messages: list[str]
) -> dict[str, Any]:
    """The paced run's levels (its own lab and log), on the running loop."""
    out: dict[str, Any] = {}
    with LabServer(scenario) as lab, c.temp_store() as store:
        for n in levels:
            n_turns = max(n * args.paced_turns_per_slot, args.paced_min_turns)
            ramp = args.paced_ramp_s if n > 1 else 0.0
            out[str(n)] = await level(
                lab, store, n, n_turns, messages, args.embedding, ramp_s=ramp,
                pool_connections=args.pool_connections,
                gc_freeze=args.gc_freeze, gc_thresholds=args.gc_thresholds,
            )  # fmt: skip
    return out


def uvloop_factory() -> Any:
    """``uvloop.new_event_loop``, or None when uvloop is not installed."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both runs on asyncio's loop, then the ``--uvloop-levels`` of the paced run again on
    uvloop (a loop of its own, with its own lab and log), all in this one process."""
    runs = [x.strip() for x in args.runs.split(",") if x.strip()]
    levels = [int(x) for x in args.levels.split(",")]
    paced_levels = [int(x) for x in args.paced_levels.split(",")]
    # the uvloop arm repeats paced levels only
    uv_levels = [int(x) for x in args.uvloop_levels.split(",") if x.strip()]
    uv_levels = [n for n in uv_levels if n in paced_levels]
    scenario = paced_scenario(args)
    factory = uvloop_factory() if "paced" in runs and uv_levels else None
    params = {
        "runs": runs,
        "levels": levels,
        "min_turns": args.min_turns,
        "scenario": "lognormal",
        "median_ms": args.median_ms,
        "n_tokens": args.tokens,
        "chain": "default (classify, retrieve or policy, compose, validate, critique) on the lab",
        "loop_lag_timer_ms": 10,
        "embedding": args.embedding,
        "pool_connections": args.pool_connections,
        "gc_freeze": args.gc_freeze,
        "gc_thresholds": args.gc_thresholds,
        "sse_parser": "openai SDK" if args.sdk_sse else "chainrun (chat_sse)",
        # the lab is uvicorn with loop="auto": uvloop when installed, in both arms
        "lab_event_loop": "uvloop" if uvloop_factory() and event_loop.wanted() == "auto"
        else "asyncio",
        "paced": {
            "levels": paced_levels,
            "turns_per_slot": args.paced_turns_per_slot,
            "min_turns": args.paced_min_turns,
            "ramp_s": args.paced_ramp_s,
            "scenario": scenario.model_dump(mode="json"),
            "uvloop_levels": uv_levels if factory is not None else "uvloop not installed",
        },
    }
    doc = c.new_document("scale", sys.argv[1:], params)
    messages = [r.message for r in load_requests(REPLAY)]
    OpenAICompatProvider.sdk_sse = args.sdk_sse
    with asyncio.Runner() as runner:  # asyncio's own loop, whatever is installed
        if "saturating" in runs:
            doc["results"] = runner.run(saturating_run(args, levels, messages))
        if "paced" in runs:
            doc["results_paced"] = runner.run(paced_run(args, scenario, paced_levels, messages))
    if factory is not None:
        with asyncio.Runner(loop_factory=factory) as runner:
            doc["results_paced_uvloop"] = runner.run(
                paced_run(args, scenario, uv_levels, messages)
            )
    elif "paced" in runs and uv_levels:
        print("scale.py: uvloop is not installed: no uvloop levels", file=sys.stderr)
    return doc


def summary(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    for key, title in (
        ("results", "saturating run"),
        ("results_paced", "paced run"),
        ("results_paced_uvloop", "paced run on uvloop"),
    ):
        if key not in doc:
            continue
        lines += [
            "",
            title,
            f"{'in flight':>9} {'turns':>6} {'turns/s':>8} {'lag p99':>8} {'RSS MB':>7} "
            f"{'rows/s':>8} {'added/call':>10} {'logged':>7} {'cpu/turn':>8} {'lab/turn':>8}",
        ]
        for row in doc[key].values():
            lines.append(
                f"{row['concurrency']:>9} {row['turns']:>6} {c.fmt(row['turns_per_s'], '.1f'):>8} "
                f"{c.fmt(row['loop_lag_p99_ms'], '.1f'):>8} {row['peak_rss_mb']:>7.1f} "
                f"{row['log_rows_per_s']:>8.0f} {c.fmt(row['added_ms_per_call'], '.2f'):>10} "
                f"{row['turns_logged']:>7} {c.fmt(row['client_cpu_ms_per_turn'], '.1f'):>8} "
                f"{c.fmt(row['lab_cpu_ms_per_turn'], '.1f'):>8}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="The JSON document holds the saturating run's levels under 'results' and the "
        "paced run's under 'results_paced', each keyed by the number in flight with the "
        "same fields (turns_per_s, loop_lag_p99_ms, peak_rss_mb, added_ms_per_call, "
        "turns_logged, ...).",
    )
    parser.add_argument(
        "--runs",
        default="saturating,paced",
        help="which runs: saturating (the lognormal lab, median --median-ms: the throughput "
        "ceiling), paced (the llm-paced lab scenario below: scaling with turns in flight "
        "under the ceiling) or both (default)",
    )
    parser.add_argument(
        "--levels", default="10,100,1000", help="saturating run: turns in flight (10,100,1000)"
    )
    parser.add_argument(
        "--min-turns", type=int, default=100, help="saturating run: turns per level at least (100)"
    )
    parser.add_argument(
        "--median-ms", type=float, default=100.0, help="saturating run: lab median TTFT (100)"
    )
    parser.add_argument(
        "--tokens", type=int, default=16, help="saturating run: tokens per answer (16)"
    )
    parser.add_argument(
        "--paced-levels", default=PACED_LEVELS, help=f"paced run: turns in flight ({PACED_LEVELS})"
    )
    parser.add_argument(
        "--paced-turns-per-slot", type=int, default=PACED_TURNS_PER_SLOT,
        help=f"paced run: turns per level = in flight x this ({PACED_TURNS_PER_SLOT})",
    )  # fmt: skip
    parser.add_argument(
        "--paced-min-turns", type=int, default=PACED_MIN_TURNS,
        help=f"paced run: turns per level at least ({PACED_MIN_TURNS})",
    )  # fmt: skip
    parser.add_argument(
        "--paced-ramp-s", type=float, default=PACED_RAMP_S,
        help=f"paced run: the workers' starts are spread over this many s; figures are taken "
        f"after it ({PACED_RAMP_S:g}; none at 1 in flight)",
    )  # fmt: skip
    parser.add_argument(
        "--paced-ttft-ms", type=float, default=PACED_TTFT_MS,
        help=f"paced run: the lab's median TTFT in ms, log-normal ({PACED_TTFT_MS:g})",
    )  # fmt: skip
    parser.add_argument(
        "--paced-sigma", type=float, default=PACED_SIGMA,
        help=f"paced run: the TTFT's log-normal sigma ({PACED_SIGMA:g})",
    )  # fmt: skip
    parser.add_argument(
        "--paced-token-ms", type=float, default=PACED_TOKEN_MS,
        help=f"paced run: time between tokens in ms ({PACED_TOKEN_MS:g}, i.e. "
        f"{1000 / PACED_TOKEN_MS:g} tokens/s)",
    )  # fmt: skip
    parser.add_argument(
        "--paced-tokens", type=int, default=PACED_TOKENS,
        help=f"paced run: tokens per answer, capped by each step's max_output_tokens "
        f"({PACED_TOKENS})",
    )  # fmt: skip
    parser.add_argument(
        "--embedding",
        default="hash",
        choices=["hash", "minilm"],
        help="the retrieve step's embedder: hash (default: chainrun's own cost, no model "
        "CPU) or minilm (the default chain's, whose model runs on the same 2 cores)",
    )
    parser.add_argument(
        "--pool-connections", type=int, default=None,
        help="the provider's HTTP connections per pool (default: the config's, "
        "chainrun.providers.pool.POOL_CONNECTIONS; 0: one pool of max_connections)",
    )  # fmt: skip
    parser.add_argument(
        "--uvloop-levels", default="1000",
        help="paced run: these of --paced-levels again on uvloop, after the asyncio ones, in "
        "the same run (1000; empty: none; needs the uvloop extra)",
    )  # fmt: skip
    parser.add_argument(
        "--sdk-sse", action="store_true",
        help="parse streams in the openai client (its ChatCompletionChunk models) instead of "
        "chainrun's ChatSSEParser, to compare",
    )  # fmt: skip
    parser.add_argument(
        "--no-gc-freeze", dest="gc_freeze", action="store_false",
        help="do not freeze the start-up objects nor make full collections rare after each "
        "level's warm-up turn (by default both, as chainrun serve does: "
        "chainrun.runtime.gc_settings)",
    )  # fmt: skip
    parser.add_argument(
        "--gc-thresholds", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
        help="the collector's three thresholds during a level, e.g. 700,10,100 (default: "
        "Python's, 700,10,10)",
    )  # fmt: skip
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = run(args)
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
