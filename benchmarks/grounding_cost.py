"""What the grounding check costs the shopper: paired, check on and off, on the lab.

The lab (a real HTTP server on loopback) streams one fixed answer, token by token every
``--token-ms`` ms: a sentence of prose, then three catalogue lines of the turn's
products (one with a wrong price, so the check corrects as it would in a shop). A chain
of ``retrieve`` → ``compose`` (the default compose step, streamed, through the real
``openai`` client) runs each request twice, once with ``[steps.compose.grounding]`` on
(the default) and once with ``enabled = false``, the order alternating request by
request, so that a shared machine's drift falls on both arms alike.

Per request and arm, measured in the client at the library's stream
(:meth:`chainrun.Chain.stream_turn`): the answer's TTFT (the first ``TokenDelta`` of
compose, ms from the turn's start) and its last token; then the paired differences
(on − off) with their median and a distribution-free 95% interval
(:func:`chainrun.statistics.intervals.quantile_ci`, n = pairs). Per-window CPU: the
grounding check's ``time.thread_time_ns`` per call (the event loop thread's CPU; one
call a token), µs, p50, p99 and max with n. The log's ``answer_ttft_ms`` (first token
at arrival from the provider) is reported too.

Run (a timing: under the heavy lock)::

    flock /tmp/chainrun-heavy.lock python benchmarks/grounding_cost.py [--pairs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from typing import Any

import _common as c

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.events import TokenDelta
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import WireFrame
from chainrun.log.store import Store
from chainrun.statistics.intervals import percentile, quantile_ci

NAME = "grounding_cost"
MESSAGE = "Do you have rain jackets?"
#: the answer the lab streams: prose, then three of the turn's products (JKT-005, JKT-009,
#: JKT-003: what the sample catalogue's search finds for MESSAGE), the third at a wrong price
ANSWER = (
    "Here are three rain jackets from our range that keep showers out on the commute.\n"
    "- [JKT-005] Women's City Drizzle Packable Rain Jacket (yellow) | jackets | €49.95\n"
    "- [JKT-009] Men's City Drizzle Packable Rain Jacket (yellow) | jackets | €49.95\n"
    "- [JKT-003] Men's Storm Shell Waterproof Rain Jacket (navy) | jackets | €99.00\n"
    "Each packs into its own pocket, so it is easy to carry."
)


#: every stream check the chain made (kept for their per-call CPU times)
CHECKS: list[Any] = []


def _keep_checks() -> None:
    """Keep each turn's grounding check (its ``check_us``: CPU µs per call)."""
    from chainrun.steps.grounding import AnswerGrounding

    made = AnswerGrounding.stream_check

    def stream_check(self: AnswerGrounding, values: Any) -> Any:
        check = made(self, values)
        CHECKS.append(check)
        return check

    AnswerGrounding.stream_check = stream_check  # type: ignore[method-assign]


def frames(token_ms: float) -> list[WireFrame]:
    def chunk(content: str, finish: str | None = None) -> str:
        delta = {"content": content} if content else {}
        body = {"id": "chatcmpl-c1", "object": "chat.completion.chunk", "created": 1733040000,
                "model": "m", "choices": [{"index": 0, "delta": delta,
                                           "finish_reason": finish}]}  # fmt: skip
        return f"data: {json.dumps(body)}\n\n"

    tokens = re.findall(r"\S+\s*|\s+", ANSWER)
    out = [WireFrame(after_ms=token_ms, data=chunk(t)) for t in tokens]
    out.append(WireFrame(data=chunk("", "stop")))
    out.append(WireFrame(data="data: [DONE]\n\n"))
    return out


def config(base_url: str, on: bool) -> Any:
    return config_from_dict({
        "order": ["retrieve", "compose"],
        "providers": {"local": {"base_url": base_url}},
        "steps": {"retrieve": {"when": {}},
                  "compose": {"grounding": {"enabled": on}, "deadline_s": 120.0,
                              "prompt": "Catalogue matches:\n{products}\n\nShopper: "
                                        "{message}\nStylist:"}},
    })  # fmt: skip


async def one(chain: Chain) -> dict[str, Any]:
    t0 = time.perf_counter()
    first = last = None
    text = []
    async for ev in chain.stream_turn(MESSAGE):
        if isinstance(ev, TokenDelta) and ev.step == "compose":
            now = (time.perf_counter() - t0) * 1000.0
            first = now if first is None else first
            last = now
            text.append(ev.text)
    return {"ttft_ms": first, "last_ms": last, "text": "".join(text)}


