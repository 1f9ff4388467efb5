"""Many ``chainrun serve`` processes on one PostgreSQL log, next to one process on SQLite,
and the database stopped for a few seconds under load.

For each level of concurrency (default 100 and 500 chats at once) and each setup this
starts the lab (``lognormal`` TTFT, as ``serve_load.py``) and a fresh ``chainrun serve``
(the real CLI, the default five-step chain pointed at the lab):

* ``sqlite``: one process, its log a SQLite file;
* ``postgres``: ``--workers 4`` (four processes sharing the port, one live run each) on
  one PostgreSQL log, a private server started for the benchmark (Debian's
  ``postgresql``);
* ``postgres_outage``: the same, and ``--outage-s`` (5) seconds after the load starts
  the server is stopped (``pg_ctl stop -m fast``: every connection closed), then started
  again ``--outage-s`` seconds later.

Then that many client loops run for ``--duration-s`` seconds (each sends ``POST /chat``
and reads the SSE stream to the ``turn`` event, then the next turn). Reported per run:
turns per second, the client-seen turn latency p50/p99 with n and intervals, errors,
turns answered while the database was down, what ``/readyz`` said of the log then, the
writer's warning lines, and the exactly-once check: every turn the client saw is in the
log once (by conversation id and turn id), or the writer counted it as lost and said so.

Run: ``python benchmarks/pg_fleet.py [--levels 100,500] [--duration-s 20] [--json]``.

``--conversations N`` measures conversations across workers instead (``results/
pg_fleet_conversations.json``): ``serve --workers 4`` on a PostgreSQL log reached through
PgBouncer in transaction mode (Debian's ``pgbouncer``: a private one in front of the
private cluster, or ``--bouncer-url`` with ``--bouncer-restart CMD`` for one of yours),
N conversations of ``--turns`` (5) ``/chat`` turns each, every turn on a new connection
(so any worker may take it), ``--parallel`` conversations at a time, the lab recording
each request's messages. With ``--restart-after K`` PgBouncer is restarted once K turns
have been answered (``kill $(cat PIDFILE); runuser -u postgres -- pgbouncer -d INI``:
every client connection through it closed). Checked: every turn's answer request holds
all of its conversation's earlier messages; every conversation's turn indexes are 1..T,
each once; every turn the client saw is logged once, ``ok``; no client error.

Client, servers, lab and database share this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from _common import add_common_options, finish, new_document
from _pg import PrivateBouncer, PrivateCluster
from serve_load import Level, _drive, _level_result, _summ

from chainrun.lab import LabServer
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]
SETUPS = ("sqlite", "postgres", "postgres_outage")


class Serve:
    """``chainrun serve`` in a subprocess; its stderr read by a thread (kept in ``lines``)."""

    def __init__(self, cfg: Path, db: str, workers: int, catalog: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CHAINRUN_DB": db,
               "CHAINRUN_CATALOG_DB": str(catalog)}  # fmt: skip
        env.pop("CHAINRUN_SERVE_TOKEN", None)
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        cmd = [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg)]
        if workers > 1:
            cmd += ["--workers", str(workers)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stderr is not None
        first = self.proc.stderr.readline()
        if not first.startswith("chainrun serve: http://"):
            self.proc.kill()
            raise RuntimeError(f"chainrun serve did not start: {first}{self.proc.stderr.read()}")
        self.url = first.split()[2].rstrip("/")
        self.lines: list[str] = [first.rstrip()]
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        ready = 0  # every worker answers /readyz: ask until 2 x workers answers in a row
        for _ in range(1200):
            try:
                ok = httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            ready = ready + 1 if ok else 0
            if ready >= 2 * workers:
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("chainrun serve was not ready within 60 s")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=5)
        return code


def _logged(db: str) -> list[dict[str, Any]]:
    with Store.open(db, create=False) as s:
        return s.log.query(
            "select t.id, t.conversation_id, t.status, t.duration_ms, r.kind "
            "from turns t join runs r on r.id = t.run_id"
        )


def _sizes(db: str) -> dict[str, Any]:
    """Per log table: rows, mean bytes per row as stored (``pg_column_size`` of the row),
    and the table's size on disk with its indexes (PostgreSQL docs, "Database Object
    Management Functions")."""
    out: dict[str, Any] = {}
    with Store.open(db, create=False) as s:
        for table in ("runs", "turns", "steps", "calls"):
            n, mean = s.log.execute(
                f"select count(*), avg(pg_column_size(t.*)) from {table} t"
            ).fetchone()
            total, heap = s.log.execute(
                f"select pg_total_relation_size('{table}'), pg_relation_size('{table}')"
            ).fetchone()
            mean_bytes = None if mean is None else round(float(mean))
            out[table] = {"rows": n, "table_bytes": heap, "with_indexes_bytes": total,
                          "mean_row_bytes": mean_bytes}  # fmt: skip
    return out


