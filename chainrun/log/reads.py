"""Typed reads of the run log: runs, turns, steps, calls and tool calls as the row models
of :mod:`chainrun.log.rows`, and the latencies a new process seeds its hedge windows
from. :class:`chainrun.log.store.Store` reads through these methods."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from chainrun.errors import UserInputError
from chainrun.log.backend import LogDb
from chainrun.log.rows import (
    WINNER_OUTCOMES,
    CallRow,
    RunKind,
    RunRow,
    StepRow,
    ToolCallRow,
    TurnLog,
    TurnRow,
)
from chainrun.log.time_window import log_time

__all__ = ["LogReads", "SeedWindows"]


@dataclass(frozen=True)
class SeedWindows:
    """How a new process seeds its hedge windows from the log (see
    :meth:`LogReads.recent_latencies`): the newest ``max_calls`` answered calls of each
    hedged step that started within the last ``within_s`` seconds."""

    max_calls: int = 200
    within_s: float = 600.0


class LogReads:
    """The typed reads of a log (a base of :class:`chainrun.log.store.Store`): every
    query goes through ``log``."""

    log: LogDb

    def get_run(self, run_id: int) -> RunRow:
        """The run ``run_id``.

        Raises:
            UserInputError: no such run.
        """
        if not 0 < run_id < 2**63:
            raise UserInputError(f"run {run_id}: no such run in this log")
        rows = self.log.query("select * from runs where id = ?", [run_id])
        if not rows:
            raise UserInputError(f"run {run_id}: no such run in this log")
        return RunRow.from_db(rows[0])

    def latest_run_id(self, kind: str | None = None) -> int | None:
        """The newest run's id (of ``kind`` when given), or None in an empty log."""
        where = "where kind = ?" if kind else ""
        return self.log.scalar(f"select max(id) from runs {where}", [kind] if kind else [])

    def count_turns(self, run_id: int) -> int:
        """How many turns run ``run_id`` has logged so far (every status)."""
        return int(self.log.scalar("select count(*) from turns where run_id = ?", [run_id]) or 0)

    def count_runs(self) -> int:
        """How many runs the log holds."""
        return int(self.log.scalar("select count(*) from runs") or 0)

    def list_runs(
        self, limit: int = 50, *, since: str | None = None, until: str | None = None
    ) -> list[RunRow]:
        """The newest ``limit`` runs, newest first; with ``since``/``until`` (ISO-8601 UTC
        as the log writes it, see :func:`log_time`) only the runs that were running at
        some time in ``[since, until)``.

        ``n_turns`` of a run still running (a live ``chainrun serve`` run, a replay in
        progress) is the count of its turns logged so far; an ended run's is the count
        stored when it ended.
        """
        where, params = [], []
        if since is not None:
            where.append("(ended_at is null or ended_at >= ?)")
            params.append(since)
        if until is not None:
            where.append("started_at < ?")
            params.append(until)
        sql = "select * from runs"
        if where:
            sql += " where " + " and ".join(where)
        rows = [RunRow.from_db(r) for r in self.log.query(f"{sql} order by id desc limit ?",
                                                          [*params, limit])]  # fmt: skip
        for row in rows:
            if row.status == "running":
                row.n_turns = self.log.scalar(
                    "select count(*) from turns where run_id = ?", [row.id]
                )
        return rows

    def _rows(self, table: str, run_ids: int | Sequence[int]) -> list[dict[str, Any]]:
        ids = [run_ids] if isinstance(run_ids, int) else list(run_ids)
        if not ids:
            return []
        marks = ",".join("?" for _ in ids)
        return self.log.query(
            f'select * from "{table}" where run_id in ({marks}) order by id', ids
        )

    def turns(self, run_ids: int | Sequence[int]) -> list[TurnRow]:
        """The turns of a run (or of several), in the order they were logged."""
        return [TurnRow.from_db(r) for r in self._rows("turns", run_ids)]

    def steps(self, run_ids: int | Sequence[int]) -> list[StepRow]:
        """The steps of a run (or of several), by turn, in the order they were logged."""
        return [StepRow.from_db(r) for r in self._rows("steps", run_ids)]

    def steps_of_turns(self, turn_ids: Sequence[int], *, kind: str | None = None) -> list[StepRow]:
        """The steps of the turns ``turn_ids`` (only those of ``kind``, if given), in the
        order they were logged."""
        if not turn_ids:
            return []
        marks = ",".join("?" for _ in turn_ids)
        where = f"turn_id in ({marks})" + (" and kind = ?" if kind is not None else "")
        args: list[Any] = [*turn_ids, *([kind] if kind is not None else [])]
        rows = self.log.query(f"select * from steps where {where} order by id", args)
        return [StepRow.from_db(r) for r in rows]

    def calls(self, run_ids: int | Sequence[int]) -> list[CallRow]:
        """The model call attempts of a run (or of several), in the order they were logged."""
        return [CallRow.from_db(r) for r in self._rows("calls", run_ids)]

    def tool_calls(self, run_ids: int | Sequence[int]) -> list[ToolCallRow]:
        """The tool calls of a run (or of several), in the order they were logged."""
        return [ToolCallRow.from_db(r) for r in self._rows("tool_calls", run_ids)]

    def conversation(
        self, conversation_id: str, *, last: int, kinds: Sequence[RunKind] = ("live",)
    ) -> tuple[list[TurnRow], int]:
        """A conversation's latest turns in runs of ``kinds``: its ``last`` turns by turn
        index (then id), oldest first, and the highest turn index logged (0: none).

        Turns logged without a turn index (before migration 070) count as index 0.
        """
        marks = ",".join("?" for _ in kinds)
        where = (f"conversation_id = ? and run_id in (select id from runs where kind in "
                 f"({marks}))")  # fmt: skip
        args = [conversation_id, *kinds]
        top = self.log.scalar(f"select coalesce(max(turn_index), 0) from turns where {where}",
                              args)  # fmt: skip
        if last <= 0:
            return [], int(top)
        rows = self.log.query(
            f"select * from turns where {where} order by coalesce(turn_index, 0) desc, id desc "
            "limit ?",
            [*args, last],
        )
        turns = [TurnRow.from_db(r) for r in rows]
        turns.reverse()
        return turns, int(top)

    def turns_between(
        self, kind: RunKind, since: str | None = None, until: str | None = None
    ) -> list[TurnRow]:
        """The turns of every run of ``kind`` that started in ``[since, until)`` (ISO-8601
        UTC as the log writes it, :func:`log_time`; either bound optional), in log order;
        a turn without a start time is placed at its run's start. One query, filtered
        in the database (a fleet's live traffic may be millions of turns)."""
        sql = ("select t.* from turns t join runs r on r.id = t.run_id where r.kind = ?")
        params: list[Any] = [kind]
        stamp = "coalesce(t.started_at, r.started_at)"
        if since is not None:
            sql += f" and {stamp} >= ?"
            params.append(since)
        if until is not None:
            sql += f" and {stamp} < ?"
            params.append(until)
        return [TurnRow.from_db(r) for r in self.log.query(sql + " order by t.id", params)]

    def turn(self, turn_id: int) -> TurnLog | None:
        """One turn's row with its steps and calls, or None when there is no such turn."""
        rows = self.log.query("select * from turns where id = ?", [turn_id])
        if not rows:
            return None
        steps = self.log.query("select * from steps where turn_id = ? order by id", [turn_id])
        calls = self.log.query("select * from calls where turn_id = ? order by id", [turn_id])
        tools = self.log.query("select * from tool_calls where turn_id = ? order by id",
                               [turn_id])  # fmt: skip
        return TurnLog(TurnRow.from_db(rows[0]), [StepRow.from_db(r) for r in steps],
                       [CallRow.from_db(r) for r in calls],
                       [ToolCallRow.from_db(r) for r in tools])  # fmt: skip

    def find_turn_id(self, run_id: int, request_id: str) -> int | None:
        """The latest turn of run ``run_id`` logged with ``request_id``, or None."""
        got = self.log.scalar(
            "select max(id) from turns where run_id = ? and request_id = ?", [run_id, request_id]
        )
        return None if got is None else int(got)

    def runs_of_kind(self, kind: RunKind) -> list[RunRow]:
        """Every run of ``kind``, oldest first."""
        rows = self.log.query("select * from runs where kind = ? order by id", [kind])
        return [RunRow.from_db(r) for r in rows]

    def recent_latencies(
        self,
        step: str,
        *,
        max_calls: int = 200,
        within_s: float = 600.0,
        servers: Sequence[str] | None = None,
        model: str | None = None,
    ) -> list[float]:
        """The latencies (ms) the hedging window of ``step`` records, of the step's newest
        ``max_calls`` answered calls that started within the last ``within_s`` seconds,
        in any run of any process writing this log (newest first; a call's time is its
        turn's start), sent to one of ``servers`` (``host:port`` as logged in
        ``calls.server_address``; None: any) and asking for ``model`` (None: any).

        What the window records (:mod:`chainrun.hedging.engine`): a settled attempt's own
        latency, from its start to its first token for a streamed step (``ttft_ms``) or
        to its whole answer otherwise (``duration_ms``); of winners and of shadow losers
        that ran to the end. Errors never enter it.
        """
        since = log_time(datetime.now(UTC) - timedelta(seconds=within_s))
        outcomes = (*WINNER_OUTCOMES, "shadow_finished")
        marks = ",".join("?" for _ in outcomes)
        where, params = "", []
        if servers is not None:
            where += f" and c.server_address in ({','.join('?' for _ in servers) or 'null'})"
            params += list(servers)
        if model is not None:
            where += " and c.model = ?"
            params.append(model)
        rows = self.log.execute(
            "select case when c.stream = 1 then c.ttft_ms else c.duration_ms end "
            "from turns t join calls c on c.turn_id = t.id "
            f"where t.started_at >= ? and c.step = ? and c.outcome in ({marks}) "
            f"and c.error_type is null{where} order by t.started_at desc, c.id desc limit ?",
            [since, step, *outcomes, *params, max_calls],
        ).fetchall()
        return [float(r[0]) for r in rows if r[0] is not None]