def stats_of(values: list[float]) -> dict[str, Any]:
    ci = quantile_ci(values, 50)
    return {"n": len(values), "p50": round(percentile(values, 50), 3),
            "p50_ci": [round(ci[0], 3), round(ci[1], 3)] if ci else None}  # fmt: skip


async def run(pairs: int, token_ms: float) -> dict[str, Any]:
    _keep_checks()
    rows: list[dict[str, Any]] = []
    cpu_us: list[float] = []
    with LabServer(Scenario(name="grounding-cost", wire=frames(token_ms))) as lab, \
            Store.open(":memory:") as store:  # fmt: skip
        chains = {arm: Chain(config(lab.base_url, arm == "on"), store=store, quiet=True)
                  for arm in ("on", "off")}  # fmt: skip
        for ch in chains.values():
            await ch.__aenter__()
        try:
            for arm in ("on", "off"):  # warm-up: first turn of each chain not counted
                await one(chains[arm])
            for i in range(pairs):
                order = ("on", "off") if i % 2 == 0 else ("off", "on")
                pair: dict[str, Any] = {}
                for arm in order:
                    pair[arm] = await one(chains[arm])
                rows.append(pair)
        finally:
            for ch in chains.values():
                await ch.__aexit__(None, None, None)
        await store.flush()
        answer_ttft = {}
        for arm, ch in chains.items():
            logged = [t.answer_ttft_ms for t in store.turns(ch.run_id or 0)][1:]  # no warm-up
            answer_ttft[arm] = stats_of([v for v in logged if v is not None])
    for check in CHECKS[2:]:  # the warm-up turn's check left out
        cpu_us.extend(check.grounding.check_us)
    on_ttft = [r["on"]["ttft_ms"] for r in rows]
    off_ttft = [r["off"]["ttft_ms"] for r in rows]
    d_ttft = [a - b for a, b in zip(on_ttft, off_ttft, strict=True)]
    d_last = [r["on"]["last_ms"] - r["off"]["last_ms"] for r in rows]
    cpu = sorted(cpu_us)
    return {
        "pairs": pairs, "token_ms": token_ms,
        "ttft_on": stats_of(on_ttft), "ttft_off": stats_of(off_ttft),
        "ttft_diff_on_minus_off": stats_of(d_ttft),
        "last_token_on": stats_of([r["on"]["last_ms"] for r in rows]),
        "last_token_off": stats_of([r["off"]["last_ms"] for r in rows]),
        "last_token_diff_on_minus_off": stats_of(d_last),
        "cpu_us_per_window": {"n": len(cpu), "p50": round(percentile(cpu, 50), 2) if cpu else None,
                              "p99": round(percentile(cpu, 99), 2) if cpu else None,
                              "max": round(cpu[-1], 2) if cpu else None},
        "answer_on": rows[0]["on"]["text"] if rows else None,
        "answer_off": rows[0]["off"]["text"] if rows else None,
        "log_answer_ttft": answer_ttft,
    }  # fmt: skip


def summary(doc: dict[str, Any]) -> str:
    r = doc["results"]

    def line(name: str, s: dict[str, Any]) -> str:
        return f"{name:<34} p50 {s['p50']:>9.3f} ms {s['p50_ci']} (n = {s['n']})"

    cpu = r["cpu_us_per_window"]
    return "\n".join([
        line("answer TTFT, check on", r["ttft_on"]), line("answer TTFT, check off", r["ttft_off"]),
        line("  paired on - off", r["ttft_diff_on_minus_off"]),
        line("last token, check on", r["last_token_on"]),
        line("last token, check off", r["last_token_off"]),
        line("  paired on - off", r["last_token_diff_on_minus_off"]),
        f"CPU per window (one check a token): p50 {cpu['p50']} µs, p99 {cpu['p99']} µs, "
        f"max {cpu['max']} µs (n = {cpu['n']})",
        f"the log's answer_ttft_ms (first token at arrival): on {r['log_answer_ttft']['on']}, "
        f"off {r['log_answer_ttft']['off']}",
        f"shown with the check: {r['answer_on']!r}",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200, help="requests, each in both arms")
    parser.add_argument("--token-ms", type=float, default=10.0, help="the lab's token pace")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = c.new_document(NAME, argv or [], vars(args))
    doc["results"] = asyncio.run(run(args.pairs, args.token_ms))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
