"""The run log's database behind one small interface: SQLite or PostgreSQL.

Every query of the log (the store, the writer thread, the migrations, the reports) is
written once, in SQL both databases run, with ``?`` placeholders, and goes through a
:class:`LogDb`:

* :class:`SqliteLogDb` wraps a sqlite-utils ``Database`` (one connection, bound to the
  thread that made it, as before);
* :class:`PgLogDb` wraps a psycopg 3 ``ConnectionPool`` (psycopg_pool): any thread may
  use it, each statement outside a transaction runs in autocommit on a pooled
  connection, and :meth:`LogDb.transaction` holds one connection for its block. ``?``
  becomes psycopg's ``%s`` (and ``%`` is doubled) once per distinct statement.

What must differ between the two is kept here: column types (:data:`PG_TYPES`), the
``id`` key (SQLite's ``INTEGER PRIMARY KEY``, PostgreSQL's identity column), a boolean
bound to an integer column (SQLite stores a bool as 0/1; PostgreSQL refuses a boolean
for a ``bigint``, so booleans are sent as ``int8``), and the texts each refuses (a lone
surrogate in both; a NUL character in PostgreSQL).

The ``table(name)`` view offers the part of sqlite-utils' ``Table`` the migrations and
the readers use (``create``, ``add_column``, ``create_index``, ``columns_dict``,
``rows_where``, ``insert_all``), on both databases, so one list of migrations serves
both (:mod:`chainrun.log.migrations`).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import sqlite_utils

from chainrun.log.transactions import write_transaction

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = [
    "PG_RECONNECT_TIMEOUT_S",
    "PG_TYPES",
    "POSTGRES_SCHEMES",
    "LogDb",
    "PgLogDb",
    "PgTable",
    "SqliteLogDb",
    "is_postgres_url",
    "open_pg_pool",
    "pg_sql",
    "pool_cannot_connect",
    "shown_url",
]

Dialect = Literal["sqlite", "postgresql"]

#: the URL schemes of a PostgreSQL log (libpq's connection URIs, PostgreSQL docs 34.1.1)
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

#: a column's Python type (as sqlite-utils' ``Table.create`` takes it) -> PostgreSQL type
PG_TYPES: dict[Any, str] = {
    int: "bigint",
    bool: "bigint",
    float: "double precision",
    str: "text",
    bytes: "bytea",
    "int": "bigint",
    "integer": "bigint",
    "float": "double precision",
    "real": "double precision",
    "text": "text",
    "str": "text",
    "blob": "bytea",
}
_PY_TYPES = {"bigint": int, "integer": int, "smallint": int, "double precision": float,
             "real": float, "text": str, "bytea": bytes, "boolean": bool}  # fmt: skip


def is_postgres_url(target: object) -> bool:
    """Whether ``target`` (a ``--db`` value) names a PostgreSQL log: a string starting
    with ``postgresql://`` or ``postgres://``."""
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


