"""A run's lifecycle in the log: created ``running`` with the identity of the process that
writes it, ended with a status, resumed; and the check, through ``/proc``, that a run
still ``running`` has a live writer (else it is marked ``interrupted`` when the log is
next opened)."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import sqlite_utils

from chainrun.log.backend import LogDb, SqliteLogDb
from chainrun.log.migrations import utc_now
from chainrun.log.rows import RunKind, RunRow, RunStatus, TurnRow
from chainrun.log.turn_ids import reserve
from chainrun.runtime.processes import pid_exists

__all__ = [
    "end_run",
    "end_running_run",
    "insert_run",
    "log_lost_turns",
    "lost_turns_of_process",
    "mark_interrupted_runs",
    "mark_resumed",
    "new_run",
    "writer_alive",
    "writer_identity",
]


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, from /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: count fields after its closing ")"
    return stat[stat.rfind(")") + 2 :].split()[19]


def writer_identity() -> dict[str, Any]:
    """Who writes a run: host, pid and the process's start time (so that a reused pid is
    not mistaken for the writer). Stored in ``runs.meta["writer"]``."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start(pid)}


def writer_alive(writer: dict[str, Any] | None) -> bool:
    """Whether the process that wrote a run may still be writing it. A writer on another
    host (a log on a shared disk) counts as alive: it cannot be checked from here."""
    if not writer or writer.get("host") != socket.gethostname():
        return True
    pid = writer.get("pid")
    if not isinstance(pid, int):
        return True
    start = _process_start(pid)
    if start is None:
        return pid_exists(pid) and writer.get("start") is None
    return writer.get("start") in (None, start)


def mark_interrupted_runs(db: LogDb | sqlite_utils.Database) -> list[int]:
    """Mark ``interrupted`` every run still ``running`` whose writing process is gone
    (killed with SIGKILL, the machine lost power): the next open of the log tells the
    truth instead of leaving it ``running``. Its committed turns are kept as they are;
    the turns it had in flight are logged ``lost`` (:func:`log_lost_turns`). A writer on
    another host counts as alive (see :func:`writer_alive`). Returns the ids marked (by
    this call: processes opening the log at once mark each run once)."""
    log = db if isinstance(db, LogDb) else SqliteLogDb(db)
    marked: list[int] = []
    for run_id, raw in log.execute("select id, meta from runs where status = 'running'"):
        if writer_alive(_writer_of(raw)):
            continue
        with log.transaction():
            cur = log.execute(
                "update runs set status = 'interrupted', ended_at = ? "
                "where id = ? and status = 'running'",
                [utc_now(), run_id],
            )
            if cur.rowcount == 0:  # another process marked it first
                continue
            log_lost_turns(log, run_id)
            n = log.scalar("select count(*) from turns where run_id = ?", [run_id])
            log.execute("update runs set n_turns = ? where id = ?", [n, run_id])
        marked.append(run_id)
    return marked


def log_lost_turns(log: LogDb, run_id: int) -> list[int]:
    """Log as ``lost`` each turn run ``run_id`` had claimed an index for (on a shared
    log, ``conversation_index``: :meth:`chainrun.log.store.Store.claim_turn_index`) or
    a request key for (``request_keys``, any log: a keyed turn on SQLite too) and never
    logged, inside the caller's transaction: its message, index (when one was claimed in
    the log) and start as claimed, its request id (a retry with the same
    ``Idempotency-Key`` gets this turn), no output, ``error_type`` ``process_ended`` (its
    process ended before the turn's rows were written). The conversation's next turn then
    finds its index taken and does not wait for it; its history leaves it out (it had no
    answer). Returns the new turns' ids (reserved as a writer reserves them)."""
    rows = log.query(
        "select conversation_id, last_index, claimed_input, claimed_at, claimed_request_id from "
        "conversation_index c where claimed_run_id = ? and not exists (select 1 from "
        "turns t where t.conversation_id = c.conversation_id and t.turn_index = "
        "c.last_index and t.run_id in (select id from runs where kind = 'live'))",
        [run_id],
    )
    lost = [TurnRow(run_id=run_id, conversation_id=r["conversation_id"],
                    turn_index=r["last_index"], input=r["claimed_input"] or "",
                    status="lost", error_type="process_ended", started_at=r["claimed_at"],
                    request_id=r["claimed_request_id"]) for r in rows]  # fmt: skip
    claimed = {t.request_id for t in lost if t.request_id is not None}
    keyed = log.query(
        "select request_id, conversation_id, input, created_at from request_keys k "
        "where run_id = ? and not exists (select 1 from turns t where t.request_id = "
        "k.request_id) order by created_at", [run_id],
    )  # fmt: skip
    lost += [TurnRow(run_id=run_id, conversation_id=r["conversation_id"],
                     input=r["input"] or "", status="lost", error_type="process_ended",
                     started_at=r["created_at"], request_id=r["request_id"])
             for r in keyed if r["request_id"] not in claimed]  # fmt: skip
    if not lost:
        return []
    start, _ = reserve(log, len(lost))
    ids = []
    for k, turn in enumerate(lost):
        turn.id = start + k
        row = turn.to_db()
        cols = ", ".join(f'"{c}"' for c in row)
        log.execute(f"insert into turns ({cols}) values ({', '.join('?' for _ in row)})",
                    list(row.values()))  # fmt: skip
        ids.append(start + k)
    return ids


