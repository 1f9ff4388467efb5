"""What the log holds for actions and requests beyond a turn's own rows: pending actions
(``tool_calls`` rows of ``confirm`` tools, decided by a later turn), clients'
``Idempotency-Key`` s (``request_keys``) and conversations' owners
(``conversation_owners``).

Every decision is one conditional statement, so processes sharing a PostgreSQL log
agree on it without a lock held across a turn: an action is decided by the first
``update ... where status = 'awaiting_confirmation'`` (its row count says who won), a
key and an owner are taken by the first ``insert ... on conflict do nothing``.

These run on the calling thread against the database (not through the writer): call
them through :meth:`chainrun.log.store.Store.off_loop`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chainrun.log.backend import LogDb
from chainrun.log.rows import RunKind

__all__ = ["LoggedActions"]


class LoggedActions:
    """Pending actions, request keys and conversation owners (a base of
    :class:`chainrun.log.store.Store`)."""

    log: LogDb

    # -- results recorded by live turns -------------------------------------------------
    def recorded_tool_results(self, request_id: str) -> dict[str, str]:
        """What the newest live turn with ``request_id`` told its model of each tool call
        it carried out (status ``ok``), by its idempotency key's ``{step}:{round}:{position}``
        (a replay line's ``id`` is the live turn's request id); ``{}``: no such turn."""
        rows = self.log.query(
            "select c.idempotency_key, c.result from tool_calls c "
            "where c.status = 'ok' and c.turn_id = (select max(t.id) from turns t "
            "join runs r on r.id = t.run_id where t.request_id = ? and r.kind = 'live')",
            [request_id],
        )
        out = {}
        for row in rows:
            key, result = row["idempotency_key"], row["result"]
            if key and result is not None:
                out[":".join(str(key).split(":")[-3:])] = str(result)
        return out

    # -- pending actions ---------------------------------------------------------------
    def record_action(self, row: dict[str, Any]) -> None:
        """Write a pending action (an ``actions`` row, status ``awaiting_confirmation``)
        now, in its own transaction: it is decidable before its question reaches the
        shopper (the asking turn's own rows are written when the turn ends). An action
        recorded already (a step run again) is left as it is."""
        cols = ", ".join(row)
        with self.log.transaction():
            self.log.execute(
                f"insert into actions ({cols}) values ({', '.join('?' for _ in row)}) "
                "on conflict (id) do nothing", list(row.values()))  # fmt: skip

    def pending_actions(
        self, conversation_id: str, kinds: Sequence[RunKind] = ("live",),
        run_id: int | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """The ``awaiting_confirmation`` actions of a conversation asked in runs of
        ``kinds`` (or in run ``run_id`` only: a replay's conversations are its own),
        oldest first (``actions`` rows as dicts)."""
        return self._actions(conversation_id, kinds, run_id,
                             "a.status = 'awaiting_confirmation'")  # fmt: skip

    def confirmed_actions(
        self, conversation_id: str, kinds: Sequence[RunKind] = ("live",),
        run_id: int | None = None, limit: int = 5,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """A conversation's newest ``confirmed`` actions (at most ``limit``), oldest first:
        what a yes repeated after another turn took them refers to."""
        rows = self._actions(conversation_id, kinds, run_id, "a.status = 'confirmed'")
        return rows[-limit:]

    def open_actions(
        self, conversation_id: str, kinds: Sequence[RunKind] = ("live",),
        run_id: int | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """:meth:`pending_actions` and :meth:`confirmed_actions` (all of them) in one read,
        oldest first: what a turn's desk reads of its conversation's actions."""
        return self._actions(conversation_id, kinds, run_id,
                             "a.status in ('awaiting_confirmation', 'confirmed')")  # fmt: skip

    def _actions(self, conversation_id: str, kinds: Sequence[RunKind], run_id: int | None,
                 where: str) -> list[dict[str, Any]]:  # fmt: skip
        params: list[Any]
        if run_id is not None:
            runs, params = "a.run_id = ?", [run_id]
        else:
            marks = ",".join("?" for _ in kinds)
            runs, params = f"a.run_id in (select id from runs where kind in ({marks}))", [*kinds]
        rows = self.log.query(
            f"select a.* from actions a where a.conversation_id = ? and {where} and {runs} "
            "order by a.asked_at, a.id", [conversation_id, *params])  # fmt: skip
        return [dict(r) for r in rows]

    def action_row(self, action_id: str, conversation_id: str) -> dict[str, Any] | None:
        """Action ``action_id`` of conversation ``conversation_id`` (any status), or None
        (another conversation's action is not this conversation's to see)."""
        rows = self.log.query("select * from actions where id = ? and conversation_id = ?",
                              [action_id, conversation_id])  # fmt: skip
        return dict(rows[0]) if rows else None

    def answered_turns(self, conversation_id: str, after: int, before: int,
                       kinds: Sequence[RunKind] = ("live",), run_id: int | None = None) -> int:
        """How many turns of the conversation with an index between ``after`` and
        ``before`` (both excluded) are logged in runs of ``kinds`` (or in run ``run_id``
        only): the later turns the shopper was answered (turns still running, a retried
        "yes" among them, are not logged yet)."""
        params: list[Any]
        if run_id is not None:
            runs, params = "run_id = ?", [run_id]
        else:
            marks = ",".join("?" for _ in kinds)
            runs, params = f"run_id in (select id from runs where kind in ({marks}))", [*kinds]
        got = self.log.scalar(
            "select count(*) from turns where conversation_id = ? and turn_index > ? "
            f"and turn_index < ? and {runs}", [conversation_id, after, before, *params])
        return int(got or 0)

    def decide_action(
        self, action_id: str, status: str, *, decided_by: str, decided_at: str,
        decided_turn_id: int | None,
    ) -> bool:  # fmt: skip
        """Decide pending action ``action_id`` (``confirmed``, ``denied`` or ``expired``)
        unless it was decided already; True: this call decided it (of two processes
        deciding one action at once, exactly one gets True). The asking call's
        ``tool_calls`` row, once written, says the same."""
        with self.log.transaction():
            cur = self.log.execute(
                "update actions set status = ?, decided_by = ?, decided_at = ?, "
                "decided_turn_id = ? where id = ? and status = 'awaiting_confirmation'",
                [status, decided_by, decided_at, decided_turn_id, action_id],
            )
            won = bool(cur.rowcount == 1)
            if won:
                self.log.execute(
                    "update tool_calls set status = ?, decided_by = ?, decided_at = ?, "
                    "decided_turn_id = ? where idempotency_key = ? and question is not null",
                    [status, decided_by, decided_at, decided_turn_id, action_id],
                )
            return won

    def start_action(self, action_id: str, turn_id: int | None, at: str) -> bool:
        """Mark confirmed action ``action_id`` started by its deciding turn ``turn_id``
        right before the tool starts; False: the turn no longer holds it (it was given
        back to the shopper meanwhile: nothing may run)."""
        who = "decided_turn_id is null" if turn_id is None else "decided_turn_id = ?"
        with self.log.transaction():
            cur = self.log.execute(
                f"update actions set started_at = ? where id = ? and status = 'confirmed' "
                f"and {who} and started_at is null",
                [at, action_id, *([] if turn_id is None else [turn_id])])  # fmt: skip
            return bool(cur.rowcount == 1)

    def finish_action(self, action_id: str, outcome: str, at: str) -> None:
        """Record how confirmed action ``action_id``'s run ended (its tool status)."""
        with self.log.transaction():
            self.log.execute("update actions set outcome = ?, finished_at = ? where id = ?",
                             [outcome, at, action_id])  # fmt: skip

    def reopen_action(self, action_id: str, decided_at: str, changes: dict[str, Any]) -> bool:
        """Give confirmed action ``action_id`` back to the shopper (pending again, its id
        and so its tool key kept) if it is still the claim decided at ``decided_at``
        (so two turns reopening one claim agree: one gets True); ``changes``: columns set
        besides (a new question and expiry when it is asked again)."""
        sets = "".join(f", {c} = ?" for c in changes)
        with self.log.transaction():
            cur = self.log.execute(
                "update actions set status = 'awaiting_confirmation', decided_by = null, "
                "decided_at = null, decided_turn_id = null, started_at = null, outcome = null, "
                f"finished_at = null{sets} where id = ? and status = 'confirmed' "
                "and decided_at = ?", [*changes.values(), action_id, decided_at])  # fmt: skip
            won = bool(cur.rowcount == 1)
            if won:
                self.log.execute(
                    "update tool_calls set status = 'awaiting_confirmation', decided_by = null, "
                    "decided_at = null, decided_turn_id = null where idempotency_key = ? "
                    "and question is not null", [action_id])  # fmt: skip
            return won

    def reask_action(self, action_id: str, changes: dict[str, Any]) -> bool:
        """Change pending action ``action_id``'s question, tool config and expiry (it is
        asked again); False: it was decided meanwhile."""
        sets = ", ".join(f"{c} = ?" for c in changes)
        with self.log.transaction():
            cur = self.log.execute(
                f"update actions set {sets} where id = ? and status = 'awaiting_confirmation'",
                [*changes.values(), action_id])  # fmt: skip
            return bool(cur.rowcount == 1)

    # -- request keys -------------------------------------------------------------------
    def claim_request_key(
        self, scope: str, key: str, body_sha256: str, request_id: str, now: str, *,
        run_id: int | None = None, conversation_id: str | None = None,
        message: str | None = None,
    ) -> tuple[bool, dict[str, Any]]:  # fmt: skip
        """Take ``key`` in ``scope`` (the caller and the conversation) for the request
        ``request_id`` unless it is taken; ``(taken by this call, the key's row)``.
        ``run_id``, ``conversation_id`` and ``message`` are kept with it: should the run's
        process die before the turn is logged, the next open of the log logs the turn
        ``lost`` (:func:`chainrun.log.lifecycle.log_lost_turns`)."""
        with self.log.transaction():
            cur = self.log.execute(
                "insert into request_keys (scope, key, body_sha256, request_id, created_at, "
                "run_id, conversation_id, input) values (?, ?, ?, ?, ?, ?, ?, ?) "
                "on conflict (scope, key) do nothing",
                [scope, key, body_sha256, request_id, now, run_id, conversation_id, message],
            )
            mine = cur.rowcount == 1
        rows = self.log.query("select * from request_keys where scope = ? and key = ?",
                              [scope, key])  # fmt: skip
        return mine, rows[0]

    def release_request_key(self, scope: str, key: str, request_id: str) -> None:
        """Give ``key`` up (its request ran no turn, or a turn that gave no result): the
        next request with it runs."""
        with self.log.transaction():
            self.log.execute(
                "delete from request_keys where scope = ? and key = ? and request_id = ?",
                [scope, key, request_id],
            )

    def request_key_holder(self, scope: str, key: str) -> str | None:
        """The request id holding ``key`` in ``scope`` (None: nobody: released)."""
        got = self.log.scalar("select request_id from request_keys where scope = ? and key = ?",
                              [scope, key])  # fmt: skip
        return None if got is None else str(got)

    def log_nonce(self) -> str:
        """The random id this log was created with (``log_meta``): unique to the log, kept
        for its life, so that the keys made from turn ids (which start at 1 in every log)
        do not repeat across logs."""
        return str(self.log.scalar("select value from log_meta where key = 'nonce'"))

    def turn_of_request(self, request_id: str) -> int | None:
        """The turn logged with ``request_id`` (any run), or None (not logged yet)."""
        got = self.log.scalar("select max(id) from turns where request_id = ?", [request_id])
        return None if got is None else int(got)

    # -- conversation owners ------------------------------------------------------------
    def bind_conversation(self, conversation_id: str, user_id: str, now: str) -> str:
        """Bind ``conversation_id`` to ``user_id`` unless it is bound; its owner's id.

        A conversation that already has turns and no owner (started without an identity)
        is bound to the first identity that continues it."""
        with self.log.transaction():
            self.log.execute(
                "insert into conversation_owners (conversation_id, user_id, bound_at) "
                "values (?, ?, ?) on conflict (conversation_id) do nothing",
                [conversation_id, user_id, now],
            )
        owner = self.log.scalar(
            "select user_id from conversation_owners where conversation_id = ?", [conversation_id]
        )
        return str(owner)

    def conversation_owner(self, conversation_id: str) -> str | None:
        """The user id a conversation is bound to (None: none)."""
        got = self.log.scalar(
            "select user_id from conversation_owners where conversation_id = ?", [conversation_id]
        )
        return None if got is None else str(got)