def _outage(cluster: PrivateCluster, after_s: float, down_s: float, url: str,
            record: dict[str, Any]) -> None:  # fmt: skip
    """Stop the server ``after_s`` into the load for ``down_s`` seconds; sample /readyz."""
    time.sleep(after_s)
    record["stopped_at"] = time.perf_counter()
    cluster.stop("fast")
    states = []
    deadline = time.monotonic() + down_s
    while time.monotonic() < deadline:
        try:
            log = httpx.get(f"{url}/readyz", timeout=2).json().get("log") or {}
            states.append(log.get("state"))
        except (httpx.HTTPError, ValueError):
            states.append("no answer")
        time.sleep(0.5)
    cluster.start()
    record["started_at"] = time.perf_counter()
    record["readyz_log_states_while_down"] = sorted(set(states), key=str)


def run_one(setup: str, n: int, args: argparse.Namespace, lab: LabServer, tmp: Path,
            cluster: PrivateCluster | None) -> dict[str, Any]:  # fmt: skip
    cfg = tmp / f"chainrun-{n}.toml"
    cfg.write_text(
        f'[providers.local]\nbase_url = "{lab.base_url}"\nmax_connections = {max(100, 4 * n)}\n',
        encoding="utf-8",
    )
    if setup == "sqlite":
        db, workers = str(tmp / f"serve-{n}.db"), 1
    else:
        assert cluster is not None
        schema = f"b_{setup}_{n}"
        with Store.open(cluster.url) as admin:
            admin.log.execute(f'create schema "{schema}"')
        db = f"{cluster.url}?options=-csearch_path%3D{schema}"
        workers = args.workers
    serve = Serve(cfg, db, workers, tmp / "catalog.db")
    level = Level(concurrency=n)
    outage: dict[str, Any] = {}
    thread = None
    if setup == "postgres_outage":
        assert cluster is not None
        plan = (cluster, args.outage_after_s, args.outage_s, serve.url, outage)
        thread = threading.Thread(target=_outage, args=plan)
        thread.start()
    try:
        asyncio.run(_drive(serve.url, level, args.duration_s, args.drain_s))
    finally:
        if thread is not None:
            thread.join()
        code = serve.stop()
    wall = (level.last_done or 0.0) - (level.first_sent or 0.0)
    logged = _logged(db)
    result = _level_result(level, logged, wall)
    result.update(setup=setup, workers=workers, server_exit_code=code)
    if setup != "sqlite":
        result["table_sizes"] = _sizes(db)
    said = [ln for ln in serve.lines if "run log" in ln]
    found = (re.search(r"(\d+) log writes were lost", ln) for ln in said)
    lost = sum(int(m.group(1)) for m in found if m)
    result["log_warnings"] = said
    result["lost_writes_said"] = lost
    seen = [t for t in level.turns if t.turn_id is not None]
    ids = {row["id"] for row in logged}
    missing = [t for t in seen if t.turn_id not in ids]
    result["seen_turns_not_in_log"] = len(missing)
    # every turn the client saw is in the log, or counted as lost in a warning line
    result["every_turn_logged_or_said_lost"] = len(missing) <= lost and (
        lost > 0 or result["every_turn_logged_exactly_once"]
    )
    if outage:
        lo, hi = outage["stopped_at"], outage["started_at"]
        down = [t for t in level.turns if t.done_at is not None and lo <= t.done_at <= hi]
        result["outage"] = {
            "down_s": round(outage["started_at"] - outage["stopped_at"], 2),
            "turns_answered_while_down": len(down),
            "readyz_log_states_while_down": outage["readyz_log_states_while_down"],
        }
    return result


