"""The run log: migrations, WAL, round trips, NULL for unknown token counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from chainrun.errors import UserInputError
from chainrun.log.migrations import MIGRATIONS, migrate
from chainrun.log.rows import CallRow, RunRow, StepRow, ToolCallRow, TurnLog, TurnRow
from chainrun.log.store import Store


def test_migrations_apply_once(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with Store.open(path) as s:
        names = {r["name"] for r in s.db["_migrations"].rows}
        assert {n for n, _ in MIGRATIONS} <= names
        assert migrate(s.db) == []
        assert s.db.execute("pragma journal_mode").fetchone()[0] == "wal"
    with Store.open(path) as s:  # reopening applies nothing new
        assert migrate(s.db) == []


def test_a_migration_that_fails_half_way_leaves_nothing(monkeypatch, tmp_path: Path) -> None:
    """Each migration is one transaction with its ``_migrations`` row. The catalogue's
    (010) used sqlite-utils' enable_fts, whose executescript committed the migration's
    half first: a crash after it left tables with no record, and the next open failed."""
    import sqlite_utils

    from chainrun.log import migrations
    def crash_after_fts(db: sqlite_utils.Database) -> None:
        migrations._m010_catalog(db)
        raise KeyboardInterrupt  # the process is stopped after the FTS index is built

    monkeypatch.setattr(migrations, "MIGRATIONS", (("010_catalog", crash_after_fts),))
    db = sqlite_utils.Database(tmp_path / "log.db")
    with pytest.raises(KeyboardInterrupt):
        migrate(db)
    assert "products" not in db.table_names() and "products_fts" not in db.table_names()
    assert list(db["_migrations"].rows) == []
    monkeypatch.undo()
    assert "010_catalog" in migrate(db)  # the next open applies it whole
    assert db.execute("select count(*) from products_fts").fetchone()[0] == 0
    db.close()


def test_two_processes_opening_a_new_log_apply_each_migration_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "log.db"
    code = "import sys; from chainrun.log.store import Store; Store.open(sys.argv[1]).close()"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    with Store.open(path) as s:
        names = [r["name"] for r in s.db["_migrations"].rows]
    assert sorted(names) == sorted(n for n, _ in MIGRATIONS)


def test_turn_round_trip_keeps_unknown_tokens_null() -> None:
    with Store.open(":memory:") as s:
        run = s.create_run("replay", "{}", label="t")
        turn = TurnLog(TurnRow(input="hi", output="hello", request_id="r1"))
        turn.steps.append(StepRow(step="compose", duration_ms=12.5))
        turn.calls.append(CallRow(step="compose", ttft_ms=5.0, duration_ms=12.5,
                                  chunk_gaps_ms=[1.0, 2.0], n_chunks=3))  # fmt: skip
        s.log_turn(run, turn)
        s.finish_run(run, "complete")
        call = s.calls(run)[0]
        assert call.input_tokens is None and call.output_tokens is None
        assert call.chunk_gaps_ms == [1.0, 2.0]
        r = s.get_run(run)
        assert r.status == "complete" and r.n_turns == 1


async def test_a_turn_written_by_the_writer_binds_unknown_as_null_and_flags_as_integers(
    tmp_path: Path,
) -> None:
    """The write path's shortcuts (rows read from ``__dict__``, chunk gaps as ``%.3f``
    text, adapters for None and bool) store what ``model_dump`` + ``json.dumps`` +
    pysqlite3's own adaptation stored: NULL for unknown, 0/1 integers for flags, gaps
    to the µs."""
    gaps = [1.0, 2.00049, 0.1234567, 1234.5]
    with Store.open(tmp_path / "log.db") as s:
        run = s.create_run("live", "{}")
        turn = TurnLog(TurnRow(input="hi", output="hello"))
        turn.steps.append(StepRow(step="compose", hedge_fired=True))
        turn.calls.append(CallRow(step="compose", chunk_gaps_ms=gaps, truncated=True,
                                  n_chunks=5, ttft_ms=None))  # fmt: skip
        turn_id = await s.alog_turn(run, turn)
        await s.flush()
        row = s.db.execute(
            "select typeof(ttft_ms), typeof(input_tokens), typeof(truncated), truncated,"
            " typeof(fired_late), fired_late, chunk_gaps_ms from calls where turn_id = ?",
            [turn_id],
        ).fetchone()
        assert row[:6] == ("null", "null", "integer", 1, "integer", 0)
        assert s.calls(run)[0].chunk_gaps_ms == [round(g, 3) for g in gaps]
        step = s.db.execute(
            "select typeof(hedge_fired), hedge_fired, typeof(time_saved_ms) from steps"
        ).fetchone()
        assert step == ("integer", 1, "null")
        assert s.turns(run)[0].verdicts == {}


def test_unknown_run_and_non_database_file(tmp_path: Path) -> None:
    with Store.open(":memory:") as s, pytest.raises(UserInputError, match="no such run"):
        s.get_run(42)
    bad = tmp_path / "not.db"
    bad.write_text("this is not sqlite " * 100)
    with pytest.raises(UserInputError, match="not a chainrun log"):
        Store.open(bad)


def test_a_log_another_process_holds_locked_is_one_error_naming_the_lock(
    tmp_path: Path,
) -> None:
    """A log file another connection holds locked past SQLite's wait (5 s) is one error
    line that says so (it said "not a chainrun log database (database is locked)")."""
    from sqlite_utils.utils import sqlite3  # the store's SQLite: its locks are seen in-process

    path = tmp_path / "held.db"
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("begin exclusive")
        holder.execute("create table mid_write (x)")  # a write under way, never committed
        with pytest.raises(UserInputError) as err:
            Store.open(path)
    finally:
        holder.close()
    assert str(err.value) == (f"{path}: cannot open: another process holds the file locked "
                              "(database is locked)")  # fmt: skip


def test_concurrent_openers_of_a_new_log_share_it(tmp_path: Path) -> None:
    """Two commands starting on a new file must not race on WAL and migrations."""
    import subprocess
    import sys

    path = tmp_path / "shared.db"
    code = (
        "import sys; from chainrun.log.store import Store; s = Store.open(sys.argv[1]); "
        "s.create_run('live', '{}'); s.close()"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for p in procs:
        _, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr.decode()
    with Store.open(path) as s:
        assert len(s.list_runs()) == 4


@pytest.mark.parametrize("model", [RunRow, TurnRow, StepRow, CallRow, ToolCallRow])
def test_row_models_match_their_tables(model: type) -> None:
    """One shape per log fact: each row model's fields are exactly its table's columns
    after every migration (a new column needs both a migration and a field)."""
    table = {RunRow: "runs", TurnRow: "turns", StepRow: "steps", CallRow: "calls",
             ToolCallRow: "tool_calls"}[model]
    with Store.open(":memory:") as s:
        columns = set(s.db[table].columns_dict)
    assert set(model.model_fields) == columns


def test_answer_timings_migrate_as_null_for_old_turns(tmp_path: Path) -> None:
    """A log written before migration 003 keeps its turns; their answer timings are
    unknown (NULL), never 0."""
    import sqlite_utils

    from chainrun.log.migrations import MIGRATIONS as ALL

    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    db["_migrations"].create({"name": str, "applied_at": str}, pk="name")
    for name, fn in ALL:
        if name.startswith(("001", "002")):
            fn(db)
            db["_migrations"].insert({"name": name, "applied_at": "2026-11-29"})
    db["runs"].insert({"id": 1, "kind": "replay", "status": "complete", "n_turns": 1})
    db["turns"].insert({"id": 1, "run_id": 1, "input": "hi", "status": "ok", "duration_ms": 9.0})
    db.close()
    with Store.open(path) as s:
        (turn,) = s.turns(1)
    assert turn.duration_ms == 9.0 and turn.answer_ttft_ms is None and turn.answer_done_ms is None


def test_runs_lists_the_turns_of_a_run_still_running() -> None:
    """A live ``chainrun serve`` run listed 0 turns until it ended (new user)."""
    with Store.open(":memory:") as s:
        run = s.create_run("live", "{}")
        for i in range(2):
            s.log_turn(run, TurnLog(TurnRow(input="hi", output="ok", request_id=f"r{i}")))
        assert [(r.status, r.n_turns) for r in s.list_runs()] == [("running", 2)]
        s.finish_run(run, "complete")
        assert [(r.status, r.n_turns) for r in s.list_runs()] == [("complete", 2)]


def test_an_outside_reader_does_not_delete_the_wal_of_an_open_log(tmp_path: Path) -> None:
    """New user: a `sqlite3` read of the log while chainrun had it open deleted the WAL
    (Store.open closed an fd of the log file, which dropped SQLite's POSIX locks), and
    every turn committed after that was lost."""
    import subprocess
    import sys

    path = tmp_path / "log.db"
    count = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('select count(*) from turns').fetchone()[0]); c.close()"
    )

    def outside_count() -> int:
        out = subprocess.run([sys.executable, "-c", count, str(path)], capture_output=True,
                             text=True, timeout=60, check=True)  # fmt: skip
        return int(out.stdout)

    with Store.open(path) as s:
        run = s.create_run("live", "{}")
        s.log_turn(run, TurnLog(TurnRow(input="a", output="ok", request_id="r1")))
        assert outside_count() == 1
        assert Path(f"{path}-wal").exists()  # the reader left the open log's WAL alone
        s.log_turn(run, TurnLog(TurnRow(input="b", output="ok", request_id="r2")))
        assert outside_count() == 2
    with Store.open(path) as s:
        assert len(s.turns(run)) == 2


def test_a_directory_as_the_log_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="is a directory"):
        Store.open(tmp_path)


async def test_tool_calls_are_written_with_their_turn_under_a_reserved_id(tmp_path) -> None:
    """A turn with tools takes its id at its start (its idempotency keys hold it); its
    tool calls are written with it and read back with it."""
    with Store.open(tmp_path / "t.db") as store:
        run_id = store.create_run("live", "{}")
        first = await store.areserve_turn_id()
        second = await store.areserve_turn_id()
        assert second == first + 1
        turn = TurnRow(id=second, input="put 2 of JKT-12 in my cart")
        row = ToolCallRow(step="compose", call_id="call_1", tool="add_to_cart",
                          arguments='{"sku": "JKT-12", "qty": 2}', status="ok",
                          idempotency_key=f"{second}:call_1", side_effects=True,
                          started_offset_ms=12.5, duration_ms=3.25, result='{"added": true}')
        logged = await store.alog_turn(run_id, TurnLog(turn, tool_calls=[row]))
        plain = await store.alog_turn(run_id, TurnLog(TurnRow(input="no tools")))
        await store.flush()
        back = store.turn(second)
        assert logged == second and plain not in (first, second)
        assert back is not None and back.tool_calls_of("compose")[0].idempotency_key == (
            f"{second}:call_1")
        (read,) = store.tool_calls(run_id)
        assert read.turn_id == second and read.side_effects is True and read.duration_ms == 3.25
