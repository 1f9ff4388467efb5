"""A stateless client's prompt cache through the OpenAI face, beside ``/chat``.

A Chat Completions client names no conversation: each request sends the whole thread.
This drives three-turn chats through ``chainrun serve`` on loopback (the serve app under
uvicorn in a thread of this process, the default shop chain) on the embedded model
(Gemma 3 270M on llama-server), one turn at a time, with two clients:

- ``openai``: the real ``openai`` client, streamed, ``stream_options.include_usage``,
  no ``metadata.conversation_id``, no ``user``: the thread sent back each turn;
- ``chat``: ``POST /chat`` with a conversation id (chainrun's own record of the thread),
  the figure the OpenAI face is held to.

Each chat opens with a message of its own (a name and a number drawn for the run in
it), so no chat's turn 1 finds another's prompt (of this run or an earlier one) in the
server's cache. One ``/chat`` turn first warms the chain up (models loaded on first
use); it is not counted. The faces alternate chat by chat. After each turn the client
waits until the turn is logged (its checks after the answer done: on this shared
machine a check still running beside the next turn's answer doubled that answer's
TTFT) and then ``--pause-s`` more (a shopper reading the answer and typing).

Per turn: the answer's TTFT as the client saw it (request sent to the first answer
text, ms), the turn's ``answer_ttft_ms`` (logged), and the answer step's (compose)
prompt tokens and cached prompt tokens, from the usage the client got (the calls until
the answer: ``prompt_tokens_details.cached_tokens`` of the OpenAI face, ``answer_done``'s
``usage`` on ``/chat``) and from the log (the compose call that won). Summary per face
and turn index: medians, the cached share, and each later turn's TTFT over turn 1's
(target: at least half the prompt cached, TTFT at most half of turn 1's).

Run: ``flock /tmp/chainrun-timing.lock python benchmarks/openai_face_cache.py [--chats 4]
[--pause-s 3] [--base-url http://127.0.0.1:PORT/v1] [--json]``. Without ``--base-url``
the embedded model of this install is used (started if it is not running); with it, a
llama-server already running (another checkout's embedded model) is used as the embedded
model is: slot affinity (``prompt_cache = "slot"``) and llama.cpp's sampler fields.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn
from _common import add_common_options, finish, median, new_document, r

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.log.rows import WINNER_OUTCOMES
from chainrun.log.store import Store
from chainrun.serve import ServeState, create_app
from chainrun.serve.server import bind

MODEL = "chainrun-shop"
#: each chat: (an opening with a {name}, then two follow-ups)
CHATS = [
    ("Hi, I'm {name}. Do you have a waterproof rain jacket?", "Which of those is cheapest?",
     "Does it come in size M?"),
    ("Hello, {name} here. I need warm winter boots.", "Any in brown?",
     "What is your return policy for boots?"),
    ("{name} asking: do you sell wool scarves?", "Which one is the softest?",
     "Can I pay on delivery?"),
    ("Hey, this is {name}. Looking for running shoes for women.", "Any under 80 euros?",
     "How long does shipping take?"),
]  # fmt: skip
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emil", "Femi", "Gita", "Hugo", "Ines", "Jon"]


class Server:
    """The serve app under uvicorn on loopback, in a thread of its own (its own loop)."""

    def __init__(self, factory: Any) -> None:
        self.state = ServeState(factory, retry_s=2.0)
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(self.state), log_level="warning")
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=lambda: asyncio.run(
            self.server.serve(sockets=[self.sock])), daemon=True)  # fmt: skip

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit("serve did not become ready within 300 s")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def openai_turn(client: openai.OpenAI, thread: list[dict[str, str]]) -> dict[str, Any]:
    """One streamed turn through the OpenAI face: the answer, the client's TTFT, usage."""
    t0 = time.perf_counter()
    ttft = None
    text, usage, extra = [], None, {}
    stream = client.chat.completions.create(
        model=MODEL, messages=thread, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True})  # fmt: skip
    for c in stream:
        if c.choices and c.choices[0].delta.content:
            ttft = ttft if ttft is not None else (time.perf_counter() - t0) * 1000
            text.append(c.choices[0].delta.content)
        if c.choices and c.choices[0].finish_reason:
            extra = (c.model_extra or {}).get("chainrun") or {}
        if c.usage is not None:
            usage = c.usage
    details = usage.prompt_tokens_details if usage is not None else None
    return {"answer": "".join(text), "client_ttft_ms": ttft,
            "answer_ttft_ms": extra.get("answer_ttft_ms"), "request_id": extra.get("request_id"),
            "status": extra.get("status"),
            "usage_prompt": usage.prompt_tokens if usage else None,
            "usage_cached": details.cached_tokens if details else None}  # fmt: skip