# -- conversations across workers, through PgBouncer -----------------------------------
def _conv_message(c: int, k: int) -> str:
    return f"conversation {c} turn {k}: a rain jacket in size {k}, colour {c}?"


async def _conversation(base: str, c: int, turns: int, out: list[dict[str, Any]],
                        done: list[int], restart_at: asyncio.Event | None,
                        restart_after: int) -> None:  # fmt: skip
    """One conversation's turns, one after another, each on a new connection."""
    cid = f"fleet-{c}"
    for k in range(1, turns + 1):
        rec: dict[str, Any] = {"conversation": cid, "k": k, "error": None}
        t0 = time.perf_counter()
        try:
            async with httpx.AsyncClient(base_url=base, timeout=120) as client, \
                    client.stream("POST", "/chat", json={"message": _conv_message(c, k),
                                                         "conversation_id": cid}) as r:
                if r.status_code != 200:
                    rec["error"] = f"http_{r.status_code}"
                else:
                    last = None
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            last = line[len("data: "):]
                    turn = json.loads(last) if last else {}
                    rec.update(turn_id=turn.get("turn_id"), turn_index=turn.get("turn_index"),
                               status=turn.get("status"))  # fmt: skip
                    if turn.get("status") is None:
                        rec["error"] = "no turn event"
        except httpx.HTTPError as e:
            rec["error"] = type(e).__name__
        rec["client_ms"] = round((time.perf_counter() - t0) * 1000.0, 1)
        out.append(rec)
        done[0] += 1
        if restart_at is not None and done[0] >= restart_after:
            restart_at.set()


