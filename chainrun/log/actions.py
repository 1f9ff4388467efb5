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
from chainrun.log.rows import RunKind, ToolCallRow

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
    def pending_actions(
        self, conversation_id: str, kinds: Sequence[RunKind] = ("live",)
    ) -> list[ToolCallRow]:
        """The ``awaiting_confirmation`` rows of a conversation's turns in runs of
        ``kinds``, oldest first."""
        marks = ",".join("?" for _ in kinds)
        rows = self.log.query(
            "select t.* from tool_calls t join turns u on u.id = t.turn_id "
            "where u.conversation_id = ? and t.status = 'awaiting_confirmation' and "
            f"u.run_id in (select id from runs where kind in ({marks})) order by t.id",
            [conversation_id, *kinds],
        )
        return [ToolCallRow.from_db(r) for r in rows]

    def action_row(self, action_id: str, conversation_id: str) -> ToolCallRow | None:
        """The row of the call that became pending action ``action_id`` (its idempotency
        key) in conversation ``conversation_id``, or None (another conversation's action
        is not this conversation's to see)."""
        rows = self.log.query(
            "select tc.* from tool_calls tc join turns t on t.id = tc.turn_id "
            "where tc.idempotency_key = ? and tc.question is not null "
            "and t.conversation_id = ? order by tc.id limit 1", [action_id, conversation_id]
        )  # fmt: skip
        return ToolCallRow.from_db(rows[0]) if rows else None

    def decide_action(
        self, row_id: int, status: str, *, decided_by: str, decided_at: str,
        decided_turn_id: int | None,
    ) -> bool:  # fmt: skip
        """Decide the pending action in ``tool_calls`` row ``row_id`` (``confirmed``,
        ``denied`` or ``expired``) unless it was decided already; True: this call decided
        it (of two processes deciding one action at once, exactly one gets True)."""
        with self.log.transaction():
            cur = self.log.execute(
                "update tool_calls set status = ?, decided_by = ?, decided_at = ?, "
                "decided_turn_id = ? where id = ? and status = 'awaiting_confirmation'",
                [status, decided_by, decided_at, decided_turn_id, row_id],
            )
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