def lost_turns_of_process(log: LogDb, pid: int, since: str) -> list[tuple[str, int]]:
    """The turns logged ``lost`` (:func:`log_lost_turns`) in the runs process ``pid`` of
    this host started at ``since`` (ISO-8601 UTC) or later, as (conversation id, turn
    index), oldest first: what ``serve --workers N`` says of a worker that died."""
    host = socket.gethostname()
    runs = [run_id for run_id, raw in log.execute(
        "select id, meta from runs where kind = 'live' and started_at >= ?", [since])
        if (w := _writer_of(raw)) is not None and w.get("pid") == pid
        and w.get("host") == host]  # fmt: skip
    if not runs:
        return []
    marks = ",".join("?" for _ in runs)
    return [(r["conversation_id"], r["turn_index"]) for r in log.query(
        f"select conversation_id, turn_index from turns where status = 'lost' and run_id in "
        f"({marks}) order by id", runs)]  # fmt: skip


def _writer_of(raw: str | None) -> dict[str, Any] | None:
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        return None
    writer = meta.get("writer") if isinstance(meta, dict) else None
    return writer if isinstance(writer, dict) else None


def new_run(
    kind: RunKind, config_snapshot: str, label: str | None, source: str | None,
    meta: dict[str, Any] | None,
) -> RunRow:  # fmt: skip
    """A run row about to be inserted: started now, written by this process."""
    return RunRow(kind=kind, label=label, config=config_snapshot, source=source,
                  started_at=utc_now(),
                  meta={**(meta or {}), "writer": writer_identity()})  # fmt: skip


def insert_run(db: LogDb, run: RunRow) -> int:
    """Insert ``run`` (inside the caller's transaction); its id."""
    return db.insert_returning_id("runs", run.to_db())


def end_running_run(db: LogDb, run_id: int, status: str, ended_at: str) -> bool:
    """End a ``running`` run with ``status`` and its turn count (inside the caller's
    transaction); whether it was running."""
    n = db.scalar("select count(*) from turns where run_id = ?", [run_id])
    cur = db.execute(
        "update runs set status = ?, ended_at = ?, n_turns = ? where id = ? and status = 'running'",
        [status, ended_at, n, run_id],
    )
    return cur.rowcount > 0


def end_run(db: LogDb, run_id: int, status: RunStatus) -> None:
    """End run ``run_id`` with ``status`` and its turn count, whatever its status was
    (inside the caller's transaction)."""
    n = db.scalar("select count(*) from turns where run_id = ?", [run_id])
    db.execute(
        "update runs set status = ?, ended_at = ?, n_turns = ? where id = ?",
        [status, utc_now(), n, run_id],
    )


def mark_resumed(db: LogDb, run: RunRow) -> None:
    """Mark the ended ``run`` ``running`` again, written by this process (inside the
    caller's transaction): ``--resume``."""
    meta = dict(run.meta or {})
    meta["writer"] = writer_identity()
    meta["resumed"] = [*meta.get("resumed", []), utc_now()]
    db.execute(
        "update runs set status = 'running', ended_at = null, meta = ? where id = ?",
        [json.dumps(meta), run.id],
    )