def run_conversations(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The conversations mode (see the module text)."""
    with contextlib.ExitStack() as stack:
        lab = stack.enter_context(LabServer(
            "lognormal", median_ms=args.median_ms, sigma=args.sigma, n_tokens=args.n_tokens,
            per_token_ms=args.per_token_ms, record_bodies=True))  # fmt: skip
        if args.bouncer_url:
            db, restart = args.bouncer_url, (lambda: subprocess.run(
                args.bouncer_restart, shell=True, check=True))  # fmt: skip
            if not args.bouncer_restart:
                raise SystemExit("--bouncer-url needs --bouncer-restart CMD")
        else:
            cluster = stack.enter_context(PrivateCluster())
            bouncer = stack.enter_context(PrivateBouncer(cluster))
            with Store.open(cluster.url) as admin:  # a database of its own (PgBouncer 1.18
                admin.log.execute("create database fleet_bench")  # passes no search_path)
            db, restart = bouncer.url("fleet_bench"), bouncer.restart
        cfg = tmp / "chainrun-conversations.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n'
                       "max_connections = 400\n\n[history]\nmax_turns = 16\n"
                       "max_tokens = 100000\n", encoding="utf-8")  # fmt: skip
        serve = Serve(cfg, db, args.workers, tmp / "catalog.db")
        out: list[dict[str, Any]] = []
        restarted: dict[str, Any] = {}

        async def drive() -> None:
            done = [0]
            event = asyncio.Event() if args.restart_after else None
            sem = asyncio.Semaphore(args.parallel)

            async def one(c: int) -> None:
                async with sem:
                    await _conversation(serve.url, c, args.turns, out, done, event,
                                        args.restart_after)  # fmt: skip

            async def restarter() -> None:
                assert event is not None
                await event.wait()
                restarted["after_turns"] = done[0]
                t0 = time.perf_counter()
                await asyncio.to_thread(restart)
                restarted["restart_s"] = round(time.perf_counter() - t0, 2)

            tasks = [asyncio.create_task(one(c)) for c in range(args.conversations)]
            if event is not None:
                tasks.append(asyncio.create_task(restarter()))
            await asyncio.gather(*tasks)

        t0 = time.perf_counter()
        try:
            asyncio.run(drive())
        finally:
            code = serve.stop()
        wall = time.perf_counter() - t0
        with Store.open(db, create=False) as store:
            logged = store.log.query("select t.id, t.conversation_id, t.turn_index, t.status "
                                     "from turns t join runs r on r.id = t.run_id "
                                     "where r.kind = 'live'")  # fmt: skip
        requests = [json.dumps(r.get("messages")) for r in lab.requests()]
    return _conversations_result(args, out, logged, requests, wall, code, serve.lines,
                                 restarted)  # fmt: skip


def _conversations_result(args: argparse.Namespace, out: list[dict[str, Any]],
                          logged: list[dict[str, Any]], requests: list[str], wall: float,
                          code: int, lines: list[str], restarted: dict[str, Any],
                          ) -> dict[str, Any]:  # fmt: skip
    errors = Counter(rec["error"] for rec in out if rec["error"])
    not_ok = Counter(rec.get("status") for rec in out if rec.get("status") not in (None, "ok"))
    # every turn's answer request holds all of its conversation's earlier messages
    by_message: dict[str, list[str]] = {}
    for body in requests:
        for c in range(args.conversations):
            for k in range(1, args.turns + 1):
                m = _conv_message(c, k)
                if m in body:
                    by_message.setdefault(m, []).append(body)
    missing_history = []
    for c in range(args.conversations):
        for k in range(2, args.turns + 1):
            earlier = [_conv_message(c, j) for j in range(1, k)]
            asked = by_message.get(_conv_message(c, k), [])
            if not any(all(e in body for e in earlier) for body in asked):
                missing_history.append(f"fleet-{c} turn {k}")
    per_conv: dict[str, list[int]] = {}
    for row in logged:
        per_conv.setdefault(row["conversation_id"], []).append(row["turn_index"] or 0)
    want = list(range(1, args.turns + 1))
    bad_indexes = sorted(c for c, ix in per_conv.items() if sorted(ix) != want)
    ids = Counter(row["id"] for row in logged)
    seen = [rec for rec in out if rec.get("turn_id") is not None]
    logged_once = (all(ids[rec["turn_id"]] == 1 for rec in seen) and len(logged) == len(seen)
                   and len(per_conv) == args.conversations)  # fmt: skip
    client = [rec["client_ms"] for rec in out if rec["error"] is None]
    return {
        "conversations": args.conversations, "turns_each": args.turns,
        "workers": args.workers, "parallel": args.parallel,
        "turns_sent": len(out), "turns_answered_ok": sum(rec.get("status") == "ok" for rec in out),
        "wall_s": round(wall, 1),
        "turns_per_s": round(len(out) / wall, 2) if wall > 0 else None,
        "client_turn_ms": _summ(client),
        "errors": dict(errors), "turn_statuses_not_ok": dict(not_ok),
        "turns_missing_earlier_turns": len(missing_history),
        "missing_history_examples": missing_history[:10],
        "conversations_with_wrong_indexes": len(bad_indexes),
        "wrong_index_examples": {c: sorted(per_conv[c]) for c in bad_indexes[:10]},
        "turns_logged": len(logged),
        "every_turn_logged_once": logged_once,
        "pgbouncer_restart": restarted or None,
        "server_exit_code": code,
        "warning_lines": [ln for ln in lines if "warning" in ln or "error" in ln][:40],
    }


def _conversations_summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    c = res["client_turn_ms"]
    restart = res["pgbouncer_restart"]
    return "\n".join([
        f"{res['conversations']} conversations x {res['turns_each']} turns on "
        f"{res['workers']} workers: {res['turns_answered_ok']}/{res['turns_sent']} ok, "
        f"{res['turns_per_s']} turns/s, client p50 {c['p50_ms']} / p99 {c['p99_ms']} ms "
        f"(n {c['n']})",
        f"errors {res['errors'] or 0}; turns missing earlier turns "
        f"{res['turns_missing_earlier_turns']}; conversations with wrong indexes "
        f"{res['conversations_with_wrong_indexes']}; logged {res['turns_logged']}, each "
        f"once: {res['every_turn_logged_once']}",
        f"PgBouncer restart: {restart}" if restart else "PgBouncer restart: none",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="100,500", help="concurrent chats, comma-separated")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"any of {SETUPS}")
    parser.add_argument("--workers", type=int, default=4, help="serve processes on PostgreSQL")
    parser.add_argument("--duration-s", type=float, default=20.0, help="new turns for this long")
    parser.add_argument("--drain-s", type=float, default=60.0, help="then wait this long")
    parser.add_argument("--outage-after-s", type=float, default=5.0,
                        help="stop PostgreSQL this long into the load")  # fmt: skip
    parser.add_argument("--outage-s", type=float, default=5.0, help="for this long")
    parser.add_argument("--median-ms", type=float, default=200.0, help="lab: median TTFT, ms")
    parser.add_argument("--sigma", type=float, default=0.5, help="lab: sigma of log TTFT")
    parser.add_argument("--n-tokens", type=int, default=16, help="lab: tokens per answer")
    parser.add_argument("--per-token-ms", type=float, default=5.0, help="lab: ms per token")
    parser.add_argument("--conversations", type=int, default=0,
                        help="conversations mode: this many conversations (see the module text)")
    parser.add_argument("--turns", type=int, default=5, help="conversations mode: turns each")
    parser.add_argument("--parallel", type=int, default=25,
                        help="conversations mode: conversations at a time")  # fmt: skip
    parser.add_argument("--restart-after", type=int, default=0,
                        help="conversations mode: restart PgBouncer once this many turns "
                        "were answered (0: never)")  # fmt: skip
    parser.add_argument("--bouncer-url",
                        help="conversations mode: a PgBouncer DSN of yours (default: a private "
                        "one in front of a private cluster)")  # fmt: skip
    parser.add_argument("--bouncer-restart",
                        help="with --bouncer-url: the shell command that restarts it, e.g. "
                        "'kill $(cat /etc/pgbouncer/pgbouncer.pid); runuser -u postgres -- "
                        "pgbouncer -d /etc/pgbouncer/pgbouncer.ini'")  # fmt: skip
    add_common_options(parser)
    args = parser.parse_args(argv)
    if args.conversations:
        params = {k: getattr(args, k) for k in (
            "conversations", "turns", "parallel", "workers", "restart_after", "median_ms",
            "sigma", "n_tokens", "per_token_ms")}  # fmt: skip
        params["bouncer"] = ("yours: " + shlex.quote(args.bouncer_restart or "")
                             if args.bouncer_url else "private, transaction mode")  # fmt: skip
        doc = new_document("pg_fleet", sys.argv[1:] if argv is None else argv, params)
        with tempfile.TemporaryDirectory(prefix="chainrun-pg-fleet-") as tmp:
            doc["results"] = run_conversations(args, Path(tmp))
        out = args.out or str(ROOT / "benchmarks" / "results" / "pg_fleet_conversations.json")
        finish(doc, as_json=args.json, summary=_conversations_summary, out=out)
        return
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    setups = [s for s in args.setups.split(",") if s.strip()]
    params = {
        "levels": levels, "setups": setups, "workers": args.workers,
        "duration_s": args.duration_s, "drain_s": args.drain_s,
        "outage": {"after_s": args.outage_after_s, "down_s": args.outage_s},
        "lab": {"scenario": "lognormal", "median_ms": args.median_ms, "sigma": args.sigma,
                "n_tokens": args.n_tokens, "per_token_ms": args.per_token_ms},
        "chain": "the built-in default (classify, retrieve, compose, validate, critique)",
    }  # fmt: skip
    doc = new_document("pg_fleet", sys.argv[1:] if argv is None else argv, params)
    with (
        LabServer("lognormal", median_ms=args.median_ms, sigma=args.sigma,
                  n_tokens=args.n_tokens, per_token_ms=args.per_token_ms) as lab,
        tempfile.TemporaryDirectory(prefix="chainrun-pg-fleet-") as tmp,
        PrivateCluster() as cluster,
    ):  # fmt: skip
        doc["results"]["runs"] = [run_one(s, n, args, lab, Path(tmp), cluster)
                                  for n in levels for s in setups]  # fmt: skip
    finish(doc, as_json=args.json, summary=_summary, out=args.out)


def _summary(doc: dict[str, Any]) -> str:
    lines = ["setup            chats  turns/s  client p50 / p99 ms (n)        errors  "
             "exactly once  lost (said)  answered while down"]  # fmt: skip
    for lv in doc["results"]["runs"]:
        c = lv["client_turn_ms"]
        down = (lv.get("outage") or {}).get("turns_answered_while_down", "-")
        lines.append(
            f"{lv['setup']:<16} {lv['concurrency']:>5}  {lv['turns_per_s']!s:>7}  "
            f"{c['p50_ms']!s:>8} / {c['p99_ms']!s:>8} ({c['n']})  "
            f"{sum(lv['errors'].values()):>6}  {lv['every_turn_logged_exactly_once']!s:>12}  "
            f"{lv['lost_writes_said']:>11}  {down}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
