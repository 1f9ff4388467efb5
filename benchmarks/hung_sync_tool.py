"""A shop's order service that stopped answering: ten turns call a sync tool that hangs,
and another shopper's turn (no tool) is timed while they do.

The chain: one streamed answer step on chainrun's fake provider (first token after
``--ttft-ms``), a sync tool ``order_service`` whose callable sleeps ``--hang-s`` (a
service that does not answer) with ``timeout_s = --timeout-s``, logged to PostgreSQL
(``--pg DSN``: the desk's reads of the log go through Python's default thread pool, as
a production log's do) or to a temporary SQLite file. Steps:

1. ``--probes`` unloaded turns ("is JKT-12 in stock?"): their answer TTFT (the log's
   ``answer_ttft_ms``: arrival to first answer token);
2. ``--flood`` concurrent turns whose model calls ``order_service``; after
   ``--timeout-s`` + 1 s (their calls have timed out, the threads still held),
   ``--probes`` more turns, one after another, timed the same way;
3. the flood's turns' durations and statuses, and the tool calls' statuses.

Writes ``benchmarks/results/hung_sync_tool.json`` (``--out``). Runs on the code the
import finds (``PYTHONPATH=.`` for a checkout), so a "before" and an "after" are the same
command in two checkouts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_common_options, finish, median, new_document, r

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply

HANG_S = {"value": 60.0}


def order_service(order_id: int) -> dict[str, Any]:
    """The order service that stopped answering (blocks its thread for ``--hang-s``)."""
    time.sleep(HANG_S["value"])
    return {"order_id": order_id, "status": "shipped"}


def chain(log: str, ttft_s: float, timeout_s: float) -> Chain:
    def script(req: ChatRequest) -> FakeReply:
        if any(m.get("role") == "tool" for m in req.messages):
            return FakeReply("Your order could not be looked up just now.", ttft_s=ttft_s)
        if "order" in req.messages[0]["content"]:
            return FakeReply(tool_calls=[{"id": "c1", "name": "order_service",
                                          "arguments": '{"order_id": 7}'}], ttft_s=ttft_s)
        return FakeReply("Yes, JKT-12 is in stock.", ttft_s=ttft_s, gap_s=0.001)

    cfg = config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": "http://127.0.0.1:9/v1"}},
        "steps": {"answer": {"provider": "local", "prompt": "{message}", "stream": True,
                             "tools": ["order_service"]}},
        "tools": {"order_service": {
            "description": "Look an order up", "function": f"{__name__}:order_service",
            "timeout_s": timeout_s,
            "parameters": {"type": "object", "required": ["order_id"],
                           "properties": {"order_id": {"type": "integer"}}}}},
    })  # fmt: skip
    return Chain(cfg, store=Store.open(log), providers={"local": FakeProvider(
        name="local", script=script)}, quiet=True)  # fmt: skip


async def probes(c: Chain, n: int) -> list[float]:
    out = []
    for i in range(n):
        done = await c.run_turn("is JKT-12 in stock?", conversation_id=f"probe-{time.time()}-{i}")
        out.append(done.answer_ttft_ms or float("nan"))
    return out


async def run(args: argparse.Namespace, log: str) -> dict[str, Any]:
    HANG_S["value"] = args.hang_s
    async with chain(log, args.ttft_ms / 1000.0, args.timeout_s) as c:
        alone = await probes(c, args.probes)
        t0 = time.perf_counter()
        flood = [asyncio.create_task(c.run_turn(f"where is my order {i}?",
                                                conversation_id=f"flood-{i}"))
                 for i in range(args.flood)]  # fmt: skip
        await asyncio.sleep(args.timeout_s + 1.0)
        loaded = await probes(c, args.probes)
        flooded = await asyncio.gather(*flood)
        flood_s = time.perf_counter() - t0
        tool_statuses: dict[str, int] = {}
        for d in flooded:
            for row in c.store.tool_calls([d.run_id]) if c.store is not None else []:
                if row.turn_id == d.turn_id:
                    key = f"{row.status}:{row.error_type}" if row.error_type else row.status
                    tool_statuses[key] = tool_statuses.get(key, 0) + 1
    return {
        "answer_ttft_ms_alone": [r(x) for x in alone],
        "answer_ttft_ms_loaded": [r(x) for x in loaded],
        "answer_ttft_ms_alone_median": r(median(alone)),
        "answer_ttft_ms_loaded_median": r(median(loaded)),
        "loaded_minus_alone_ms": r((median(loaded) or 0) - (median(alone) or 0)),
        "flood_turn_s": sorted(r(d.duration_ms / 1000.0, 2) for d in flooded),
        "flood_statuses": sorted(d.status for d in flooded),
        "flood_all_ended_s": r(flood_s, 2),
        "flood_tool_statuses": tool_statuses,
    }


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    return (f"answer TTFT alone (median): {res['answer_ttft_ms_alone_median']} ms\n"
            f"answer TTFT while {doc['parameters']['flood']} calls hang (median): "
            f"{res['answer_ttft_ms_loaded_median']} ms (each: {res['answer_ttft_ms_loaded']})\n"
            f"flood turns: {res['flood_statuses']} in {res['flood_turn_s']} s; "
            f"tool calls {res['flood_tool_statuses']}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="a PostgreSQL DSN for the log (default: SQLite)")
    parser.add_argument("--flood", type=int, default=10)
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--hang-s", type=float, default=60.0)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    add_common_options(parser)
    args = parser.parse_args(argv)
    params = {k: v for k, v in vars(args).items() if k not in ("json", "out", "pg")}
    params["log"] = "postgresql" if args.pg else "sqlite"
    doc = new_document("hung_sync_tool", sys.argv[1:] if argv is None else argv, params)
    with tempfile.TemporaryDirectory() as tmp:
        log = args.pg or str(Path(tmp) / "log.db")
        doc["results"] = asyncio.run(run(args, log))
    finish(doc, as_json=args.json, summary=summary, out=args.out)
    # the hung calls' threads sleep on: leave without waiting for them
    sys.stdout.flush()
    import os

    os._exit(0)


if __name__ == "__main__":
    main()
