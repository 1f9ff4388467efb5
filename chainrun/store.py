"""The run log: a SQLite file (WAL mode) written through sqlite-utils.

Tables: ``runs`` → ``turns`` → ``steps`` and ``calls`` (one row per model call
attempt). Schema changes go through the numbered migrations in :data:`MIGRATIONS`,
applied once each and recorded in ``_migrations`` (the pattern of simonw/llm).
Prompts and outputs are stored; API keys never are (the config snapshot holds only
the *name* of the key's environment variable).
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlite_utils
from sqlite_utils.utils import sqlite3  # pysqlite3 when installed (sqlite-vec)

from chainrun.errors import UserInputError
from chainrun.records import CallRecord, RunKind, RunStatus, TurnRecord

DEFAULT_DB = "chainrun.db"


def utc_now() -> str:
    """Current wall-clock time as ISO-8601 UTC with ms (the format of every *_at column)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _m001_initial(db: sqlite_utils.Database) -> None:
    db.table("runs").create(
        {
            "id": int,
            "kind": str,  # replay | live | eval
            "label": str,
            "config": str,  # JSON snapshot of the ChainConfig
            "source": str,  # replay / eval file, if any
            "started_at": str,
            "ended_at": str,
            "status": str,  # running | complete | failed | interrupted
            "n_turns": int,
            "meta": str,  # JSON
        },
        pk="id",
    )
    db.table("turns").create(
        {
            "id": int,
            "run_id": int,
            "request_id": str,
            "conversation_id": str,  # gen_ai.conversation.id
            "input": str,
            "output": str,
            "label": str,
            "status": str,  # ok | refused | error | cancelled
            "verdicts": str,  # JSON
            "started_at": str,
            "duration_ms": float,
            "original_ms": float,
            "error_type": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("steps").create(
        {
            "id": int,
            "run_id": int,
            "turn_id": int,
            "step": str,
            "kind": str,
            "status": str,
            "started_offset_ms": float,
            "duration_ms": float,
            "output": str,
            "error_type": str,
            "n_attempts": int,
            "hedge_delay_ms": float,
            "hedge_fired": int,
            "hedge_won": int,
            "time_saved_ms": float,
            "detail": str,  # JSON
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("turn_id", "turns", "id")],
    )
    db.table("calls").create(
        {
            "id": int,
            "run_id": int,
            "turn_id": int,
            "step": str,
            "attempt": int,
            "target": str,
            "provider": str,  # gen_ai.provider.name
            "server_address": str,  # server.address:server.port
            "model": str,  # gen_ai.request.model
            "response_model": str,  # gen_ai.response.model
            "response_id": str,  # gen_ai.response.id
            "reasoning_effort": str,  # chainrun.request.reasoning_effort
            "stream": int,  # gen_ai.request.stream
            "temperature": float,  # gen_ai.request.temperature
            "max_tokens": int,  # gen_ai.request.max_tokens
            "prompt": str,  # messages sent, JSON
            "output": str,
            "reasoning": str,
            "started_at": str,
            "started_offset_ms": float,
            "ttft_ms": float,  # gen_ai.client.operation.time_to_first_chunk, in ms
            "duration_ms": float,  # gen_ai.client.operation.duration, in ms
            "chunk_gaps_ms": str,  # JSON list of ms between consecutive chunks
            "n_chunks": int,
            "bytes_received": int,
            "input_tokens": int,  # gen_ai.usage.input_tokens (NULL = unknown)
            "output_tokens": int,  # gen_ai.usage.output_tokens (includes reasoning)
            "reasoning_tokens": int,  # gen_ai.usage.reasoning.output_tokens
            "cached_input_tokens": int,  # gen_ai.usage.cache_read.input_tokens
            "finish_reason": str,  # gen_ai.response.finish_reasons
            "truncated": int,
            "error_type": str,  # error.type
            "error_message": str,
            "outcome": str,  # hedging outcome of this attempt
            "loop_lag_ms": float,
            "server_timings": str,  # JSON: llama.cpp `timings`
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("turn_id", "turns", "id")],
    )
    db.table("turns").create_index(["run_id"])
    db.table("steps").create_index(["run_id", "step"])
    db.table("calls").create_index(["run_id", "step"])
    db.table("calls").create_index(["turn_id"])


def _m002_fired_late(db: sqlite_utils.Database) -> None:
    # a copy fired while the client's own event loop was late (chainrun.hedging.looplag)
    db.table("calls").add_column("fired_late", int)


#: Numbered, append-only migrations. Never edit one that has shipped: add a new one.
MIGRATIONS: list[tuple[str, Callable[[sqlite_utils.Database], None]]] = [
    ("001_initial", _m001_initial),
    ("002_fired_late", _m002_fired_late),
]


def register_migration(name: str, fn: Callable[[sqlite_utils.Database], None]) -> None:
    """Append a migration (used by feature modules that own tables, e.g. the catalogue).

    Names must sort after every existing one; applying is idempotent per name.
    """
    if any(n == name for n, _ in MIGRATIONS):
        return
    MIGRATIONS.append((name, fn))


def migrate(db: sqlite_utils.Database) -> list[str]:
    """Apply every migration not yet recorded in ``_migrations``; return the names applied."""
    if "_migrations" not in db.table_names():
        db.table("_migrations").create({"name": str, "applied_at": str}, pk="name")
    done = {r["name"] for r in db.table("_migrations").rows}
    applied = []
    for name, fn in sorted(MIGRATIONS, key=lambda m: m[0]):
        if name in done:
            continue
        with db.conn:
            fn(db)
            db.table("_migrations").insert({"name": name, "applied_at": utc_now()})
        applied.append(name)
    return applied


class Store:
    """The run log. Open with :meth:`open`; use as a context manager to close it.

    Raises:
        UserInputError: the file exists but is not a SQLite database.
    """

    def __init__(self, db: sqlite_utils.Database) -> None:
        self.db = db

    @classmethod
    def open(cls, path: str | Path = DEFAULT_DB, *, create: bool = True) -> Store:
        """Open (creating and migrating if needed) the log at ``path``; ``":memory:"`` works.

        Args:
            create: False for read-only commands: a missing file is an error, not a new log.

        Raises:
            UserInputError: the directory does not exist; ``create`` is False and the file
                does not exist; the file is not SQLite; or it is a SQLite database of
                something else (tables but no chainrun ``_migrations``), which is left as is.
        """
        if str(path) == ":memory:":
            db = sqlite_utils.Database(memory=True)
            migrate(db)
            return cls(db)
        p = Path(path)
        if not p.parent.is_dir():
            raise UserInputError(f"{path}: directory {p.parent} does not exist")
        if not create and not p.exists():
            raise UserInputError(f"{path}: no such log (run a replay or a turn first)")
        try:
            # One opener at a time per file: two commands starting on a new log would
            # otherwise race to switch it to WAL and to apply the same migrations.
            # (flock is separate from SQLite's own fcntl byte-range locks on Linux.)
            with open(p, "ab") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                return cls(cls._open_file(p, path))
        except sqlite3.DatabaseError as e:
            raise UserInputError(f"{path}: not a chainrun log database ({e})") from None

    @staticmethod
    def _open_file(p: Path, path: str | Path) -> sqlite_utils.Database:
        db = sqlite_utils.Database(str(p))
        try:
            tables = db.table_names()
            if tables and "_migrations" not in tables:
                db.close()
                raise UserInputError(
                    f"{path}: a SQLite database of something else (no chainrun _migrations "
                    "table); use another --db"
                )
            db.enable_wal()
            # With WAL, NORMAL syncs at checkpoints instead of every commit: a commit
            # no longer waits for an fsync on the event loop (a power loss may drop
            # the last turns; the database stays consistent). SQLite docs, "WAL mode".
            db.execute("pragma synchronous = normal")
            db.execute("pragma busy_timeout = 10000")  # concurrent commands wait, not fail
            migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self.db.conn:
            yield

    # -- runs -------------------------------------------------------------------------
    def create_run(
        self,
        kind: RunKind,
        config_snapshot: str,
        label: str | None = None,
        source: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Insert a run with status ``running``; returns its id."""
        with self.db.conn:
            table = self.db.table("runs").insert(
                {
                    "kind": kind,
                    "label": label,
                    "config": config_snapshot,
                    "source": source,
                    "started_at": utc_now(),
                    "status": "running",
                    "n_turns": 0,
                    "meta": json.dumps(meta or {}),
                }
            )
        assert table.last_pk is not None
        return int(table.last_pk)

    def finish_run(self, run_id: int, status: RunStatus) -> None:
        """Mark a run ended with ``status`` and store its turn count."""
        n = self.db.execute("select count(*) from turns where run_id = ?", [run_id]).fetchone()[0]
        with self.db.conn:
            self.db.table("runs").update(
                run_id, {"status": status, "ended_at": utc_now(), "n_turns": n}
            )

    def get_run(self, run_id: int) -> dict[str, Any]:
        """The ``runs`` row of ``run_id``.

        Raises:
            UserInputError: no such run.
        """
        if not 0 < run_id < 2**63:
            raise UserInputError(f"run {run_id}: no such run in this log")
        rows = list(self.db.table("runs").rows_where("id = ?", [run_id]))
        if not rows:
            raise UserInputError(f"run {run_id}: no such run in this log")
        return rows[0]

    def latest_run_id(self, kind: str | None = None) -> int | None:
        where = "where kind = ?" if kind else ""
        row = self.db.execute(
            f"select max(id) from runs {where}", [kind] if kind else []
        ).fetchone()
        return row[0] if row else None

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        return list(self.db.table("runs").rows_where(order_by="id desc", limit=limit))

    # -- turns, steps, calls -------------------------------------------------------------
    def log_turn(self, run_id: int, turn: TurnRecord) -> int:
        """Write a turn with its steps and calls in one transaction; returns the turn id."""
        with self.db.conn:
            t = self.db.table("turns").insert(
                {
                    "run_id": run_id,
                    "request_id": turn.request_id,
                    "conversation_id": turn.conversation_id,
                    "input": turn.input,
                    "output": turn.output,
                    "label": turn.label,
                    "status": turn.status,
                    "verdicts": json.dumps(turn.verdicts),
                    "started_at": turn.started_at,
                    "duration_ms": turn.duration_ms,
                    "original_ms": turn.original_ms,
                    "error_type": turn.error_type,
                }
            )
            turn_id = int(t.last_pk)  # type: ignore[arg-type]
            if turn.steps:
                self.db.table("steps").insert_all(
                    [
                        {
                            **{k: v for k, v in asdict(s).items() if k != "detail"},
                            "detail": json.dumps(s.detail) if s.detail is not None else None,
                            "run_id": run_id,
                            "turn_id": turn_id,
                        }
                        for s in turn.steps
                    ]
                )
            if turn.calls:
                self.db.table("calls").insert_all(
                    [self._call_row(run_id, turn_id, c) for c in turn.calls]
                )
        return turn_id

    def update_step_calls(
        self, turn_id: int, step: str, calls: list[CallRecord], time_saved_ms: float | None
    ) -> None:
        """Rewrite a logged step's ``calls`` rows (matched by attempt) and its
        ``time_saved_ms``: how shadow losers that finished after the turn was logged
        reach the log."""
        with self.db.conn:
            for c in calls:
                row = self._call_row(0, turn_id, c)
                del row["run_id"], row["turn_id"]
                self.db.execute(
                    "update calls set "
                    + ", ".join(f"{k} = ?" for k in row)
                    + " where turn_id = ? and step = ? and attempt = ?",
                    [*row.values(), turn_id, step, c.attempt],
                )
            self.db.execute(
                "update steps set time_saved_ms = ? where turn_id = ? and step = ?",
                [time_saved_ms, turn_id, step],
            )

    @staticmethod
    def _call_row(run_id: int, turn_id: int, c: CallRecord) -> dict[str, Any]:
        row = c.row()
        row["chunk_gaps_ms"] = json.dumps([round(g, 3) for g in c.chunk_gaps_ms])
        row["server_timings"] = json.dumps(c.server_timings) if c.server_timings else None
        row["run_id"] = run_id
        row["turn_id"] = turn_id
        return row

    def turns(self, run_id: int) -> list[dict[str, Any]]:
        return list(self.db.table("turns").rows_where("run_id = ?", [run_id], order_by="id"))

    def steps(self, run_id: int) -> list[dict[str, Any]]:
        return list(self.db.table("steps").rows_where("run_id = ?", [run_id], order_by="id"))

    def calls(self, run_id: int) -> list[dict[str, Any]]:
        return list(self.db.table("calls").rows_where("run_id = ?", [run_id], order_by="id"))
