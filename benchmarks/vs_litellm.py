"""The tail against a peer: one call, LiteLLM's Router (two ways) and chainrun's hedge.

Two lab instances serve the ``heavy-tail`` scenario (TTFT
log-normal, median 200 ms, sigma 0.5, plus a slow path of 3-10 s before the first token
with probability 0.05), each with its own seed so that a copy sent to the second is an
independent draw (copies must go to an independent server: Dean and Barroso, 2013). Every arm sends
the same requests (one user message each, ``max_tokens`` 8, not streamed) with the same
number in flight, after both labs are reset to their seeds:

* ``single``: one ``openai.AsyncOpenAI`` call to lab A with a 12 s timeout and no
  retries (longer than the slow path, so every call answers);
* ``litellm_router``: ``litellm.Router`` as its docs suggest for latency: deployment
  ``lab`` (lab A) with ``timeout`` 1 s and ``num_retries`` 2, and a fallback to the
  deployment ``lab-b`` (lab B);
* ``litellm_fastest``: ``Router.abatch_completion_fastest_response`` over both
  deployments (every request sent to both at once, the first answer wins, the other
  cancelled), no retries, 12 s timeout;
* ``chainrun``: a one-step chain on lab A hedged to lab B with ``delay = "auto"``
  (the step re-derives its delay and attempts from its own latency window at run time,
  for the default ``target = "p99"``; ``initial_delay_ms`` 500 until the window holds
  ``min_samples`` observations: the body's p95 is 200 ms x e^(0.5 x 1.645) = 456 ms),
  up to 3 attempts, ``max_extra_load`` 0.1 (the Finagle budget: at most 0.1 copies per
  call), step deadline 12 s; the time includes the chain and its SQLite log.
  ``--hedge-delay p95`` runs the percentile delay instead.

Per arm: ``p50_ms``, ``p99_ms``, ``p999_ms`` with 95% order-statistic intervals
(``chainrun.statistics.intervals``; a bound is null where n cannot give it: the p99.9's upper bound
needs n >= 3,688), ``success_rate`` (answered within the 3 s deadline, Wilson interval),
``upstream_calls_per_request`` from the labs' own request logs, and ``n``. The time of a
request is the caller's wall time from the call to its answer (or its error).

Why a delayed hedge cannot match fire-both on the p99 at <= 1.1 calls per request (the
bound the result is read against): with copies independent and fire rate P(X > d) <= 0.1,
d >= q90 (the 90th percentile of one call); fire-both's p99 is exactly q90 (P(min > t) =
P(X > t)^2 = 0.01), and a hedged request is later than q90 whenever its primary is
(P = 0.1 > 0.01), since its copy cannot answer before d >= q90. So chainrun's p99 is
above fire-both's at that load, by about the time a copy takes.

``litellm`` is a benchmark-only extra (``pip install -e '.[bench]'``); ``--arms
single,chainrun`` runs without it. LiteLLM's remote cost map is not fetched
(``LITELLM_LOCAL_MODEL_COST_MAP``).

Run: ``python benchmarks/vs_litellm.py [--calls 4000] [--concurrency 20] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import _common as c
from openai import AsyncOpenAI

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.statistics.intervals import order_stat_indices, percentile

ARMS = ("single", "litellm_router", "litellm_fastest", "chainrun")
DEADLINE_S = 3.0
#: every arm's give-up time, above the slow path's 10 s: every request gets an answer
GIVE_UP_S = 12.0
MAX_TOKENS = 8
SCENARIO = "heavy-tail"
ROUTER_TIMEOUT_S = 1.0
ROUTER_RETRIES = 2
HEDGE = {
    "delay": "auto",
    "initial_delay_ms": 500.0,
    "max_attempts": 3,
    "max_extra_load": 0.1,
    "targets": ["lab_b"],
}
PERCENTILES = {"p50_ms": 50.0, "p99_ms": 99.0, "p999_ms": 99.9}

Call = Callable[[str], Awaitable[None]]


def messages(n: int) -> list[str]:
    """The requests every arm sends (the same list, in the same order)."""
    items = ("linen shirt", "denim jacket", "wool coat", "chinos", "trainers", "rain mac")
    return [f"Is the {items[i % len(items)]} true to size? (request {i})" for i in range(n)]


async def drive(call: Call, requests: Sequence[str], concurrency: int) -> list[dict[str, Any]]:
    """Send ``requests`` through ``call`` with ``concurrency`` in flight (closed loop).

    Returns one ``{"ms", "ok", "error"}`` per request: the caller's wall time (ms) from
    the call to its return, and the exception's type name when it raised.
    """
    results: list[dict[str, Any]] = [{} for _ in requests]
    queue = iter(enumerate(requests))

    async def worker() -> None:
        for i, message in queue:
            t0 = time.perf_counter()
            error: str | None = None
            try:
                await call(message)
            except Exception as e:  # the arm failed this request: counted, not raised
                error = type(e).__name__
            ms = (time.perf_counter() - t0) * 1000.0
            results[i] = {"ms": ms, "ok": error is None, "error": error}

    async with asyncio.TaskGroup() as tg:
        for _ in range(min(concurrency, len(requests))):
            tg.create_task(worker())
    return results


def quantile_with_ci(values: Sequence[float], p: float) -> dict[str, Any]:
    """The ``p``-th percentile (ms) and its 95% order-statistic interval (null bounds where
    n is too small to give them)."""
    xs = sorted(values)
    lo, hi = order_stat_indices(len(xs), p)
    return {
        "value": round(percentile(xs, p), 1),
        "ci95": [
            None if lo is None else round(xs[lo], 1),
            None if hi is None else round(xs[hi], 1),
        ],
    }


def summarize_arm(results: list[dict[str, Any]], lab_calls: dict[str, int]) -> dict[str, Any]:
    """The issue's keys for one arm (see the module docstring)."""
    n = len(results)
    times = [r["ms"] for r in results]
    in_time = sum(1 for r in results if r["ok"] and r["ms"] <= DEADLINE_S * 1000)
    out: dict[str, Any] = {"n": n}
    for key, p in PERCENTILES.items():
        q = quantile_with_ci(times, p)
        out[key] = q["value"]
        out[key.replace("_ms", "_ci95")] = q["ci95"]
    upstream = sum(lab_calls.values())
    out.update(
        success_rate=round(in_time / n, 4),
        success_ci95=c.wilson(in_time, n),
        upstream_calls_per_request=round(upstream / n, 4),
        upstream_calls=dict(lab_calls),
        errors=dict(Counter(r["error"] for r in results if not r["ok"])),
        max_ms=round(max(times), 1),
    )
    return out


