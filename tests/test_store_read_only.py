"""A log this process cannot write: readers open it read-only, writers name the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from sqlite_utils.utils import sqlite3

from chainrun.errors import UserInputError
from chainrun.log.store import Store


def chainrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip



# -- 3. a log in a directory (or a file) this process cannot write ------------------------


def _read_only(path: Path) -> Iterator[Path]:
    """Make ``path`` not writable by this process (chmod, or chattr +i for root)."""
    path.chmod(0o555 if path.is_dir() else 0o444)
    how = "chmod"
    if os.access(path, os.W_OK):  # root: permission bits do not stop it
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            path.chmod(0o755)
            pytest.skip("cannot make a path read-only here (root without chattr)")
        how = "chattr"
    try:
        yield path
    finally:
        if how == "chattr":
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def ro_log(tmp_path: Path) -> Iterator[Path]:
    """A valid log with one run, in a directory this process cannot write."""
    d = tmp_path / "rodir"
    d.mkdir()
    with Store.open(d / "log.db") as s:
        s.create_run("replay", "{}", label="ro")
    assert sorted(p.name for p in d.iterdir()) == ["log.db"]  # closed: WAL checkpointed
    yield from _read_only(d)


def test_readers_read_a_log_in_a_read_only_directory(ro_log: Path) -> None:
    db = ro_log / "log.db"
    with Store.open(db, create=False) as s:
        assert [r.label for r in s.list_runs()] == ["ro"]
    proc = chainrun("runs", "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["label"] for r in json.loads(proc.stdout)["runs"]] == ["ro"]
    assert sorted(p.name for p in ro_log.iterdir()) == ["log.db"]


def test_a_wal_with_changes_in_a_read_only_directory_is_said_exactly(tmp_path: Path) -> None:
    d = tmp_path / "rodir"
    d.mkdir()
    with Store.open(d / "log.db") as s:
        s.create_run("replay", "{}")
    (d / "log.db-wal").write_bytes(b"\0" * 32)  # a crashed writer's leftover
    for _ in _read_only(d):
        with pytest.raises(UserInputError) as info:
            Store.open(d / "log.db", create=False)
        msg = str(info.value)
        assert msg.startswith(f"{d / 'log.db'}: cannot read: the directory {d} is not writable")
        assert "log.db-shm" in msg


def test_writing_a_read_only_log_names_the_file(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as s:
        s.create_run("replay", "{}")
    for _ in _read_only(db):
        for create in (True, False):
            with Store.open(db, create=create) as s:  # a writer, a reader: both can read
                assert len(s.list_runs()) == 1
                with pytest.raises(sqlite3.OperationalError, match="readonly"):
                    s.create_run("replay", "{}")


def test_the_cli_names_the_log_a_write_failed_on(capsys: pytest.CaptureFixture[str]) -> None:
    from chainrun.cli import handle_errors

    @handle_errors
    def command(db: Path, as_json: bool = False) -> None:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    with pytest.raises(typer.Exit):
        command(db=Path("ro/log.db"), as_json=True)
    captured = capsys.readouterr()
    assert "ro/log.db: the log database is not writable (attempt to write a readonly" in (
        " ".join(captured.err.split())
    )
    assert json.loads(captured.out)["error"]["file"] == "ro/log.db"
