"""Follow-ups on a freshly started ``chainrun serve`` whose PostgreSQL log is 100 ms away
each way (a delaying TCP proxy in front of the test server): 40 conversations' second
turns sent at once. The new process remembers none of them, so each turn reads its
conversation from the log, and 40 reads at once on a slow link leave the process's pool
with no connection to give for a while: a busy pool is not an outage, and every turn
must be answered with its history (turn index 2, turn 1's exchange in the prompt).
Needs ``CHAINRUN_TEST_POSTGRES``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from delay_proxy import DelayProxy
from log_backends import need_pg, pg_schema
from serve_helpers import kill_with_workers, sse, workers_ready

from chainrun import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]
N = 40
#: s each way on the link to the database
DELAY_S = 0.1


def _chain(lab: LabServer) -> dict[str, Any]:
    return {
        "order": ["compose"], "answer_step": "compose",
        "providers": {"lab": {"base_url": lab.base_url}},
        "steps": {"compose": {"provider": "lab", "stream": True,
                              "prompt": "{history}Shopper: {message}\nStylist:"}},
    }  # fmt: skip


def _toml(lab: LabServer) -> str:
    return (
        'order = ["compose"]\nanswer_step = "compose"\n\n'
        f'[providers.lab]\nbase_url = "{lab.base_url}"\n\n'
        '[steps.compose]\nprovider = "lab"\nstream = true\n'
        'prompt = "{history}Shopper: {message}\\nStylist:"\n'
    )


async def _first_turns(lab: LabServer, url: str) -> None:
    with Store.open(url) as store:
        async with Chain(config_from_dict(_chain(lab)), quiet=True, store=store) as chain:
            for i in range(N):
                done = await chain.run_turn(f"first question of c{i}?", conversation_id=f"c{i}")
                assert done.status == "ok"
            await chain.flush()


async def _follow_ups(base: str) -> list[str | None]:
    async def one(i: int, client: httpx.AsyncClient) -> str | None:
        body = {"message": f"second question of c{i}?", "conversation_id": f"c{i}"}
        async with client.stream("POST", "/chat", json=body) as r:
            assert r.status_code == 200, await r.aread()
            status = None
            async for event, data in sse(r):
                if event == "turn":
                    status = data["status"]
            return status

    limits = httpx.Limits(max_connections=N + 5)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        return list(await asyncio.gather(*(one(i, client) for i in range(N))))


def test_forty_follow_ups_on_a_fresh_serve_over_a_slow_log_all_have_their_history(
    tmp_path: Path,
) -> None:
    with pg_schema(need_pg()) as url, \
         LabServer("fast", n_tokens=4, per_token_ms=1, record_bodies=True) as lab:  # fmt: skip
        asyncio.run(_first_turns(lab, url))
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        with DelayProxy(parts.hostname, parts.port, DELAY_S) as proxy:
            user = f"{parts.username}@" if parts.username else ""
            slow = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
            cfg = tmp_path / "chainrun.toml"
            cfg.write_text(_toml(lab), encoding="utf-8")
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            env.pop("CHAINRUN_SERVE_TOKEN", None)
            proc = subprocess.Popen(
                [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
                 "--db", slow],
                cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            lines: list[str] = []
            try:
                assert proc.stderr is not None
                first = proc.stderr.readline()
                assert first.startswith("chainrun serve: http://"), first + proc.stderr.read()
                threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
                base = first.split()[2].rstrip("/")
                assert workers_ready(base, 1)
                statuses = asyncio.run(_follow_ups(base))
            finally:
                kill_with_workers(proc.pid)
                proc.wait(30)
                if proc.stderr is not None:
                    proc.stderr.close()
        with Store.open(url) as store:
            second = store.log.query(
                "select conversation_id, turn_index from turns where input like 'second%'"
            )
        prompts = {str(r["messages"]) for r in lab.requests()
                   if "second question" in str(r["messages"])}  # fmt: skip
    assert statuses == ["ok"] * N, (statuses, lines[-20:])
    # each follow-up is its conversation's second turn, none started over at 1
    assert sorted(r["turn_index"] for r in second) == [2] * N, second
    assert len(prompts) == N
    without = [p for p in prompts
               if "first question of c" + p.split("second question of c")[1].split("?")[0] + "?"
               not in p]  # fmt: skip
    said = [ln for ln in lines if "log" in ln][:8]
    assert without == [], (f"{len(without)} of {N} answered without their history", said)
    assert not any("without their earlier turns" in ln for ln in lines), lines
    assert proxy.connections >= 1
