"""Run log tests on both backends: SQLite files and PostgreSQL.

PostgreSQL comes from the ``CHAINRUN_TEST_POSTGRES`` DSN (``.ci/run`` starts a private
cluster from Debian's package and sets it); a test that needs it is skipped only when
that variable is absent. Each test gets a schema of its own (dropped afterwards), named
in the DSN's ``options=-csearch_path=...``, so tests never see each other's rows.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest

from chainrun.log.store import Store

#: the environment variable holding the test server's DSN
PG_ENV = "CHAINRUN_TEST_POSTGRES"
BACKENDS = ("sqlite", "postgresql")


def pg_base_url() -> str | None:
    return os.environ.get(PG_ENV) or None


def with_search_path(url: str, schema: str) -> str:
    """``url`` with ``options=-csearch_path=SCHEMA`` (libpq URI parameters)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


@contextmanager
def pg_schema(base: str) -> Iterator[str]:
    """A DSN whose connections work in a new, empty schema; the schema is dropped after."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'create schema "{name}"')
    try:
        yield with_search_path(base, name)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'drop schema "{name}" cascade')


def need_pg() -> str:
    base = pg_base_url()
    if base is None:
        pytest.skip(f"{PG_ENV} is not set (.ci/run sets it)")
    return base


@contextmanager
def log_target(backend: str, tmp_path: Path, name: str = "log.db") -> Iterator[str]:
    """A new, empty log of ``backend``: a SQLite path, or a PostgreSQL DSN."""
    if backend == "sqlite":
        yield str(tmp_path / name)
        return
    with pg_schema(need_pg()) as url:
        yield url


@contextmanager
def open_log(backend: str) -> Iterator[Store]:
    """An open log on ``backend``: SQLite in memory (as the shared ``store`` fixture), or a
    PostgreSQL schema of its own."""
    if backend == "sqlite":
        with Store.open(":memory:") as s:
            yield s
        return
    with (
        tempfile.TemporaryDirectory() as tmp,
        pg_schema(need_pg()) as url,
        Store.open(url) as s,
    ):
        s.catalog_file = Path(tmp) / "catalog.db"  # the catalogue, never in the checkout
        yield s