# ------------------------------------------------------------------ the arms


def single_arm(lab_a: LabServer) -> tuple[Call, Callable[[], Awaitable[None]]]:
    client = AsyncOpenAI(base_url=lab_a.base_url, api_key="x", max_retries=0, timeout=GIVE_UP_S)

    async def call(message: str) -> None:
        await client.chat.completions.create(
            model="chainrun-lab",
            messages=[{"role": "user", "content": message}],
            max_completion_tokens=MAX_TOKENS,
        )

    return call, client.close


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError:
        sys.exit(
            "vs_litellm.py: the LiteLLM arms need litellm (pip install -e '.[bench]'); "
            "or run --arms single,chainrun"
        )
    litellm.suppress_debug_info = True
    litellm.telemetry = False
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return litellm


def _deployment(name: str, lab: LabServer, timeout_s: float) -> dict[str, Any]:
    return {
        "model_name": name,
        "litellm_params": {
            "model": "openai/chainrun-lab",
            "api_base": lab.base_url,
            "api_key": "x",
            "timeout": timeout_s,
        },
    }


def router_arm(lab_a: LabServer, lab_b: LabServer) -> tuple[Call, Callable[[], Awaitable[None]]]:
    litellm = _import_litellm()
    router = litellm.Router(
        model_list=[
            _deployment("lab", lab_a, ROUTER_TIMEOUT_S),
            _deployment("lab-b", lab_b, ROUTER_TIMEOUT_S),
        ],
        num_retries=ROUTER_RETRIES,
        timeout=ROUTER_TIMEOUT_S,
        fallbacks=[{"lab": ["lab-b"]}],
    )

    async def call(message: str) -> None:
        await router.acompletion(
            model="lab", messages=[{"role": "user", "content": message}], max_tokens=MAX_TOKENS
        )

    async def close() -> None:
        return None

    return call, close