def chat_turn(http: httpx.Client, message: str, conversation_id: str) -> dict[str, Any]:
    """One ``POST /chat`` turn read up to ``answer_done`` (or the turn's end)."""
    t0 = time.perf_counter()
    ttft = None
    out: dict[str, Any] = {}
    text = []
    body = {"message": message, "conversation_id": conversation_id}
    with http.stream("POST", "/chat", json=body) as resp:
        event = "message"
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
                continue
            if not line.startswith("data:"):
                continue
            data = json.loads(line[5:])
            if event == "turn_started":
                out["request_id"] = data.get("request_id")
            elif event == "token" and data.get("step") == "compose":
                ttft = ttft if ttft is not None else (time.perf_counter() - t0) * 1000
                text.append(data["text"])
            elif event in ("answer_done", "turn"):
                u = data.get("usage") or {}
                out.update(answer_ttft_ms=data.get("answer_ttft_ms"),
                           status="answered" if event == "answer_done" else data.get("status"),
                           usage_prompt=u.get("input_tokens"),
                           usage_cached=u.get("cached_input_tokens"))  # fmt: skip
                break
    return {"answer": "".join(text) or out.get("output", ""), "client_ttft_ms": ttft, **out}


def wait_logged(db: Path, request_id: str | None, timeout_s: float = 120.0) -> None:
    """Wait until the turn of ``request_id`` is in the log (its checks done)."""
    deadline = time.monotonic() + timeout_s
    while request_id and time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            if con.execute("select 1 from turns where request_id = ?",
                           (request_id,)).fetchone():  # fmt: skip
                return
        time.sleep(0.1)


