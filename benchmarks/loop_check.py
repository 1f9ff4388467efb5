"""The loop check on the stream: what it costs per call and what it does to real loops.

Two measurements, no model and no network:

- **cost**: an answer of ``--tokens`` words (the latency lab's vocabulary, a sentence
  every 12 words, no repetition) streamed one word a token through the hold-back engine
  with the loop check alone; the CPU time of each call (``time.thread_time_ns``, µs) and
  whether the answer passed unchanged.
- **the embedded model's loops**: the eight answers the embedded model gave in the
  tools benchmark (``results/tools_local_model.json``, every one cut at its token cap),
  streamed token by token the same way: which were stopped, after how many of their
  tokens, and what the shopper kept.

Run: ``python benchmarks/loop_check.py`` (writes ``results/loop_check.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import _common as common

from chainrun.checks.holdback import HoldBack
from chainrun.checks.loops import LoopCheck
from chainrun.checks.stream import CheckList
from chainrun.lab.state import WORDS

TOOLS_ANSWERS = Path(__file__).resolve().parent / "results" / "tools_local_model.json"


async def _through(tokens: list[str]) -> tuple[str, HoldBack, LoopCheck]:
    async def source() -> AsyncIterator[str]:
        for t in tokens:
            yield t
            await asyncio.sleep(0)  # one token a loop turn, as a network stream arrives

    check = LoopCheck()
    engine = HoldBack(CheckList([("loop", check)]), 0)
    shown = "".join([p async for p in engine.stream(source())])
    return shown, engine, check


def cost(n_tokens: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) + ("." if i % 12 == 11 else "") for i in range(n_tokens)]
    text = " ".join(words)
    shown, engine, check = asyncio.run(_through(re.findall(r"\S+\s*", text)))
    us = check.check_us
    return {
        "tokens": n_tokens, "calls": len(us), "unchanged": shown == text,
        "stopped": engine.stats.stopped,
        "cpu_us_p50": common.r(common.median(us)), "cpu_us_p99": common.r(common.quantile(us, 99)),
        "cpu_us_max": common.r(max(us)), "cpu_ms_total": common.r(sum(us) / 1000, 2),
    }  # fmt: skip


def real_loops() -> list[dict[str, Any]]:
    import json

    answers = json.loads(TOOLS_ANSWERS.read_text(encoding="utf-8"))["results"]["answers"]
    out = []
    for a in answers:
        tokens = re.findall(r"\S+\s*|\s+", a["text"])
        shown, engine, check = asyncio.run(_through(tokens))
        out.append({
            "question": a["question"], "finish_reason": a["finish_reason"],
            "tokens": len(tokens), "stopped": engine.stats.stopped,
            "tokens_read": engine.stats.tokens_in, "kept": shown,
            "cpu_us_max": common.r(max(check.check_us, default=0.0)),
        })  # fmt: skip
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=600, help="the long answer's words")
    parser.add_argument("--seed", type=int, default=1)
    common.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = common.new_document("loop_check", argv, {"tokens": args.tokens, "seed": args.seed})
    doc["results"] = {"cost": cost(args.tokens, args.seed), "embedded_model_loops": real_loops()}

    def summary(d: dict[str, Any]) -> str:
        c = d["results"]["cost"]
        lines = [f"cost: {c['tokens']} tokens, {c['calls']} calls, CPU p50 {c['cpu_us_p50']} µs, "
                 f"p99 {c['cpu_us_p99']} µs, max {c['cpu_us_max']} µs, total "
                 f"{c['cpu_ms_total']} ms, unchanged {c['unchanged']}"]
        for x in d["results"]["embedded_model_loops"]:
            lines.append(f"{x['question'][:40]:40}  {x['tokens_read']:>3}/{x['tokens']:<3} "
                         f"{'stopped' if x['stopped'] else 'passed '}  {x['kept'].strip()[:50]!r}")
        return "\n".join(lines)

    common.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
