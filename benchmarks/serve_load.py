"""Load test of ``chainrun serve``: many concurrent chats against the latency lab.

For each level of concurrency (default 10, 100 and 500 chats at once) this starts the
lab (``lognormal`` TTFT) and a fresh ``chainrun serve`` (the real CLI, a subprocess,
the default five-step chain with its providers pointed at the lab and a connection pool
large enough for every chat), then runs that many client loops for ``--duration-s``
seconds: each loop sends ``POST /chat`` and reads the Server-Sent Events to the final
``turn`` event, then starts the next turn. New turns stop at the deadline; turns in
flight get ``--drain-s`` to finish, after which the client disconnects (they are then
logged ``cancelled`` and counted as such). The server is stopped and its log read back.

Reported per level: turns per second (turns completed / wall time from the first request
to the last answer), the turn latency as the client saw it (request sent to ``turn``
event) next to the ``duration_ms`` chainrun logged, each as p50/p99 with n and a
distribution-free 95% interval (``null`` where n cannot bound it), the answer's TTFT at
the client, errors by kind, and the exactly-once check: every turn the client saw has one
row in the log with its conversation id (ids unique per turn), and the log holds no
turn the client did not see.

Run: ``python benchmarks/serve_load.py [--levels 10,100,500] [--duration-s 20] [--json]``.
The client, the server and the lab share this machine's cores: the figures include the
client's own CPU time, which grows with the level.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _common import add_common_options, finish, new_document, r

from chainrun.lab import LabServer
from chainrun.statistics.intervals import summarize

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Turn:
    conversation_id: str
    client_ms: float | None = None
    answer_ttft_ms: float | None = None
    turn_id: int | None = None
    status: str | None = None
    error: str | None = None
    #: when the client had the ``turn`` event (perf_counter seconds)
    done_at: float | None = None


@dataclass
class Level:
    concurrency: int
    turns: list[Turn] = field(default_factory=list)
    first_sent: float | None = None
    last_done: float | None = None


async def _one_turn(client: httpx.AsyncClient, turn: Turn, level: Level) -> None:
    t0 = time.perf_counter()
    if level.first_sent is None:
        level.first_sent = t0
    body = {"message": "a waterproof jacket under 100?", "conversation_id": turn.conversation_id}
    try:
        async with client.stream("POST", "/chat", json=body) as resp:
            if resp.status_code != 200:
                turn.error = f"http_{resp.status_code}"
                return
            event = None
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    if event == "token" and turn.answer_ttft_ms is None:
                        turn.answer_ttft_ms = (time.perf_counter() - t0) * 1000.0
                    elif event == "turn":
                        data = json.loads(line[5:])
                        turn.client_ms = (time.perf_counter() - t0) * 1000.0
                        turn.turn_id, turn.status = data["turn_id"], data["status"]
                        level.last_done = turn.done_at = time.perf_counter()
    except httpx.HTTPError as e:
        turn.error = type(e).__name__
    if turn.status is None and turn.error is None:
        turn.error = "no_turn_event"


async def _drive(url: str, level: Level, duration_s: float, drain_s: float) -> None:
    n = level.concurrency
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    timeout = httpx.Timeout(duration_s + drain_s + 60, connect=30.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        deadline = time.perf_counter() + duration_s

        async def worker(w: int) -> None:
            k = 0
            while time.perf_counter() < deadline:
                turn = Turn(conversation_id=f"c{n}-w{w}-t{k}")
                level.turns.append(turn)
                await _one_turn(client, turn, level)
                k += 1

        tasks = [asyncio.create_task(worker(w)) for w in range(n)]
        _, pending = await asyncio.wait(tasks, timeout=duration_s + drain_s)
        for t in pending:  # still in flight after the drain: the client leaves
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for turn in level.turns:
            if turn.status is None and turn.error is None:
                turn.error = "client_gave_up"


def _start_serve(cfg: Path, db: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CHAINRUN_SERVE_TOKEN", None)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
         "--db", str(db)],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if not line.startswith("chainrun serve: http://"):
        proc.kill()
        raise RuntimeError(f"chainrun serve did not start: {line}{proc.stderr.read()}")
    url = line.split()[2].rstrip("/")
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("chainrun serve was not ready within 60 s")


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()
    return code


def _logged(db: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        rows = con.execute(
            "select t.id, t.conversation_id, t.status, t.duration_ms, r.kind "
            "from turns t join runs r on r.id = t.run_id"
        ).fetchall()
        return [dict(row) for row in rows]
    finally:
        con.close()


def _failed_steps(db: Path) -> dict[str, int]:
    """Steps that did not end ``ok``, counted by ``step status error_type``."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "select step, status, coalesce(error_type, '-'), count(*) from steps "
            "where status not in ('ok', 'skipped') group by 1, 2, 3 order by 4 desc"
        ).fetchall()
        return {f"{step} {status} {err}": n for step, status, err, n in rows}
    finally:
        con.close()


def _summ(values: list[float]) -> dict[str, Any]:
    s = summarize(values)
    return {k: s[k] for k in ("n", "p50_ms", "p50_ci", "p99_ms", "p99_ci")}