def fastest_arm(lab_a: LabServer, lab_b: LabServer) -> tuple[Call, Callable[[], Awaitable[None]]]:
    litellm = _import_litellm()
    router = litellm.Router(
        model_list=[_deployment("lab", lab_a, GIVE_UP_S), _deployment("lab-b", lab_b, GIVE_UP_S)],
        num_retries=0,
        timeout=GIVE_UP_S,
    )

    async def call(message: str) -> None:
        await router.abatch_completion_fastest_response(
            model="lab, lab-b",
            messages=[{"role": "user", "content": message}],
            max_tokens=MAX_TOKENS,
        )

    async def close() -> None:
        return None

    return call, close


def chainrun_config(
    lab_a: LabServer, lab_b: LabServer, concurrency: int, hedge: dict[str, Any]
) -> Any:
    """The one-step chain of the ``chainrun`` arm (``hedge``: its ``[hedge]`` table)."""
    pool = max(100, concurrency * 4)
    return config_from_dict(
        {
            "order": [c.STEP],
            "answer_step": c.STEP,
            "providers": {
                "lab": {"base_url": lab_a.base_url, "max_connections": pool},
                "lab_b": {"base_url": lab_b.base_url, "max_connections": pool},
            },
            "steps": {
                c.STEP: {
                    "provider": "lab",
                    "prompt": "{message}",
                    "max_output_tokens": MAX_TOKENS,
                    "deadline_s": GIVE_UP_S,
                    "stream": False,
                    "on_failure": "closed",
                    "hedge": hedge,
                }
            },
        },
        source="benchmark",
    )


# ------------------------------------------------------------------ running


async def run_arm(
    arm: str,
    lab_a: LabServer,
    lab_b: LabServer,
    requests: Sequence[str],
    concurrency: int,
    hedge: dict[str, Any],
) -> dict[str, Any]:
    """Run every request through ``arm`` on freshly reset labs; return its summary."""
    for lab in (lab_a, lab_b):
        lab.reset()
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if arm == "chainrun":
        with c.temp_store() as store:
            config = chainrun_config(lab_a, lab_b, concurrency, hedge)
            async with Chain(config, store=store, kind="live", label=arm, quiet=True) as chain:

                async def call(message: str) -> None:
                    finished = await chain.run_turn(message)
                    if finished.status != "ok":
                        raise RuntimeError(f"turn {finished.status}")

                results = await drive(call, requests, concurrency)
                run_id = chain.run_id
            assert run_id is not None
            stats = c.step_hedge_stats(store, run_id)
            extra["advisor"] = [
                {k: ch[k] for k in ("at", "kind", "old", "new", "why")}
                for s in store.steps(run_id)
                for ch in (s.detail or {}).get("hedge_changes", [])
            ]
            extra["hedge"] = {
                k: stats.get(k)
                for k in (
                    "fire_rate",
                    "win_rate",
                    "extra_calls_per_turn",
                    "budget_exhausted",
                    "mean_delay_ms",
                )
            }
    else:
        make = {
            "single": lambda: single_arm(lab_a),
            "litellm_router": lambda: router_arm(lab_a, lab_b),
            "litellm_fastest": lambda: fastest_arm(lab_a, lab_b),
        }[arm]
        call_fn, close = make()
        try:
            results = await drive(call_fn, requests, concurrency)
        finally:
            await close()
    await asyncio.sleep(0.5)  # let cancelled losers reach the labs' records
    lab_calls = {"lab_a": len(lab_a.requests()), "lab_b": len(lab_b.requests())}
    out = summarize_arm(results, lab_calls)
    out.update(extra, wall_s=c.elapsed(t0))
    return out


