"""The PostgreSQL log behind PgBouncer in transaction mode (Debian's ``pgbouncer``, which
``.ci/run`` starts in front of the test cluster and names in ``CHAINRUN_TEST_PGBOUNCER``;
skipped only when that is unset). A transaction pooler hands each transaction whichever
server connection is free, so nothing may rely on session state: no server-side
prepared statements (psycopg prepares after 5 executions unless told not to), no
session-level advisory lock (it stays on the server connection). Each test gets a
database of its own (PgBouncer 1.18 passes no ``search_path`` through, so the schema per
test of the direct tests cannot be used)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from cli_runner import chainrun, short_replay
from log_backends import need_pg
from test_log_postgres import start_serve

from chainrun.lab import LabServer
from chainrun.log.store import Store

BOUNCER_ENV = "CHAINRUN_TEST_PGBOUNCER"
ROOT = Path(__file__).resolve().parents[1]
POOLER_ERRORS = re.compile(r"InvalidSqlStatementName|DuplicatePreparedStatement|"
                           r"ProtocolViolation|prepared statement")


def _with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


@contextmanager
def bounced_db() -> Iterator[tuple[str, str]]:
    """A new database: (its URL through PgBouncer, its URL direct); dropped after."""
    import psycopg

    bouncer = os.environ.get(BOUNCER_ENV)
    if not bouncer:
        pytest.skip(f"{BOUNCER_ENV} is not set (.ci/run starts PgBouncer and sets it)")
    direct = need_pg()
    name = f"b_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    try:
        yield _with_db(bouncer, name), _with_db(direct, name)
    finally:
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute(f'drop database "{name}" with (force)')


def _advisory_locks(direct: str) -> int:
    import psycopg

    with psycopg.connect(direct, autocommit=True) as conn:
        row = conn.execute("select count(*) from pg_locks where locktype = 'advisory' and "
                           "database = (select oid from pg_database where datname = "
                           "current_database())").fetchone()  # fmt: skip
        return int(row[0]) if row else 0


def test_four_processes_open_the_log_at_once_round_after_round() -> None:
    """Each round a new log opened by four processes together: all get ready, and no
    advisory lock is left behind on any server connection (a session lock was, from the
    ninth round of eleven, and a process never got ready)."""
    code = "import sys; from chainrun.log.store import Store; Store.open(sys.argv[1]).close()"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(6):
        with bounced_db() as (url, direct):
            procs = [subprocess.Popen([sys.executable, "-c", code, url], env=env, cwd=ROOT,
                                      stderr=subprocess.PIPE, text=True) for _ in range(4)]
            for p in procs:
                _, err = p.communicate(timeout=120)
                assert p.returncode == 0, err
            assert _advisory_locks(direct) == 0
            with Store.open(url, create=False) as s:  # migrated once, whole
                assert s.count_runs() == 0


def test_a_replay_through_the_pooler_logs_every_turn(tmp_path: Path) -> None:
    """Twelve requests, four in flight: every statement runs far past psycopg's default
    threshold of 5 executions, through a pooler that keeps no prepared statement."""
    with bounced_db() as (url, _), LabServer("fast", n_tokens=4) as lab:
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
        requests = short_replay(tmp_path, n=12)
        for _ in range(2):
            res = chainrun("replay", str(requests), "--config", str(cfg), "--db", url,
                           "--concurrency", "4")  # fmt: skip
            assert res.returncode == 0, res.output
            assert not POOLER_ERRORS.search(res.output), res.output
        with Store.open(url, create=False) as s:
            turns = s.turns([1, 2])
            assert len(turns) == 24 and {t.status for t in turns} == {"ok"}
            assert len(s.steps([1, 2])) >= 24 and s.calls([1, 2])


def test_serve_with_two_workers_through_the_pooler(tmp_path: Path) -> None:
    with bounced_db() as (url, direct), LabServer("fast", n_tokens=4) as lab:
        proc, base = start_serve(url, lab, tmp_path)
        try:
            async def chats() -> list[int]:
                async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                    async def one(i: int) -> int:
                        r = await client.post("/v1/chat/completions", json={
                            "model": "chainrun-shop",
                            "messages": [{"role": "user", "content": f"jacket {i}"}]})
                        assert r.status_code == 200, r.text
                        return int(r.json()["chainrun"]["turn_id"])

                    return list(await asyncio.gather(*(one(i) for i in range(30))))

            turn_ids = asyncio.run(chats())
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert not POOLER_ERRORS.search(err), err[-3000:]
        with Store.open(url, create=False) as s:
            runs = s.runs_of_kind("live")
            turns = s.turns([r.id for r in runs if r.id is not None])
        assert sorted(t.id for t in turns) == sorted(turn_ids) and len(set(turn_ids)) == 30
        assert _advisory_locks(direct) == 0
