"""Write transactions on the run log's SQLite connection.

One helper, used by the store, the catalogue and the vector index, so that every
multi-row write takes SQLite's write lock up front (see :func:`write_transaction`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlite_utils


@contextmanager
def write_transaction(db: sqlite_utils.Database) -> Iterator[None]:
    """One write transaction: ``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error).

    sqlite-utils commits each statement on its own unless a transaction is open (a
    ``with conn:`` block opens none), so every multi-row write goes through here: a
    process killed mid-write leaves all of it or none. IMMEDIATE takes the write lock
    at the start, so a concurrent writer waits (busy timeout) instead of failing with
    "database is locked" on a stale read snapshot (SQLite docs, "BEGIN TRANSACTION",
    "WAL mode"). Nested: a savepoint.
    """
    if db.conn.in_transaction:
        with db.atomic():
            yield
        return
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        raise
    db.conn.execute("COMMIT")
