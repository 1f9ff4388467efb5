"""Repro: ``chainrun serve --identity-header`` while its PostgreSQL log is really stopped.

``tests/test_desk_pg_outage.py`` cuts a TCP relay in front of the test server; this stops
the server itself (``pg_ctl stop -m fast``: the clients get PostgreSQL's "terminating
connection due to administrator command", then "connection refused") for ``--outage-s``
while ``--clients`` shoppers chat with ``POST /chat`` through a real ``chainrun serve``
(the built-in default chain, its providers on the latency lab), then starts it again.

Printed as JSON: the HTTP statuses (expected: 200 and 503 only, never 500), the 200s
whose stream did not end with the ``turn`` event (expected 0), the refusals' codes and
``Retry-After``, how long a refusal took (p50, max; s), ``/readyz`` while the server
was stopped and after, and the 200s and 503s after it was back.

Run (as root, on a cluster of your own; it is stopped and started again)::

    python benchmarks/repro/pg_stop_identity.py \\
        --dsn postgresql://postgres@127.0.0.1:PORT/postgres \\
        --pg-ctl "runuser -u postgres -- /usr/lib/postgresql/VERSION/bin/pg_ctl -D DATA" \\
        --pg-options "-p PORT -k SOCKET_DIR -c listen_addresses=127.0.0.1"

``--pg-options`` are the server options the cluster was started with: ``pg_ctl start``
does not reuse them, and without them the server comes back on another port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from chainrun.lab import LabServer

ROOT = Path(__file__).resolve().parents[2]


async def chatter(url: str, who: int, until: float, seen: list[dict[str, Any]]) -> None:
    """One shopper chatting on three conversations until ``until`` (monotonic s)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        n = 0
        while time.monotonic() < until:
            n += 1
            sent = time.monotonic()
            body = {"message": f"a rain jacket {n}?", "conversation_id": f"c-{who}-{n % 3}"}
            try:
                async with client.stream("POST", "/chat", json=body,
                                         headers={"X-Shopper": f"u-{who}"}) as r:  # fmt: skip
                    text = (await r.aread()).decode()
            except httpx.HTTPError as e:
                seen.append({"status": f"transport {type(e).__name__}", "at": sent})
                continue
            row: dict[str, Any] = {"status": r.status_code, "at": sent,
                                   "took": time.monotonic() - sent}  # fmt: skip
            if r.status_code == 200:
                events = [line for line in text.splitlines() if line.startswith("event:")]
                row["ended"] = bool(events) and events[-1] == "event: turn"
                if not row["ended"]:  # what it ended with instead
                    row["tail"] = text.splitlines()[-6:]
            else:
                row["code"] = json.loads(text).get("error", {}).get("code")
                row["retry_after"] = r.headers.get("retry-after")
            seen.append(row)
            await asyncio.sleep(0.05)


def start_serve(cfg: Path, dsn: str, err: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CHAINRUN_SERVE_TOKEN", "CHAINRUN_SERVE_IDENTITY_KEY")}  # fmt: skip
    env["PYTHONPATH"] = str(ROOT)
    with err.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
             "--db", dsn, "--identity-header", "X-Shopper"],
            stderr=out, env=env, cwd=ROOT,
        )  # fmt: skip
    for _ in range(600):
        lines = err.read_text().splitlines()
        if lines and lines[0].startswith("chainrun serve: http://"):
            return proc, lines[0].split()[2].rstrip("/")
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"chainrun serve did not start: {err.read_text()}")


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    pg_ctl = shlex.split(args.pg_ctl)

    def ctl(*more: str) -> None:
        subprocess.run([*pg_ctl, *more], check=True, stdout=subprocess.DEVNULL)

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for _ in range(600):
            if (await client.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.1)
        seen: list[dict[str, Any]] = []
        begin = time.monotonic()
        load = [asyncio.create_task(chatter(url, k, begin + args.before_s + args.outage_s
                                            + args.after_s, seen))
                for k in range(args.clients)]  # fmt: skip
        await asyncio.sleep(args.before_s)
        await asyncio.to_thread(ctl, "stop", "-m", "fast")
        stopped = time.monotonic()
        ready = []
        while time.monotonic() < stopped + args.outage_s:
            r = await client.get("/readyz")
            ready.append({"at_s": round(time.monotonic() - stopped, 1), "status": r.status_code,
                          "detail": r.json().get("detail")})  # fmt: skip
            await asyncio.sleep(1.0)
        await asyncio.to_thread(ctl, "start", "-w", "-o", args.pg_options)
        back = time.monotonic()
        await asyncio.gather(*load)
        r = await client.get("/readyz")
        ready_after = {"status": r.status_code, "body": r.json()}
    refusals = sorted(s["took"] for s in seen if s["status"] == 503)
    codes = Counter((s["status"], s.get("code"), s.get("retry_after"))
                    for s in seen if s["status"] != 200)  # fmt: skip
    took = ({"p50": round(refusals[len(refusals) // 2], 2), "max": round(refusals[-1], 2)}
            if refusals else None)  # fmt: skip
    return {
        "stopped_s": round(back - stopped, 1),
        "statuses": dict(Counter(str(s["status"]) for s in seen)),
        "answered_not_ended": [{"at_s": round(s["at"] - stopped, 1), "took_s": round(s["took"], 1),
                                "tail": s["tail"]}
                               for s in seen if s["status"] == 200 and not s["ended"]],
        "refusals": {f"{c} {code} retry-after={ra}": n for (c, code, ra), n in codes.items()},
        "refusal_took_s": took,
        "readyz_while_stopped": ready,
        "readyz_after": ready_after,
        "answered_after_back": sum(1 for s in seen if s["status"] == 200 and s["at"] > back),
        "refused_2s_after_back": sum(
            1 for s in seen if s["status"] == 503 and s["at"] > back + 2.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="the cluster's DSN (the run log)")
    parser.add_argument("--pg-ctl", required=True, help="the pg_ctl command, with its -D")
    parser.add_argument("--pg-options", required=True, help="the server options (-o) to start with")
    parser.add_argument("--outage-s", type=float, default=20.0, help="s the server is stopped")
    parser.add_argument("--clients", type=int, default=8, help="shoppers chatting at once")
    parser.add_argument("--before-s", type=float, default=3.0, help="s of chats before the stop")
    parser.add_argument("--after-s", type=float, default=8.0, help="s of chats once it is back")
    args = parser.parse_args()
    with (LabServer("lognormal", median_ms=200, sigma=0.5, n_tokens=16,
                    per_token_ms=5) as lab,
          tempfile.TemporaryDirectory(prefix="chainrun-pg-stop-") as tmp):  # fmt: skip
        cfg = Path(tmp) / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\nmax_connections = 100\n')
        proc, url = start_serve(cfg, args.dsn, Path(tmp) / "serve.err")
        try:
            result = asyncio.run(run(args, url))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        result["serve_said"] = (Path(tmp) / "serve.err").read_text().splitlines()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
