"""How often the shopper's reply to a pending ``confirm = true`` action runs it, through
``POST /chat`` end to end.

For every reply: a new conversation asks "put 2 of JKT-12 in my cart" (the model, the
in-process fake provider, calls ``add_to_cart``, a tool with ``confirm = true``: chainrun
asks "Add 2 x JKT-12 to your cart?" and the action waits), then sends the reply as the
conversation's next message; the benchmark counts the tool's runs for that action (the
tool is this module's :func:`add_to_cart`, keyed by the action's idempotency key). The
serve app runs under uvicorn on loopback, as ``chainrun serve`` runs it; nothing leaves
the machine.

Replies:

* **CLINC150 test split** (``evals/corpora/clinc150/test_replies_and_orders.jsonl``: the
  30 test utterances of each of ``yes``, ``no``, ``maybe``, ``cancel``; Larson et al.,
  EMNLP 2019, CC BY 3.0). Nothing was built from them.
* **Our own replies** (``evals/confirm_replies.jsonl``: 184 in six languages, emoji, shop
  replies and new requests; written before the reader was tuned; ``split`` = ``dev`` was
  read while tuning, ``held_out`` was not: figures on ``dev`` are upper bounds).

A yes should run the action (rate with a 95% Wilson interval); every other reply (no,
cancel, maybe/unsure, a new request) must never run it (wrong runs, listed). Run::

    python benchmarks/confirm_replies.py [--concurrency 8] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import _common as c
import httpx2
import uvicorn

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.serve import ServeState, create_app
from chainrun.serve.server import bind

ROOT = Path(__file__).resolve().parents[1]
CLINC = ROOT / "evals" / "corpora" / "clinc150" / "test_replies_and_orders.jsonl"
OWN = ROOT / "evals" / "confirm_replies.jsonl"
ASK = "put 2 of JKT-12 in my cart"
QUESTION = "Add 2 x JKT-12 to your cart?"

#: the tool's runs: idempotency key (the action's id) → runs
RUNS: dict[str, int] = {}


async def add_to_cart(sku: str, qty: int, idempotency_key: str) -> dict[str, Any]:
    """The side-effecting tool the replies confirm: counts its runs by action."""
    RUNS[idempotency_key] = RUNS.get(idempotency_key, 0) + 1
    return {"added": sku, "qty": qty}


def chain_config() -> Any:
    """One streamed answer step that may call ``add_to_cart`` (``confirm = true``)."""
    cart = {"description": "Add a product to the cart", "function": f"{__name__}:add_to_cart",
            "side_effects": True, "confirm": True, "confirm_question": "Add {qty} x {sku} to "
            "your cart?", "parameters": {"type": "object", "required": ["sku", "qty"],
                                         "properties": {"sku": {"type": "string"},
                                                        "qty": {"type": "integer"}}}}  # fmt: skip
    step = {"provider": "local", "prompt": "{message}", "stream": True, "deadline_s": 10.0,
            "on_failure": "closed", "tools": ["add_to_cart"]}  # fmt: skip
    return config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": "http://127.0.0.1:9/v1"}},
        "steps": {"answer": step}, "tools": {"add_to_cart": cart},
    })  # fmt: skip


def fake_model() -> FakeProvider:
    """The model: asks for the cart (round 0), answers from the tool's result (round 1)."""
    call = FakeReply(tool_calls=[{"id": "call_1", "name": "add_to_cart",
                                  "arguments": json.dumps({"sku": "JKT-12", "qty": 2})}],
                     gap_s=0.0)  # fmt: skip
    done = FakeReply("Done: two JKT-12 are in your cart.", gap_s=0.0)

    def script(req: ChatRequest) -> FakeReply:
        asked = any(m.get("role") == "assistant" and m.get("tool_calls") for m in req.messages)
        return done if asked else call

    return FakeProvider(name="local", script=script)


async def events(client: httpx2.AsyncClient, body: dict[str, Any]) -> AsyncIterator[
        tuple[str, Any]]:  # fmt: skip
    """(event, data) of one ``POST /chat`` (server-sent events, data JSON)."""
    async with client.stream("POST", "/chat", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"/chat answered {resp.status_code}: {await resp.aread()!r}")
        event, data = "message", []
        async for line in resp.aiter_lines():
            if line == "":
                if data:
                    yield event, json.loads("\n".join(data))
                event, data = "message", []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())


async def one_reply(client: httpx2.AsyncClient, conversation: str, reply: str) -> dict[str, Any]:
    """Ask, then reply: the runs the action got and what the reply did (:func:`outcome`)."""
    asked = [d async for e, d in events(client, {"message": ASK,
                                                 "conversation_id": conversation})
             if e == "action"]  # fmt: skip
    if len(asked) != 1 or asked[0]["question"] != QUESTION:
        raise RuntimeError(f"{conversation}: the ask gave {asked!r}")
    action_id = asked[0]["id"]
    output = ""
    async for e, d in events(client, {"message": reply, "conversation_id": conversation}):
        if e == "turn":
            output = d.get("output") or ""
    runs = RUNS.get(action_id, 0)
    return {"runs": runs, "outcome": outcome(runs, output)}