def shown_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and ``runs.meta``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://***"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class LogDb:
    """A run log's database connection(s), the same calls on SQLite and PostgreSQL.

    SQL uses ``?`` placeholders. Rows come back as tuples from :meth:`execute` and as
    dicts (column name -> value) from :meth:`query`.
    """

    dialect: Dialect
    #: exceptions a write raises for a text the database cannot store (then the turn is
    #: written again with those characters replaced: ``store.scrub_text``)
    text_errors: tuple[type[BaseException], ...] = (UnicodeEncodeError,)
    #: exceptions meaning the database could not be reached (a write is then retried)
    network_errors: tuple[type[BaseException], ...] = ()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; a cursor-like object (``fetchone``, ``fetchall``,
        iteration, ``rowcount``)."""
        raise NotImplementedError

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter tuple."""
        raise NotImplementedError

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """The rows of a query as dicts, in the query's order."""
        raise NotImplementedError

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row (None when there is no row)."""
        row = self.execute(sql, params).fetchone()
        return None if row is None else row[0]

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction (nested: a savepoint); rolled back on an exception."""
        raise NotImplementedError
        yield  # pragma: no cover

    def table(self, name: str) -> Any:
        """A sqlite-utils-like view of table ``name`` (see the module docstring)."""
        raise NotImplementedError

    def table_names(self) -> list[str]:
        """The tables of the log."""
        raise NotImplementedError

    def insert_returning_id(self, table: str, row: Mapping[str, Any]) -> int:
        """Insert ``row`` into ``table`` (inside the caller's transaction, if any); its id."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SqliteLogDb(LogDb):
    """A SQLite log: a sqlite-utils ``Database`` (one connection, one thread)."""

    dialect: Dialect = "sqlite"

    def __init__(self, db: sqlite_utils.Database) -> None:
        self.db = db
        self.conn = db.conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, params)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.conn.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with write_transaction(self.db):
            yield

    def table(self, name: str) -> sqlite_utils.db.Table:
        return self.db.table(name)

    def table_names(self) -> list[str]:
        return self.db.table_names()

    def insert_returning_id(self, table: str, row: Mapping[str, Any]) -> int:
        cols = ", ".join(f'"{c}"' for c in row)
        marks = ", ".join("?" for _ in row)
        cur = self.conn.execute(f'insert into "{table}" ({cols}) values ({marks})',
                                tuple(row.values()))  # fmt: skip
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def close(self) -> None:
        self.db.close()


# -- PostgreSQL -------------------------------------------------------------------------

_PG_SQL: dict[str, str] = {}


def pg_sql(sql: str) -> str:
    """``sql`` with ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled).
    The log's SQL holds no ``?`` or ``%`` inside string literals. Cached per statement."""
    out = _PG_SQL.get(sql)
    if out is None:
        out = sql.replace("%", "%%").replace("?", "%s")
        if len(_PG_SQL) < 4096:
            _PG_SQL[sql] = out
    return out


