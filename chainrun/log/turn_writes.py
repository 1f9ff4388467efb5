"""A turn's rows written to the log: built as plain SQL on the event loop, run by the
writer (one transaction a turn); a write the database refuses for a text (a lone
surrogate, NUL on PostgreSQL) written again with U+FFFD; a step's calls rewritten when
its shadow losers finish after the turn was logged."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from chainrun.errors import LostTurn
from chainrun.log.backend import LogDb
from chainrun.log.rows import CallRow, TurnLog

__all__ = ["lost_turn", "prepare_turn", "scrub_surrogates", "write_step_calls"]

logger = logging.getLogger("chainrun.log.store")


def lost_turn(label: dict[str, Any], error: BaseException) -> LostTurn:
    """A turn the log refused, from the writer's label of it and the error."""
    return LostTurn(label.get("turn_id"), label.get("request_id"), str(error))


_INSERTS: dict[tuple[str, tuple[str, ...], str], str] = {}


def _insert_sql(table: str, columns: tuple[str, ...], tail: str = "") -> str:
    key = (table, columns, tail)
    sql = _INSERTS.get(key)
    if sql is None:
        cols = ", ".join(f'"{c}"' for c in columns)
        sql = f'insert into "{table}" ({cols}) values ({", ".join("?" for _ in columns)}){tail}'
        _INSERTS[key] = sql
    return sql


def prepare_turn(
    run_id: int, log: TurnLog, turn_id: int | None = None, dialect: str = "sqlite"
) -> Callable[[LogDb], int]:
    """The turn's rows as plain SQL and parameters, built by the caller (on the event
    loop) so that the writer thread only runs the database calls (which release the
    GIL) instead of competing with the loop for it; returns the write, which returns
    the turn id.

    Plain ``insert`` statements instead of sqlite-utils' ``insert``/``insert_all``,
    which read the table's schema on every call (profiled: most of a turn's write).
    ``turn_id``: the reserved id to insert with (None: SQLite assigns one).

    On PostgreSQL the turn row is inserted ``on conflict (id) do nothing``: a batch the
    writer retries after a lost connection may have been committed already (the commit
    reached the server, its answer did not); its turns are then found in place and
    skipped whole (a turn is one transaction), so a turn is logged exactly once.
    """
    turn = {**log.turn.to_db(), "run_id": run_id}
    if turn_id is not None:
        turn["id"] = turn_id
    tail = " on conflict (id) do nothing" if dialect == "postgresql" and turn_id else ""
    turn_sql = _insert_sql("turns", tuple(turn), tail)
    turn_params = tuple(turn.values())
    children: list[tuple[str, list[tuple[Any, ...]]]] = []
    for table, rows in (("steps", [s.to_db() for s in log.steps]),
                        ("calls", [c.to_db() for c in log.calls]),
                        ("tool_calls", [t.to_db() for t in log.tool_calls])):  # fmt: skip
        by_cols: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
        for row in rows:
            row["run_id"] = run_id
            row.pop("turn_id", None)
            by_cols.setdefault((*row, "turn_id"), []).append(tuple(row.values()))
        children += [(_insert_sql(table, cols), params) for cols, params in by_cols.items()]

    def write(db: LogDb) -> int:
        tid = turn_id
        try:
            cur = db.execute(turn_sql, turn_params)
            if tid is None:
                tid = cur.lastrowid
                assert tid is not None
            elif cur.rowcount == 0:
                return tid  # committed by an earlier try of this batch (PostgreSQL)
            for sql, params in children:
                db.executemany(sql, [(*p, tid) for p in params])
            return tid
        except db.text_errors:
            return _write_scrubbed(db, tid, (turn_sql, turn_params), children)

    return write


def _write_scrubbed(
    db: LogDb, partial_id: int | None, turn: tuple[str, tuple[Any, ...]],
    children: list[tuple[str, list[tuple[Any, ...]]]],
) -> int:  # fmt: skip
    """A turn's write again after the database refused one of its texts (a lone
    surrogate, ``UnicodeEncodeError: surrogates not allowed``, e.g. a model that streamed
    a cut ``"\\ud83d"`` escape; on PostgreSQL also a NUL character, which its text type
    cannot hold): undo its rows written so far (``partial_id``: the turn's id, when
    known) and write them with those characters replaced by U+FFFD, rather than fail
    the commit and lose the turn. Only on this failure path: the hot path pays nothing
    for it."""
    if partial_id is not None:
        for table, col in (("tool_calls", "turn_id"), ("calls", "turn_id"), ("steps", "turn_id"),
                           ("turns", "id")):  # fmt: skip
            db.execute(f"delete from {table} where {col} = ?", [partial_id])
    cur = db.execute(turn[0], scrub_surrogates(turn[1]))
    tid = partial_id if partial_id is not None else cur.lastrowid
    assert tid is not None
    for sql, params in children:
        db.executemany(sql, [(*scrub_surrogates(p), tid) for p in params])
    logger.warning("turn %s: lone surrogates or NUL characters in its texts were logged as "
                   "U+FFFD", tid)  # fmt: skip
    return int(tid)


_SURROGATE = re.compile("[\ud800-\udfff\x00]")


def scrub_surrogates(params: tuple[Any, ...]) -> tuple[Any, ...]:
    """``params`` with every UTF-16 surrogate (and NUL character) in its strings replaced
    by U+FFFD (the Unicode replacement character): what a log write does when the
    database refuses a text (``UnicodeEncodeError: surrogates not allowed``; PostgreSQL:
    text cannot contain NUL)."""
    return tuple(_SURROGATE.sub("\ufffd", p) if isinstance(p, str) else p for p in params)


def write_step_calls(
    db: LogDb, turn_id: int, step: str, calls: list[CallRow], time_saved_ms: float | None,
    hedge_rounds: list[dict[str, Any]] | None = None,
) -> None:  # fmt: skip
    """Rewrite a logged step's calls (by round and attempt), time saved (ms) and, given,
    the per-round hedge in its ``detail["hedge_rounds"]`` (inside the caller's
    transaction)."""
    for c in calls:
        row = c.to_db()
        for key in ("id", "run_id", "turn_id"):
            row.pop(key, None)
        sql = ("update calls set " + ", ".join(f"{k} = ?" for k in row)
               + " where turn_id = ? and step = ? and round = ? and attempt = ?")  # fmt: skip
        params = (*row.values(), turn_id, step, c.round, c.attempt)
        try:
            db.execute(sql, params)
        except db.text_errors:  # a lone surrogate in a loser's text (see _write_scrubbed)
            db.execute(sql, scrub_surrogates(params))
    db.execute(
        "update steps set time_saved_ms = ? where turn_id = ? and step = ?",
        [time_saved_ms, turn_id, step],
    )
    if hedge_rounds is not None:
        logged = db.scalar("select detail from steps where turn_id = ? and step = ?",
                           [turn_id, step])  # fmt: skip
        detail = {**(json.loads(logged) if logged else {}), "hedge_rounds": hedge_rounds}
        db.execute("update steps set detail = ? where turn_id = ? and step = ?",
                   [json.dumps(detail), turn_id, step])  # fmt: skip