def compose_calls(store: Store) -> dict[str, tuple[int | None, int | None]]:
    """Per request id: the winning compose call's (prompt tokens, cached prompt tokens)."""
    runs = [x.id for x in store.runs_of_kind("live")]
    turns = {t.id: t.request_id for t in store.turns(runs)}
    out: dict[str, tuple[int | None, int | None]] = {}
    for c in store.calls(runs):
        if c.step == "compose" and c.outcome in WINNER_OUTCOMES and c.turn_id in turns:
            out[turns[c.turn_id] or ""] = (c.input_tokens, c.cached_input_tokens)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    provider: dict[str, Any] = {}
    if args.base_url:
        provider = {"base_url": args.base_url, "prompt_cache": "slot", "sampling_fields": True}
    cfg = config_from_dict({"providers": {"local": provider}})
    db = Path(tempfile.mkdtemp()) / "log.db"
    turns: list[dict[str, Any]] = []
    run_number = random.randint(1000, 9999)
    # the log is opened in the server's thread (a SQLite connection stays in its thread)
    with Server(lambda: Chain(cfg, store=Store.open(db), kind="live", quiet=True)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        http = httpx.Client(base_url=srv.url, timeout=600)
        warm = chat_turn(http, "Hello, do you sell socks?", f"warm-up-{run_number}")
        wait_logged(db, warm.get("request_id"))  # models loaded on first use: not counted
        for i in range(args.chats):
            script = CHATS[i % len(CHATS)]
            for face in (("openai", "chat") if i % 2 == 0 else ("chat", "openai")):
                name = f"{NAMES[(2 * i + (face == 'chat')) % len(NAMES)]} {run_number}"
                messages = [script[0].format(name=name), *script[1:]]
                thread: list[dict[str, str]] = []
                for index, message in enumerate(messages, start=1):
                    thread.append({"role": "user", "content": message})
                    if face == "openai":
                        got = openai_turn(client, thread)
                    else:
                        got = chat_turn(http, message, f"bench-{i}-{name}")
                    thread.append({"role": "assistant", "content": got["answer"]})
                    turns.append({"face": face, "chat": i, "turn_index": index, **got})
                    print(f"chat {i} {face} turn {index}: client TTFT "
                          f"{r(got['client_ttft_ms'], 0)} ms, usage cached "
                          f"{got.get('usage_cached')}/{got.get('usage_prompt')}",
                          file=sys.stderr, flush=True)  # fmt: skip
                    wait_logged(db, got.get("request_id"))
                    time.sleep(args.pause_s)
        http.close()
        client.close()
        time.sleep(2)  # the last turn's checks
    store = Store.open(db)
    calls = compose_calls(store)
    store.close()
    for t in turns:
        t.pop("answer", None)
        t["compose_prompt"], t["compose_cached"] = calls.get(t.get("request_id") or "",
                                                             (None, None))  # fmt: skip
    return {"turns": turns, "summary": summarise(turns)}


def summarise(turns: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for face in ("openai", "chat"):
        mine = [t for t in turns if t["face"] == face]
        rows = {}
        first = median([t["client_ttft_ms"] for t in mine
                        if t["turn_index"] == 1 and t["client_ttft_ms"] is not None])  # fmt: skip
        for index in sorted({t["turn_index"] for t in mine}):
            at = [t for t in mine if t["turn_index"] == index]
            ttft = median([t["client_ttft_ms"] for t in at if t["client_ttft_ms"] is not None])
            logged = median([t["answer_ttft_ms"] for t in at if t["answer_ttft_ms"] is not None])
            prompt = sum(t["compose_prompt"] or 0 for t in at)
            cached = sum(t["compose_cached"] or 0 for t in at)
            up = sum(t["usage_prompt"] or 0 for t in at)
            uc = sum(t["usage_cached"] or 0 for t in at)
            rows[str(index)] = {
                "n": len(at), "client_ttft_p50_ms": r(ttft, 0),
                "answer_ttft_p50_ms": r(logged, 0),
                "ttft_over_turn1": r(ttft / first, 2) if ttft and first else None,
                "compose_cached_share": r(cached / prompt, 2) if prompt else None,
                "usage_cached_share": r(uc / up, 2) if up else None,
                "compose_prompt_tokens_mean": r(prompt / len(at), 0),
            }  # fmt: skip
        out[face] = rows
    return out


def _summary(doc: dict[str, Any]) -> str:
    lines = ["face    turn  n  client TTFT p50 ms  logged p50 ms  / turn 1  compose cached  "
             "usage cached  compose prompt"]
    for face, rows in doc["results"]["summary"].items():
        for index, row in rows.items():
            lines.append(f"{face:7} {index:>4} {row['n']:>2}  {row['client_ttft_p50_ms']!s:>18}  "
                         f"{row['answer_ttft_p50_ms']!s:>13}  {row['ttft_over_turn1']!s:>8}  "
                         f"{row['compose_cached_share']!s:>14}  {row['usage_cached_share']!s:>12}"
                         f"  {row['compose_prompt_tokens_mean']!s:>14}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chats", type=int, default=4, help="chats per face (default 4)")
    p.add_argument("--pause-s", type=float, default=3.0,
                   help="s between two turns of a chat (default 3)")  # fmt: skip
    p.add_argument("--base-url", help="a running llama-server's /v1 URL (default: the "
                   "embedded model of this install)")  # fmt: skip
    add_common_options(p)
    args = p.parse_args(argv)
    doc = new_document("openai_face_cache", sys.argv[1:] if argv is None else argv,
                       {"chats": args.chats, "pause_s": args.pause_s,
                        "base_url": args.base_url})  # fmt: skip
    doc["results"] = run(args)
    finish(doc, as_json=args.json, summary=_summary, out=args.out)


if __name__ == "__main__":
    main()