def outcome(runs: int, output: str) -> str:
    """What the reply did: ``ran`` (the action), ``denied`` (chainrun said nothing was
    done), ``asked_again`` (chainrun asked again), ``turn_ran`` (the turn ran as a new
    request; the action was denied or kept: not run)."""
    if runs:
        return "ran"
    if output.startswith("Okay, I have not done it"):
        return "denied"
    if output.startswith("Please answer yes or no"):
        return "asked_again"
    return "turn_ran"


def load_cases() -> list[dict[str, Any]]:
    """Every reply with its set, its expected reading and whether it should run."""
    cases = []
    for line in CLINC.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        if d["intent"] in ("yes", "no", "maybe", "cancel"):
            cases.append({"set": "clinc150_test", "group": d["intent"], "reply": d["text"],
                          "should_run": d["intent"] == "yes"})  # fmt: skip
    for line in OWN.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        cases.append({"set": f"own_{d['split']}", "group": d["expect"], "reply": d["reply"],
                      "lang": d["lang"], "should_run": d["expect"] == "yes"})  # fmt: skip
    return cases


async def measure(concurrency: int) -> list[dict[str, Any]]:
    """Every case through ``/chat`` (``concurrency`` conversations at once)."""
    cases = load_cases()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "log.db")
        state = ServeState(lambda: Chain(chain_config(), store=store,
                                         providers={"local": fake_model()}, quiet=True))
        app = create_app(state)
        sock = bind("127.0.0.1", 0)
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()  # the server failed to start: its error
                await asyncio.sleep(0.01)
            await asyncio.wait_for(state.wait_ready(), 60)
            gate = asyncio.Semaphore(concurrency)
            async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                          timeout=60) as client:  # fmt: skip

                async def run(i: int, case: dict[str, Any]) -> None:
                    async with gate:
                        case.update(await one_reply(client, f"reply-{i}", case["reply"]))

                await asyncio.gather(*(run(i, case) for i, case in enumerate(cases)))
        finally:
            server.should_exit = True
            await task
            sock.close()
            store.close()
    return cases


def tally(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per set and group: runs of the replies that should run, wrong runs of the rest."""
    out: dict[str, Any] = {}
    for name in sorted({x["set"] for x in cases}):
        mine = [x for x in cases if x["set"] == name]
        yes = [x for x in mine if x["should_run"]]
        ran = sum(x["runs"] == 1 for x in yes)
        rest = [x for x in mine if not x["should_run"]]
        wrong = [x for x in rest if x["runs"]]
        groups = {}
        for group in sorted({x["group"] for x in mine}):
            g = [x for x in mine if x["group"] == group]
            groups[group] = {"n": len(g), "ran": sum(x["runs"] > 0 for x in g),
                             "outcomes": _count(x["outcome"] for x in g)}  # fmt: skip
        out[name] = {
            "yes": {"n": len(yes), "ran": ran, "rate": round(ran / len(yes), 4) if yes else None,
                    "ci95": c.wilson(ran, len(yes)),
                    "not_run": [x["reply"] for x in yes if x["runs"] != 1]},
            "others": {"n": len(rest), "wrong_runs": len(wrong),
                       "wrong_run_rate_ci95": c.wilson(len(wrong), len(rest)),
                       "wrong": [x["reply"] for x in wrong]},
            "by_group": groups,
        }  # fmt: skip
    return out


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def summary(doc: dict[str, Any]) -> str:
    lines = []
    for name, res in doc["results"]["sets"].items():
        y, o = res["yes"], res["others"]
        lines.append(f"{name}: yes ran {y['ran']}/{y['n']} = {y['rate']} {y['ci95']}; wrong "
                     f"runs {o['wrong_runs']}/{o['n']} {o['wrong_run_rate_ci95']}")  # fmt: skip
        if y["not_run"]:
            lines.append(f"    yes not run: {y['not_run']}")
        if o["wrong"]:
            lines.append(f"    WRONG RUNS: {o['wrong']}")
        for group, g in res["by_group"].items():
            lines.append(f"    {group:12s} n={g['n']:3d} ran={g['ran']:3d} {g['outcomes']}")
    lines.append(f"wall {doc['results']['wall_s']} s for {doc['results']['n']} replies")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8,
                        help="conversations at once")  # fmt: skip
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = c.new_document("confirm_replies", argv, {"concurrency": args.concurrency})
    t0 = time.perf_counter()
    cases = asyncio.run(measure(args.concurrency))
    doc["results"] = {"n": len(cases), "wall_s": round(time.perf_counter() - t0, 1),
                      "sets": tally(cases)}  # fmt: skip
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main()