def ratios(arms: dict[str, Any]) -> dict[str, Any]:
    """chainrun against the LiteLLM arms, as ratios (chainrun / peer)."""
    cr = arms.get("chainrun")
    out: dict[str, Any] = {}
    if cr is None:
        return out
    for peer in ("litellm_fastest", "litellm_router", "single"):
        other = arms.get(peer)
        if other is None:
            continue
        out[f"chainrun_over_{peer}"] = {
            k: (round(cr[k] / other[k], 3) if other[k] else None)
            for k in ("p50_ms", "p99_ms", "p999_ms", "upstream_calls_per_request")
        }
    fast, router = arms.get("litellm_fastest"), arms.get("litellm_router")
    if fast is not None:
        out["goal_p99_no_worse_than_fastest"] = cr["p99_ms"] <= fast["p99_ms"]
    out["goal_calls_at_most_1_1"] = cr["upstream_calls_per_request"] <= 1.1
    if router is not None:
        out["goal_p999_at_most_half_router"] = cr["p999_ms"] <= router["p999_ms"] / 2
    return out


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = [
        f"{SCENARIO}, {doc['parameters']['calls']} requests per arm, "
        f"{doc['parameters']['concurrency']} in flight, deadline {DEADLINE_S:g} s",
        f"{'arm':<16} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} "
        f"{'in 3 s':>7} {'calls/req':>9}",
    ]
    for arm, m in res["arms"].items():
        lines.append(
            f"{arm:<16} {m['n']:>5} {m['p50_ms']:>8.1f} {m['p99_ms']:>8.1f} "
            f"{m['p999_ms']:>9.1f} {m['success_rate']:>7.4f} "
            f"{m['upstream_calls_per_request']:>9.3f}"
        )
    for key, val in res["ratios"].items():
        lines.append(f"{key}: {val}")
    for ch in res["arms"].get("chainrun", {}).get("advisor", []):
        lines.append(f"advisor {ch['kind']}: {ch['old']} -> {ch['new']}: {ch['why']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000, help="requests per arm")
    parser.add_argument("--concurrency", type=int, default=20, help="requests in flight")
    parser.add_argument("--seed", type=int, default=0, help="lab A's seed (lab B: seed + 1)")
    parser.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)}"
    )
    parser.add_argument(
        "--hedge-delay", default=HEDGE["delay"], help="the chainrun arm's hedge delay (auto or pNN)"
    )
    parser.add_argument(
        "--max-extra-load",
        type=float,
        default=HEDGE["max_extra_load"],
        help="the chainrun arm's hedge budget (copies per call)",
    )
    parser.add_argument(
        "--slow-range-s",
        default="3,10",
        help="the slow path's TTFT range in s, LO,HI (the smoke test shortens it)",
    )
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    try:
        lo, hi = (float(x) for x in args.slow_range_s.split(","))
    except ValueError:
        parser.error("--slow-range-s: expected LO,HI in seconds, e.g. 3,10")
    hedge = {**HEDGE, "delay": args.hedge_delay, "max_extra_load": args.max_extra_load}
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or args.calls < 1 or args.concurrency < 1:
        parser.error(f"--arms: unknown {unknown}" if unknown else "--calls/--concurrency >= 1")
    argv_used = sys.argv[1:] if argv is None else argv
    doc = c.new_document(
        "vs_litellm",
        argv_used,
        {
            "scenario": SCENARIO,
            "slow_range_s": [lo, hi],
            "calls": args.calls,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "deadline_s": DEADLINE_S,
            "give_up_s": GIVE_UP_S,
            "max_tokens": MAX_TOKENS,
            "stream": False,
            "router": {
                "timeout_s": ROUTER_TIMEOUT_S,
                "num_retries": ROUTER_RETRIES,
                "fallbacks": {"lab": ["lab-b"]},
            },
            "chainrun_hedge": hedge,
            "arms": arms,
        },
    )
    requests = messages(args.calls)
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    with (
        LabServer(SCENARIO, seed=args.seed, slow_range_s=(lo, hi)) as lab_a,
        LabServer(SCENARIO, seed=args.seed + 1, slow_range_s=(lo, hi)) as lab_b,
    ):
        for arm in arms:
            results[arm] = asyncio.run(
                run_arm(arm, lab_a, lab_b, requests, args.concurrency, hedge)
            )
    doc["results"] = {"arms": results, "ratios": ratios(results), "wall_s": c.elapsed(t0)}
    doc.update(results)  # the interface: each arm's keys at the top level too
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
