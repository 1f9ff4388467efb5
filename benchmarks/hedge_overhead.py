"""What chainrun adds to a call whose hedge never fires, against the bare ``openai`` client.

The lab's ``fast`` scenario (no time to first token; by default also no pause between
tokens, ``--per-token-ms 0``) serves the same request to four arms, one call at a time,
interleaved round by round (the order rotates every round) so that drift of a shared,
noisy machine falls on all arms alike:

* ``bare``: ``openai.AsyncOpenAI`` with ``stream=True`` and ``include_usage``, read to
  the end (the text joined, as any caller would).
* ``hedger``: chainrun's provider path without the chain: ``OpenAICompatProvider`` +
  ``ChatStream`` (pump task, timing accumulator) inside ``Hedger.run`` (policy with a
  10 s delay: the copy is never due), settled on the whole answer.
* ``chain_nolog``: a one-step ``Chain`` (the same step, ``stream = false``) with no store:
  adds the chain's per-step work (prompt formatting, events, records).
* ``chain_inline``: the same chain logging every turn to a second SQLite file with the
  store's writer thread switched off (the write runs on the event loop, as before
  issue 13): the same-run reference for what the writer thread costs or saves.
* ``chain``: the same chain logging every turn to a SQLite file (one transaction per
  turn: turn, step and call rows) through the store's writer thread, as chainrun runs
  by default: the turn returns once its rows are queued; they are built on the loop's
  next turn and committed by the thread.

Work a call leaves behind (the ``chain`` arm's row building and commit) must not land
in the next arm's timed call: after every call, untimed, the logging arms' stores are
flushed and the loop pauses ``--pause-ms`` (1 ms), the same for every arm. So each
timed call starts with the writer idle; what the caller waits for is what is timed.

Reported per arm: n and the median (p90, mean) per-call time in ms; against ``bare``:
the median of the per-round differences (ms per call) and the ratio of the medians.

Then the same at each ``--concurrency`` width (16 and 64) calls at once, for
``--concurrent-rounds`` rounds: each round runs a batch of ``bare``, ``chain_inline`` and
``chain`` calls (the order rotates), each batch timed from its start. What one call adds
at W at once is
the batch's extra wall time spread over its calls: ``(chain batch wall − bare batch
wall) / calls in the batch``, one value per round (``added_ms_per_call``: median, p99,
n = rounds). The 50 calls share one event loop, so a call's own latency also holds its
wait behind the 49 others' CPU work: the k-th fastest chain call of a round paired
with the k-th fastest bare call (``per_rank_latency``, n = calls) grows with k and
measures that queueing (≈ 25 × the per-call cost at the median), not the cost.

Top level of the JSON document (the full chain with logging, against ``bare``):
``median_added_ms``, ``p99_added_ms`` (with ``p99_added_ci``) and ``n`` for one call at
a time, and ``by_concurrency`` with the same keys for 1 (per call) and for
``--concurrency`` (per call from the batch walls, n = rounds). Each of those also has
``tail_of_each``: the two arms' own p99 call latencies and their difference with a
round-resampling bootstrap interval (:func:`tail_of_each`), the figure gateway
benchmarks publish; ``p99_added_ms`` is the stricter p99 of paired differences.

Run: ``python benchmarks/hedge_overhead.py [--calls 400] [--concurrency 16,64] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import _common as c
import openai

from chainrun.chain import Chain
from chainrun.hedging import AttemptInfo, HedgePolicy, Hedger
from chainrun.lab import LabServer
from chainrun.providers import ChatRequest, ChatStream, OpenAICompatProvider
from chainrun.statistics import intervals as stats

ARMS = ("bare", "hedger", "chain_nolog", "chain_inline", "chain")
MESSAGE = "Does the linen shirt run small?"
MODEL = "chainrun-lab"
NEVER_MS = 10_000.0


def step_config(max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_output_tokens": max_tokens,
        "deadline_s": 30.0,
        "stream": False,
        "hedge": {"delay_ms": NEVER_MS, "max_attempts": 2},
    }


class Arms:
    """The four ways of making the same call; each ``call`` coroutine makes one."""

    def __init__(self, base_url: str, max_tokens: int, store: Any, inline: Any) -> None:
        self.max_tokens = max_tokens
        self.bare = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        self.provider = OpenAICompatProvider("lab", base_url)
        self.hedger: Hedger[ChatStream] = Hedger(
            HedgePolicy(delay_ms=NEVER_MS, max_attempts=2, deadline_s=30.0), ["lab"]
        )
        self.request = ChatRequest(
            model=MODEL,
            messages=[{"role": "user", "content": MESSAGE}],
            max_output_tokens=max_tokens,
        )
        config = c.one_step_config(base_url, step_config(max_tokens), max_connections=100)
        self.chain_nolog = Chain(config, quiet=True)
        self.chain = Chain(config, store=store, kind="live", label="overhead", quiet=True)
        inline.writer = None  # the write on the event loop
        self.chain_inline = Chain(config, store=inline, kind="live", label="inline", quiet=True)

    async def __aenter__(self) -> Arms:
        await self.chain_nolog.open()
        await self.chain.open()
        await self.chain_inline.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.chain.aclose()
        await self.chain_inline.aclose()
        await self.chain_nolog.aclose()
        await self.hedger.aclose()
        await self.provider.aclose()
        await self.bare.close()

    def calls(self) -> dict[str, Callable[[], Awaitable[str]]]:
        return {
            "bare": self.call_bare,
            "hedger": self.call_hedger,
            "chain_nolog": lambda: self.call_chain(self.chain_nolog),
            "chain_inline": lambda: self.call_chain(self.chain_inline),
            "chain": lambda: self.call_chain(self.chain),
        }

    async def call_bare(self) -> str:
        stream = await self.bare.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": MESSAGE}],
            max_completion_tokens=self.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts: list[str] = []
        async with stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
        return "".join(parts)

    async def call_hedger(self) -> str:
        async def attempt(info: AttemptInfo) -> ChatStream:
            s = ChatStream(self.provider, self.request, pump=False)  # as a non-streamed step
            try:
                return await s.collect()
            except BaseException:
                await s.aclose()
                raise

        async def release(s: ChatStream) -> None:
            await s.aclose()

        outcome = await self.hedger.run(attempt, release=release)
        winner = outcome.result()
        await winner.aclose()
        return winner.timer.text

    @staticmethod
    async def call_chain(chain: Chain) -> str:
        done = await chain.run_turn(MESSAGE)
        if done.status != "ok":
            raise RuntimeError(f"chain turn ended {done.status}: {done.error_type}")
        return done.output or ""


class GcPlan:
    """How the garbage collector runs while calls are timed (``--gc``).

    ``paired`` (default): after the warm-up the heap is frozen (``gc.freeze()``: the
    objects of the imports and setup are never traversed again, so no arm meets a full
    collection of them, 40-90 ms on this machine) and automatic collection is off; after
    every call, inside that call's time, one young-generation collection (``gc.collect(0)``)
    collects what that call left. So every call starts with the same (empty) young
    generation, each arm pays for its own garbage and for no other arm's, and no call is
    hit at random by a collection that earlier calls' allocations triggered. Untimed,
    after every round (the same for every arm), ``gc.collect(1)``.
    ``auto``: the collector as the process has it (thresholds 700/10/10): a collection
    lands in whichever call crosses the threshold.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.on = False

    def start(self) -> None:
        if self.mode == "paired" and not self.on:
            gc.collect()
            gc.freeze()
            gc.disable()
            self.on = True

    def after_call(self) -> None:
        """Timed, as the last part of a call."""
        if self.on:
            gc.collect(0)

    def after_round(self) -> None:
        """Untimed."""
        if self.on:
            gc.collect(1)

    def stop(self) -> None:
        if self.on:
            gc.enable()
            gc.unfreeze()
            self.on = False