def _level_result(level: Level, logged: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    seen = [t for t in level.turns if t.turn_id is not None]
    completed = [t for t in seen if t.status is not None]
    by_conv = Counter(row["conversation_id"] for row in logged)
    by_id = {row["id"]: row for row in logged}
    client_convs = {t.conversation_id for t in level.turns}
    exactly_once = (
        all(by_conv[t.conversation_id] == 1 for t in seen)
        and all(by_id.get(t.turn_id, {}).get("conversation_id") == t.conversation_id for t in seen)
        and all(c in client_convs for c in by_conv)
        and len(by_id) == len(logged)
    )
    errors = Counter(t.error for t in level.turns if t.error)
    statuses = Counter(t.status for t in completed)
    logged_ok = [row["duration_ms"] for row in logged if row["status"] in ("ok", "refused")]
    client_ok = [t.client_ms for t in completed if t.client_ms is not None]
    ttfts = [t.answer_ttft_ms for t in completed if t.answer_ttft_ms is not None]
    return {
        "concurrency": level.concurrency,
        "turns_sent": len(level.turns),
        "turns_completed": len(completed),
        "wall_s": r(wall_s, 2),
        "turns_per_s": r(len(completed) / wall_s, 2) if wall_s > 0 else None,
        "client_turn_ms": _summ(client_ok),
        "logged_turn_ms": _summ(logged_ok),
        "client_answer_ttft_ms": _summ(ttfts),
        "turn_status": dict(statuses),
        "errors": dict(errors),
        "logged_turns": len(logged),
        "logged_status": dict(Counter(row["status"] for row in logged)),
        "logged_kinds": sorted({row["kind"] for row in logged}),
        "every_turn_logged_exactly_once": exactly_once,
    }


def run_level(n: int, args: argparse.Namespace, lab: LabServer, tmp: Path) -> dict[str, Any]:
    cfg = tmp / f"chainrun-{n}.toml"
    cfg.write_text(
        f'[providers.local]\nbase_url = "{lab.base_url}"\nmax_connections = {max(100, 4 * n)}\n',
        encoding="utf-8",
    )
    db = tmp / f"serve-{n}.db"
    proc, url = _start_serve(cfg, db)
    level = Level(concurrency=n)
    try:
        asyncio.run(_drive(url, level, args.duration_s, args.drain_s))
    finally:
        code = _stop(proc)
    wall = (level.last_done or 0.0) - (level.first_sent or 0.0)
    result = _level_result(level, _logged(db), wall)
    result["failed_steps"] = _failed_steps(db)
    result["server_exit_code"] = code
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="10,100,500", help="concurrent chats, comma-separated")
    parser.add_argument("--duration-s", type=float, default=20.0, help="new turns for this long")
    parser.add_argument("--drain-s", type=float, default=60.0, help="then wait this long")
    parser.add_argument("--median-ms", type=float, default=200.0, help="lab: median TTFT, ms")
    parser.add_argument("--sigma", type=float, default=0.5, help="lab: sigma of log TTFT")
    parser.add_argument("--n-tokens", type=int, default=16, help="lab: tokens per answer")
    parser.add_argument("--per-token-ms", type=float, default=5.0, help="lab: ms per token")
    add_common_options(parser)
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    params = {
        "levels": levels, "duration_s": args.duration_s, "drain_s": args.drain_s,
        "lab": {"scenario": "lognormal", "median_ms": args.median_ms, "sigma": args.sigma,
                "n_tokens": args.n_tokens, "per_token_ms": args.per_token_ms},
        "chain": "the built-in default (classify, retrieve, compose, validate, critique)",
    }  # fmt: skip
    doc = new_document("serve_load", sys.argv[1:] if argv is None else argv, params)
    with (
        LabServer("lognormal", median_ms=args.median_ms, sigma=args.sigma,
                  n_tokens=args.n_tokens, per_token_ms=args.per_token_ms) as lab,
        tempfile.TemporaryDirectory(prefix="chainrun-serve-load-") as tmp,
    ):  # fmt: skip
        doc["results"]["levels"] = [run_level(n, args, lab, Path(tmp)) for n in levels]
    finish(doc, as_json=args.json, summary=_summary, out=args.out)


def _summary(doc: dict[str, Any]) -> str:
    lines = ["chats  turns/s  client p50 / p99 ms (n)        logged p50 / p99 ms (n)"
             "        errors  exactly once"]  # fmt: skip
    for lv in doc["results"]["levels"]:
        c, g = lv["client_turn_ms"], lv["logged_turn_ms"]
        lines.append(
            f"{lv['concurrency']:>5}  {lv['turns_per_s']!s:>7}  "
            f"{c['p50_ms']!s:>8} / {c['p99_ms']!s:>8} ({c['n']})  "
            f"{g['p50_ms']!s:>8} / {g['p99_ms']!s:>8} ({g['n']})  "
            f"{sum(lv['errors'].values()):>6}  {lv['every_turn_logged_exactly_once']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