class _Fetched:
    """A statement's result, fetched whole (the connection goes back to the pool)."""

    __slots__ = ("_rows", "description", "rowcount")

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int, names: list[str] | None):
        self._rows = rows
        self.rowcount = rowcount
        self.description = None if names is None else [(n,) for n in names]

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._rows)


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Set up each new pooled connection: booleans go to integer columns as ``int8``."""
    from psycopg.adapt import Dumper  # psycopg only loads for PostgreSQL

    class BoolAsInt(Dumper):
        oid = 20  # int8 (PostgreSQL's pg_type)

        def dump(self, obj: Any) -> bytes:
            return b"1" if obj else b"0"

    conn.adapters.register_dumper(bool, BoolAsInt)


#: s a pool keeps retrying a connection that failed before it gives that attempt up.
#: psycopg_pool retries with exponential backoff (about 1, 2, 4, 8, 16 s... apart, for up
#: to ``reconnect_timeout``, 5 minutes by default; psycopg_pool docs, "Connection pools",
#: pool behaviour), one growing attempt at a time: after a 35 s outage its next try came
#: 15 s after the server was back, and the writer, finding no connection, went on
#: counting the outage. Given up after 1 s instead, the attempt makes room for a new one,
#: which the pool starts as soon as a caller asks for a connection (it grows on demand):
#: the log is written again within about a second of the server's return.
PG_RECONNECT_TIMEOUT_S = 1.0


#: the environment variable that turns psycopg's server-side prepared statements on
PREPARE_ENV = "CHAINRUN_PG_PREPARE_THRESHOLD"


def prepare_threshold() -> int | None:
    """psycopg 3's ``prepare_threshold`` for the log's connections: None (never prepare)
    unless :data:`PREPARE_ENV` names a number of executions.

    psycopg prepares a statement on the server after 5 executions by default; behind a
    pooler in transaction mode (PgBouncer before 1.21, or without
    ``max_prepared_statements``) the prepared statement lives on a server connection the
    next transaction may not get ("prepared statement does not exist", or another
    client's statement run with these parameters). psycopg's docs ("Server-side prepared
    statements", PgBouncer) say to set ``prepare_threshold=None`` there; chainrun's
    statements are short, so it costs little to never prepare them. Set the variable (to
    5, psycopg's default) on a direct connection or a pooler that tracks them.
    """
    raw = os.environ.get(PREPARE_ENV, "").strip()
    return int(raw) if raw.isdigit() else None


def open_pg_pool(
    url: str, *, min_size: int = 1, max_size: int = 4, timeout_s: float = 10.0
) -> ConnectionPool:
    """A psycopg_pool ``ConnectionPool`` on ``url`` (autocommit connections, each
    checked when taken from the pool so that one a server restart broke is replaced;
    a failed reconnection given up after :data:`PG_RECONNECT_TIMEOUT_S` so that the next
    request tries again at once), opened and holding ``min_size`` connections.

    Raises:
        UserInputError: psycopg is not installed, or the server cannot be reached (or
            refuses the role/database) within ``timeout_s`` seconds.
    """
    from chainrun.errors import UserInputError

    try:
        import psycopg  # only a PostgreSQL log needs it
        from psycopg_pool import ConnectionPool, PoolTimeout
    except ImportError:
        raise UserInputError(
            f"{shown_url(url)}: a PostgreSQL log needs psycopg 3 and psycopg_pool: "
            "pip install 'chainrun[postgres]'"
        ) from None
    try:
        probe = psycopg.connect(url, connect_timeout=max(1, int(timeout_s)), autocommit=True)
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserInputError(f"{shown_url(url)}: cannot connect to the log database "
                             f"({first})") from None  # fmt: skip
    probe.close()
    # the pool's own warnings while the server is away (one per failed reconnection)
    # would bury the writer's lines, which say the same once with what it means
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    pool: ConnectionPool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True, "connect_timeout": 3, "application_name": "chainrun",
                "prepare_threshold": prepare_threshold()},
        configure=_configure,
        check=ConnectionPool.check_connection,
        timeout=timeout_s,
        reconnect_timeout=PG_RECONNECT_TIMEOUT_S,
        name="chainrun-log",
        open=False,
    )
    try:
        pool.open(wait=True, timeout=timeout_s)
    except PoolTimeout:
        pool.close()
        raise UserInputError(f"{shown_url(url)}: cannot connect to the log database "
                             f"within {timeout_s:g} s") from None  # fmt: skip
    return pool


@functools.cache
def pool_cannot_connect() -> type[Exception]:
    """``PoolCannotConnect``: psycopg_pool's ``PoolTimeout`` for a wait during which the
    pool's own connection attempts failed (the server, or a pooler in front of it, is
    away), as against a pool whose connections were all in use (a busy log). Either way
    no statement ran. Made at first use: psycopg_pool is an optional dependency."""
    from psycopg_pool import PoolTimeout

    class PoolCannotConnect(PoolTimeout):
        """No pooled connection within the wait, and the pool could not make one."""

    return PoolCannotConnect


class PgLogDb(LogDb):
    """A PostgreSQL log through a psycopg_pool ``ConnectionPool`` (thread-safe), or
    through one connection of its own (:meth:`dedicated`, for one thread).

    Args:
        url: the libpq connection URI (``postgresql://USER@HOST:PORT/DB``).
        pool: the pool (:func:`open_pg_pool`); closed by :meth:`close`. None: one
            connection, opened at the first statement and again after it broke.
        wait_s: how long a statement waits for a pooled connection (seconds) before it
            raises ``PoolTimeout`` (one of :attr:`network_errors`; its subclass
            :func:`pool_cannot_connect` when the pool's attempts to connect failed
            meanwhile: the server is away, not busy). Without a pool,
            the connect timeout (libpq's ``connect_timeout``, whole seconds, at least 2).
    """

    dialect: Dialect = "postgresql"

    def __init__(self, url: str, pool: ConnectionPool | None, *, wait_s: float = 2.0) -> None:
        import psycopg
        from psycopg_pool import PoolTimeout

        self.url = url
        self.pool = pool
        self.wait_s = wait_s
        self._own: psycopg.Connection[Any] | None = None
        self._local = threading.local()
        self.text_errors = (UnicodeEncodeError, psycopg.DataError)
        # OperationalError: connection refused/reset/closed by the server (a restart, a
        # failover); PoolTimeout: no connection could be made within the pool timeout
        self.network_errors = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)

    def dedicated(self) -> PgLogDb:
        """A :class:`PgLogDb` on the same database with one connection of its own (no
        pool), for one thread: the log's writer. A statement that finds the connection
        broken (a server restart, a failover, a reset) raises one of
        :attr:`network_errors` and the next statement connects again, at once: the
        caller's retries decide how often it tries, not a pool's reconnection backoff.
        :meth:`close` closes that connection only."""
        return PgLogDb(self.url, None, wait_s=self.wait_s)

    @contextmanager
    def _take(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one statement or one transaction: a pooled one (given back
        after), or this object's own (opened if it has none or it broke)."""
        if self.pool is not None:
            from psycopg_pool import PoolTimeout

            failed = self.pool.get_stats().get("connections_errors", 0)
            try:
                with self.pool.connection(timeout=self.wait_s) as conn:
                    yield conn
            except PoolTimeout as e:
                if self.pool.get_stats().get("connections_errors", 0) <= failed:
                    raise  # every connection in use: a busy pool
                raise pool_cannot_connect()(f"{e} (connecting to the database failed "
                                            "meanwhile)") from e  # fmt: skip
            return
        import psycopg

        own = self._own
        if own is not None and not (own.closed or own.broken):
            conn = own
        else:
            if own is not None:
                own.close()
            self._own = None
            conn = psycopg.connect(self.url, autocommit=True, application_name="chainrun",
                                   connect_timeout=max(2, round(self.wait_s)),
                                   prepare_threshold=prepare_threshold())  # fmt: skip
            _configure(conn)
            self._own = conn
        try:
            yield conn
        except self.network_errors:
            if conn.broken or conn.closed:  # the next statement connects again
                conn.close()
                self._own = None
            raise

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        with self._take() as conn:
            yield conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Fetched:
        with self._conn() as conn:
            cur = conn.execute(pg_sql(sql), params or None)
            desc = cur.description
            rows = cur.fetchall() if desc is not None else []
            names = [d.name for d in desc] if desc is not None else None
            return _Fetched(rows, cur.rowcount, names)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        with self._conn() as conn, conn.cursor() as cur:
            cur.executemany(pg_sql(sql), list(params))

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        res = self.execute(sql, params)
        assert res.description is not None
        names = [d[0] for d in res.description]
        return [dict(zip(names, row, strict=True)) for row in res.fetchall()]

    @contextmanager
    def session(self) -> Iterator[None]:
        """Hold one pooled connection for this thread's statements in the block (for
        session state such as an advisory lock); transactions inside it use it too."""
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        with self._take() as conn:
            self._local.conn = conn
            try:
                yield
            finally:
                self._local.conn = None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        held = getattr(self._local, "conn", None)
        if held is not None:
            with held.transaction():
                yield
            return
        with self._take() as conn:
            self._local.conn = conn
            try:
                with conn.transaction():
                    yield
            finally:
                self._local.conn = None

    def table(self, name: str) -> PgTable:
        return PgTable(self, name)

    def table_names(self) -> list[str]:
        return [r[0] for r in self.execute(
            "select table_name from information_schema.tables "
            "where table_schema = current_schema() order by table_name"
        )]  # fmt: skip

    def insert_returning_id(self, table: str, row: Mapping[str, Any]) -> int:
        cols = ", ".join(f'"{c}"' for c in row)
        marks = ", ".join("?" for _ in row)
        got = self.execute(
            f'insert into "{table}" ({cols}) values ({marks}) returning id', tuple(row.values())
        ).fetchone()
        assert got is not None
        return int(got[0])

    def sync_identity(self, table: str) -> None:
        """Move ``table``'s id sequence past its largest id (after rows were inserted
        with explicit ids, e.g. by ``chainrun log copy``)."""
        self.execute(
            f"select setval(pg_get_serial_sequence('\"{table}\"', 'id'), "
            f'coalesce((select max(id) from "{table}"), 0) + 1, false)'
        )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self._own is not None:
            self._own.close()
            self._own = None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PgTable:
    """The part of sqlite-utils' ``Table`` the log uses, on PostgreSQL."""

    def __init__(self, db: PgLogDb, name: str) -> None:
        self.db = db
        self.name = name

    def create(
        self,
        columns: Mapping[str, Any],
        *,
        pk: str | Sequence[str] | None = None,
        foreign_keys: Sequence[tuple[str, str, str]] = (),
        not_null: Iterable[str] = (),
    ) -> None:
        """``create table`` as sqlite-utils would on SQLite: an ``id`` integer key
        becomes an identity column (ids assigned by PostgreSQL unless given)."""
        required = set(not_null)
        refs = {col: (table, other) for col, table, other in foreign_keys}
        defs = []
        for col, kind in columns.items():
            sql_type = PG_TYPES[kind.lower() if isinstance(kind, str) else kind]
            d = f"{_quote(col)} {sql_type}"
            if pk == col and sql_type == "bigint":
                d += " generated by default as identity primary key"
            elif pk == col:
                d += " primary key"
            if col in required:
                d += " not null"
            if col in refs:
                d += f" references {_quote(refs[col][0])} ({_quote(refs[col][1])})"
            defs.append(d)
        if pk is not None and not isinstance(pk, str):
            defs.append(f"primary key ({', '.join(_quote(c) for c in pk)})")
        self.db.execute(f"create table {_quote(self.name)} ({', '.join(defs)})")

    def add_column(self, name: str, col_type: Any) -> None:
        sql_type = PG_TYPES[col_type.lower() if isinstance(col_type, str) else col_type]
        self.db.execute(f"alter table {_quote(self.name)} add column {_quote(name)} {sql_type}")

    def create_index(
        self, columns: Sequence[str], *, if_not_exists: bool = False, unique: bool = False
    ) -> None:
        """An index named as sqlite-utils names it (``idx_TABLE_COL1_COL2``)."""
        index = f"idx_{self.name}_{'_'.join(columns)}"
        self.db.execute(
            f"create {'unique ' if unique else ''}index "
            f"{'if not exists ' if if_not_exists else ''}{_quote(index)} on "
            f"{_quote(self.name)} ({', '.join(_quote(c) for c in columns)})"
        )

    @property
    def columns_dict(self) -> dict[str, type]:
        """Column name -> Python type, in table order."""
        rows = self.db.execute(
            "select column_name, data_type from information_schema.columns "
            "where table_schema = current_schema() and table_name = ? order by ordinal_position",
            [self.name],
        ).fetchall()
        return {name: _PY_TYPES.get(kind, str) for name, kind in rows}

    @property
    def rows(self) -> Iterator[dict[str, Any]]:
        return self.rows_where()

    def rows_where(
        self,
        where: str | None = None,
        where_args: Sequence[Any] = (),
        *,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Rows as dicts, as sqlite-utils' ``rows_where`` gives them."""
        sql = f"select * from {_quote(self.name)}"
        if where:
            sql += f" where {where}"
        if order_by:
            sql += f" order by {order_by}"
        if limit is not None:
            sql += f" limit {int(limit)}"
        return iter(self.db.query(sql, list(where_args)))

    def insert_all(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert rows (grouped by their columns), inside the caller's transaction if any."""
        by_cols: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
        for row in rows:
            by_cols.setdefault(tuple(row), []).append(tuple(row.values()))
        for cols, params in by_cols.items():
            names = ", ".join(_quote(c) for c in cols)
            marks = ", ".join("?" for _ in cols)
            self.db.executemany(f"insert into {_quote(self.name)} ({names}) values ({marks})",
                                params)  # fmt: skip