def pin_cpus(lab_pid: int) -> dict[str, list[int]] | None:
    """The lab (every thread of it) on the last CPU, this process on the first (threads
    started later inherit it): client and server never share or swap cores (other
    sessions' processes still do). None with fewer than 2 CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    for tid in os.listdir(f"/proc/{lab_pid}/task"):
        os.sched_setaffinity(int(tid), {cpus[-1]})
    os.sched_setaffinity(0, {cpus[0]})
    return {"client": [cpus[0]], "lab": [cpus[-1]]}


async def settle(arms: Arms, pause_s: float) -> None:
    """Untimed, after every call: commit what the logging arms queued, then pause."""
    await arms.chain.flush()
    await arms.chain_inline.flush()
    if pause_s > 0:
        await asyncio.sleep(pause_s)


async def measure(
    arms: Arms, rounds: int, warmup: int, pause_s: float, gcp: GcPlan
) -> dict[str, list[float]]:
    """Per-call times in ms per arm; round k runs the arms in an order rotated by k.

    Between calls, untimed: :func:`settle` (the stores flushed, then ``pause_s``), so
    work one call leaves behind is not timed in the next. (Before commit abe3a47 the
    lab's connections kept Nagle on and a request sent on a keep-alive connection soon
    after its previous response waited ~44 ms for a delayed ACK; see README.)
    """
    fns = arms.calls()
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    texts: set[str] = set()
    for k in range(warmup + rounds):
        if k == warmup:
            gcp.start()
        order = ARMS[k % len(ARMS) :] + ARMS[: k % len(ARMS)]
        for arm in order:
            c0 = time.process_time()
            t0 = time.perf_counter()
            text = await fns[arm]()
            gcp.after_call()  # this call's own garbage, in its time (--gc paired)
            dt = (time.perf_counter() - t0) * 1000.0
            await settle(arms, pause_s)
            # the process's CPU (every thread: the writer's commit too) for the call and
            # what it left behind; the pause and flush are the same for every arm
            dc = (time.process_time() - c0) * 1000.0
            texts.add(text)
            if k >= warmup:
                times[arm].append(dt)
                cpu[f"{arm}"].append(dc)
        gcp.after_round()
    if len(texts) != 1:
        raise RuntimeError(f"the arms did not get the same answer: {texts}")
    times.update({f"cpu:{a}": v for a, v in cpu.items()})
    return times


async def measure_concurrent(
    arms: Arms, rounds: int, width: int, warmup: int, pause_s: float, gcp: GcPlan
) -> dict[str, Any]:
    """At ``width`` calls at once: the added ms per call from batch walls (one value
    per round) and the per-rank latency differences, for ``chain`` and ``chain_inline``
    against ``bare``."""
    fns = arms.calls()
    wide_arms = ("bare", "chain_inline", "chain")
    diffs: dict[str, list[float]] = {"chain": [], "chain_inline": []}
    walls: dict[str, list[float]] = {a: [] for a in wide_arms}
    per_call: dict[str, list[float]] = {a: [] for a in wide_arms}

    async def batch(arm: str) -> tuple[float, list[float]]:
        t0 = time.perf_counter()

        async def one() -> float:
            await fns[arm]()
            return (time.perf_counter() - t0) * 1000.0

        times = await asyncio.gather(*(one() for _ in range(width)))
        gcp.after_call()  # the batch's own garbage, in its wall time (--gc paired)
        wall = (time.perf_counter() - t0) * 1000.0
        await settle(arms, pause_s)  # untimed: the batch's queued rows committed
        return wall, sorted(times)

    for k in range(warmup + rounds):
        if k == warmup:
            gcp.start()
        order = wide_arms[k % 3 :] + wide_arms[: k % 3]
        got = {arm: await batch(arm) for arm in order}
        gcp.after_round()
        if k < warmup:
            continue
        for arm in wide_arms:
            walls[arm].append(got[arm][0])
            per_call[arm].extend(got[arm][1])
        for arm in diffs:
            diffs[arm].extend(a - b for a, b in zip(got[arm][1], got["bare"][1], strict=True))

    def per_call_added(arm: str) -> list[float]:
        return [(a - b) / width for a, b in zip(walls[arm], walls["bare"], strict=True)]

    def by_round(arm: str) -> list[list[float]]:
        calls = per_call[arm]
        return [calls[i : i + width] for i in range(0, len(calls), width)]

    return {
        **added_summary(per_call_added("chain")),
        "tail_of_each": tail_of_each(by_round("chain"), by_round("bare")),
        "concurrency": width,
        "rounds": rounds,
        "what": "added ms per call = (chain batch wall - bare batch wall) / calls per batch, "
        "one value per round",
        "bare_batch_wall_median_ms": c.r(statistics.median(walls["bare"]), 3),
        "chain_batch_wall_median_ms": c.r(statistics.median(walls["chain"]), 3),
        "bare_median_ms": c.r(statistics.median(per_call["bare"]), 3),
        "chain_median_ms": c.r(statistics.median(per_call["chain"]), 3),
        "per_rank_latency": added_summary(diffs["chain"]),
        "inline_log": {
            **added_summary(per_call_added("chain_inline")),
            "chain_median_ms": c.r(statistics.median(per_call["chain_inline"]), 3),
            "per_rank_latency": added_summary(diffs["chain_inline"]),
        },
    }


def tail_of_each(chain: list[list[float]], bare: list[list[float]]) -> dict[str, Any]:
    """The gateway benchmarks' figure: each arm's own p99 latency and their difference,
    ``p99(chain calls) - p99(bare calls)`` in ms, with a 95% percentile-bootstrap
    interval that resamples whole rounds (``scipy.stats.bootstrap``, 2,000 resamples,
    seed 0), so the calls of one batch stay together. ``chain``, ``bare``: per round,
    the calls' latencies in ms (one per round one at a time; ``width`` per round).

    This is how LiteLLM's and the gateway benchmarks state a proxy's cost at the tail
    (the direct and the proxied requests' latency percentiles side by side, e.g.
    docs.litellm.ai/docs/benchmarks), against which ``p99_added_ms`` (the p99 of the
    paired per-round differences) is the stricter figure: it also holds the bare
    client's lucky rounds.
    """
    import numpy as np
    from scipy.stats import bootstrap

    def p99(rows: list[list[float]]) -> float:
        return stats.percentile([x for row in rows for x in row], 99)

    def stat(idx: Any) -> float:
        picked = [int(i) for i in idx]
        return p99([chain[i] for i in picked]) - p99([bare[i] for i in picked])

    res = bootstrap((np.arange(len(chain)),), stat, vectorized=False, n_resamples=2000,
                    method="percentile", random_state=0)  # fmt: skip
    ci = res.confidence_interval
    return {
        "bare_p99_ms": c.r(p99(bare), 3),
        "chain_p99_ms": c.r(p99(chain), 3),
        "p99_difference_ms": c.r(p99(chain) - p99(bare), 3),
        "p99_difference_ci": [c.r(float(ci.low), 3), c.r(float(ci.high), 3)],
    }


def added_summary(diffs: list[float]) -> dict[str, Any]:
    """n, median and p99 (with its 95% order-statistics interval) of added ms per call."""
    ci = stats.quantile_ci(diffs, 99)
    return {
        "n": len(diffs),
        "median_added_ms": c.r(statistics.median(diffs), 3),
        "p99_added_ms": c.r(stats.percentile(diffs, 99), 3),
        "p99_added_ci": [c.r(ci[0], 3), c.r(ci[1], 3)] if ci else None,
    }


def describe(times: dict[str, list[float]]) -> dict[str, Any]:
    bare = times["bare"]
    out: dict[str, Any] = {}
    for arm in ARMS:
        ms = times[arm]  # wall ms
        row: dict[str, Any] = {
            "n": len(ms),
            "median_ms": c.r(statistics.median(ms), 3),
            "p90_ms": c.r(c.quantile(ms, 90), 3),
            "p99_ms": c.r(stats.percentile(ms, 99), 3),
            "mean_ms": c.r(statistics.fmean(ms), 3),
        }
        if arm != "bare":
            diffs = [a - b for a, b in zip(ms, bare, strict=True)]
            row["added_median_ms"] = c.r(statistics.median(diffs), 3)
            row["added_median_ms_vs_median"] = c.r(
                statistics.median(ms) - statistics.median(bare), 3
            )
            row["ratio_of_medians"] = c.r(statistics.median(ms) / statistics.median(bare), 3)
        out[arm] = row
    # what each layer adds on top of the one below (medians of paired differences)
    layers = (
        ("hedger", "bare"),
        ("chain_nolog", "hedger"),
        ("chain_inline", "chain_nolog"),
        ("chain", "chain_nolog"),
        ("chain", "chain_inline"),
    )
    # CPU time of this process per call (all threads; the lab is another process):
    # chainrun's own work without the other processes' share of the 2 cores
    out["cpu_ms"] = {}
    for arm in ARMS:
        ms = times[f"cpu:{arm}"]
        row = {
            "median_ms": c.r(statistics.median(ms), 3),
            "p99_ms": c.r(stats.percentile(ms, 99), 3),
        }
        if arm != "bare":
            diffs = [a - b for a, b in zip(ms, times["cpu:bare"], strict=True)]
            row["added_median_ms"] = c.r(statistics.median(diffs), 3)
            row["added_p99_ms"] = c.r(stats.percentile(diffs, 99), 3)
        out["cpu_ms"][arm] = row
    out["layers_added_median_ms"] = {
        f"{upper} - {lower}": c.r(
            statistics.median([a - b for a, b in zip(times[upper], times[lower], strict=True)]), 3
        )
        for upper, lower in layers
    }
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    params = {
        "calls": args.calls,
        "warmup_rounds": args.warmup,
        "scenario": "fast",
        "per_token_ms": args.per_token_ms,
        "n_tokens": args.tokens,
        "hedge_delay_ms": NEVER_MS,
        "order": "interleaved, rotated every round, sequential calls",
        "pause_ms": args.pause_ms,
        "concurrency": args.concurrency,
        "concurrent_rounds": args.concurrent_rounds,
        "gc": args.gc,
        "pin": args.pin,
    }
    doc = c.new_document("hedge_overhead", sys.argv[1:], params)
    t0 = time.perf_counter()
    with (
        LabServer("fast", per_token_ms=args.per_token_ms, n_tokens=args.tokens) as lab,
        c.temp_store() as store,
        c.temp_store() as inline,
    ):
        pinned = pin_cpus(lab.pid) if args.pin else None
        gcp = GcPlan(args.gc)
        async with c.LagSampler() as lag, Arms(lab.base_url, args.tokens, store, inline) as arms:
            try:
                with c.GcPauses() as gc_pauses:
                    times = await measure(arms, args.calls, args.warmup, args.pause_ms / 1000, gcp)
                gcp.stop()
                wides = {}
                for width in args.concurrency:
                    wides[width] = await measure_concurrent(
                        arms, args.concurrent_rounds, width, 1, args.pause_ms / 1000, gcp
                    )
            finally:
                gcp.stop()
            fired = arms.hedger.stats.fires
            chain_run = arms.chain.run_id
            inline_run = arms.chain_inline.run_id
        logged = len(store.turns(chain_run)) if chain_run is not None else 0
        logged_inline = len(inline.turns(inline_run)) if inline_run is not None else 0
    results = describe(times)
    one = {
        **added_summary([a - b for a, b in zip(times["chain"], times["bare"], strict=True)]),
        "tail_of_each": tail_of_each([[x] for x in times["chain"]], [[x] for x in times["bare"]]),
    }
    wide = wides[args.concurrency[-1]]
    results["concurrent"] = wide
    results["concurrent_by_width"] = {str(w): v for w, v in wides.items()}
    # the acceptance interface: the full chain with logging against the bare client
    doc.update(one)
    # one call at a time keeps the key "1"; a --concurrency of 1 (batches of one call,
    # n = rounds) is kept beside it, not written over it
    doc["by_concurrency"] = {"1": {**one, "concurrency": 1},
                             **{_width_key(w): v for w, v in wides.items()}}  # fmt: skip
    results["checks"] = {
        "hedger_fires": fired,
        "turns_logged": logged,
        "turns_run": (args.calls + args.warmup)
        + sum((v["rounds"] + 1) * w for w, v in wides.items()),
        "turns_logged_inline": logged_inline,
        "same_answer_every_arm": True,
    }
    results["client_lag"] = lag.summary()
    results["gc_during_sequential_part"] = gc_pauses.summary()
    results["cpus"] = pinned
    results["wall_s"] = c.elapsed(t0)
    results["includes"] = {
        "hedger": "OpenAICompatProvider (openai client; model_dump_json of every chunk to count "
        "bytes) + ChatStream pump task and StreamTimer + Hedger.run (one attempt task, "
        "budget deposit, latency window)",
        "chain_nolog": "hedger + Chain.run_turn: prompt formatting, request building, "
        "events, StepRecord/CallRecord building (no store)",
        "chain_inline": "chain_nolog + the turn's rows written on the event loop",
        "chain": "chain_nolog + the turn's rows (turn, step and call) written to a temporary "
        "SQLite file by the store's writer thread (the turn returns once its rows are "
        "queued; they are built on the loop's next turn and committed by the thread)",
    }
    doc["results"] = results
    return doc


def _width_key(width: int) -> str:
    return "1 (batches)" if width == 1 else str(width)


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    par = doc["parameters"]
    lines = [
        "",
        f"sequential calls on the lab's fast scenario ({par['n_tokens']} tokens, "
        f"{par['per_token_ms']:g} ms per token), hedge never due",
        f"{'arm':12} {'n':>5} {'median ms':>10} {'p90 ms':>8} {'added ms':>9} {'ratio':>6}",
    ]
    for arm in ARMS:
        row = res[arm]
        lines.append(
            f"{arm:12} {row['n']:>5} {row['median_ms']:>10.2f} {row['p90_ms']:>8.2f} "
            f"{c.fmt(row.get('added_median_ms'), '.2f'):>9} "
            f"{c.fmt(row.get('ratio_of_medians'), '.2f'):>6}"
        )
    lines.append(
        "\nper layer (median of paired differences, ms): "
        + ", ".join(f"{k}: {v:.2f}" for k, v in res["layers_added_median_ms"].items())
    )
    lines.append(
        "added ms = median over rounds of (arm - bare); ratio = median(arm) / median(bare)"
    )
    for key, row in doc["by_concurrency"].items():
        lines.append(
            f"chain with logging vs bare at {key} at once: median added "
            f"{row['median_added_ms']:.3f} ms, p99 added {row['p99_added_ms']:.3f} ms "
            f"(95% CI {c.fmt_ci(row['p99_added_ci'])}), n = {row['n']}"
        )
        tail = row["tail_of_each"]
        lines.append(
            f"  each arm's p99: bare {tail['bare_p99_ms']:.3f} ms, chain "
            f"{tail['chain_p99_ms']:.3f} ms, difference {tail['p99_difference_ms']:.3f} ms "
            f"(95% CI {c.fmt_ci(tail['p99_difference_ci'])}, rounds resampled)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="measured calls per arm (400)")
    parser.add_argument("--warmup", type=int, default=20, help="rounds not measured (20)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer (16)")
    parser.add_argument(
        "--per-token-ms", type=float, default=0.0, help="the lab's pause between tokens (0)"
    )
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=1.0,
        help="untimed pause after every call (and batch), after the stores' flush, in ms (1)",
    )
    parser.add_argument(
        "--concurrency", type=lambda v: [int(x) for x in v.split(",") if x], default=[16, 64],
        help="calls at once in the second part, comma-separated widths, each measured (16,64)",
    )
    parser.add_argument(
        "--concurrent-rounds",
        type=int,
        default=40,
        help="rounds of the second part, one batch per arm each (40)",
    )
    parser.add_argument(
        "--gc",
        choices=("paired", "auto"),
        default="paired",
        help="paired: heap frozen after warm-up, one young collection timed at the end of "
        "every call (each arm pays its own garbage); auto: the collector as is (paired)",
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the lab on the last CPU, the client on the first (--no-pin: anywhere)",
    )
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = asyncio.run(run(args))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
