"""A turn that answers a pending action: what it decides before its steps start.

:class:`Confirmations` reads the conversation's pending actions from the run log (so the
turn that decides may be served by another process, or after a restart), expires those
past their turns or minutes, reads the shopper's reply (:func:`chainrun.tools.confirm.read_reply`,
or an explicit ``confirm=ID`` / ``deny=ID``) and says what the turn does
(:class:`Decided`):

- a **yes**: the actions are handed to the turn's tools as one value
  (:class:`~chainrun.tools.runner.Confirmed`, :attr:`Decided.confirmed`) and claimed, each
  in one conditional update, right before they start (once the turn is clear to act);
  the turn runs as any turn, the model answering from their results;
- a **no**: each is ``denied`` now; chainrun answers that nothing was done (no step runs);
- **unclear**: chainrun asks the question again (no step runs; the actions stay pending);
- a **new request** that conflicts with them: each is ``denied`` (by ``new_request``) and
  the turn runs as usual; one beside them (``side_request``): they stay pending (``kept``,
  shown again) and the turn runs as usual;
- a yes to an **expired** action: chainrun says it expired; nothing runs.

The rules and wording are in :mod:`chainrun.tools.confirm` and docs/guides/tools.md. The
front desk (:mod:`chainrun.desk`) asks :meth:`Confirmations.decide` once per turn, before
the turn starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chainrun.errors import UserInputError
from chainrun.identity import Identity
from chainrun.log.rows import RunKind, ToolCallRow
from chainrun.log.store import Store
from chainrun.tools.confirm import PendingAction, read_reply, reply_texts, utc_iso
from chainrun.tools.runner import Confirmed
from chainrun.tools.tool import Tool

__all__ = ["Confirmations", "Decided", "action_from_row"]

log = logging.getLogger("chainrun.tools")
#: s a turn waits for this process's own queued log writes before it reads the
#: conversation's pending actions
FLUSH_TIMEOUT_S = 2.0

#: chainrun's answer to a yes or no it cannot act on: the log that holds the
#: conversation's pending actions did not answer (nothing is run or decided)
UNREADABLE_ANSWER = (
    "I could not reach the shop's records to act on that just now, so nothing was done. "
    "Please try again in a moment."
)


def action_from_row(row: ToolCallRow, conversation_id: str | None) -> PendingAction:
    """The pending action a logged ``awaiting_confirmation`` row holds."""
    try:
        arguments = json.loads(row.arguments or "{}")
    except ValueError:
        arguments = {}
    return PendingAction(
        id=row.idempotency_key or "", tool=row.tool, arguments=arguments,
        question=row.question or "", step=row.step, conversation_id=conversation_id,
        turn_id=row.turn_id, turn_index=None, asked_at="", expires_at=row.expires_at or "",
        expires_after_turn=row.expires_after_turn, row_id=row.id,
    )  # fmt: skip


@dataclass
class Decided:
    """What a turn does about its conversation's pending actions.

    Attributes:
        run: actions the shopper said yes to: carried out by their step in this turn.
        confirmed: ``run`` with its claim, as the turn's tools take it.
        answer: chainrun's own answer (no step runs); None: the turn runs as usual.
        why: the reason the steps are skipped (``detail.skipped``) with ``answer``.
        decisions: ``[{id, tool, decision, reply}]`` for the turn's record.
        asked: actions asked again (still pending), shown to the shopper again.
    """

    run: list[PendingAction] = field(default_factory=list)
    confirmed: Confirmed = field(default_factory=Confirmed)
    answer: str | None = None
    why: str = ""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    asked: list[PendingAction] = field(default_factory=list)


class Confirmations:
    """The pending actions of one chain's conversations, in its log.

    Args:
        store: the run log.
        tools: the chain's tools (those with ``confirm`` make this needed).
        kinds: the run kinds whose turns' actions count (a live chain: ``live``).
    """

    def __init__(self, store: Store, tools: Mapping[str, Tool],
                 kinds: tuple[RunKind, ...] = ("live",)) -> None:  # fmt: skip
        self.store = store
        self.tools = tools
        self.kinds = kinds
        #: conversations in which this process asked (its own writes are flushed first)
        self.asked_in: set[str] = set()

    async def _pending(self, conversation_id: str) -> list[PendingAction]:
        store = self.store
        if conversation_id in self.asked_in:
            try:
                await asyncio.wait_for(store.flush(), FLUSH_TIMEOUT_S)
            except TimeoutError:
                log.warning("conversation %s: the log's writes did not commit within %g s; "
                            "its pending actions are read without them", conversation_id,
                            FLUSH_TIMEOUT_S)  # fmt: skip
        rows = await store.off_loop(store.pending_actions, conversation_id, self.kinds)
        return [action_from_row(r, conversation_id) for r in rows]

    async def check_known(self, conversation_id: str | None, action_id: str) -> None:
        """Refuse a ``confirm`` / ``deny`` of ``action_id`` before its turn claims anything
        (a turn index, a log row) when the action is not one of the conversation's (pending,
        or decided already: :meth:`decide` then says so).

        A log that does not answer refuses nothing here: :meth:`decide` then answers
        :data:`UNREADABLE_ANSWER`.

        Raises:
            UserInputError: no such action in conversation ``conversation_id`` (None: a new
                conversation, which has none).
        """
        if conversation_id is not None:
            try:
                if any(a.id == action_id for a in await self._pending(conversation_id)):
                    return
                row = await self.store.off_loop(self.store.action_row, action_id,
                                                conversation_id)  # fmt: skip
            except self.store.unreachable_errors:
                return
            if row is not None and row.question is not None:
                return
        where = (f"conversation {conversation_id!r}" if conversation_id is not None
                 else "a new conversation (no conversation_id given)")  # fmt: skip
        raise UserInputError(f"confirm: no action {action_id!r} waits in {where}")

    async def decide(
        self, conversation_id: str, turn_index: int, message: str, *,
        turn_id: int | None, user: Identity | None,
        confirm: str | None = None, deny: str | None = None, shown: str | None = None,
    ) -> Decided:  # fmt: skip
        """What the turn with ``message`` does (see the module text). ``shown``: the
        answer before this message in the caller's own thread (a client that keeps the
        conversation, as OpenAI clients do; None: the chain's record): a reply decides
        only the actions whose question it shows, so a "yes" in one chat never decides
        an action asked in another that shares its conversation id. A log that does not
        answer (down past its outage wait, or its pool unable to connect): a ``confirm``,
        ``deny`` or a message read as yes or no is answered :data:`UNREADABLE_ANSWER`
        (nothing run, nothing decided: the actions stay pending); any other message goes
        on as a turn without pending actions. Said in one warning line.

        Raises:
            UserInputError: ``confirm`` / ``deny`` names no action of this conversation.
        """
        try:
            decided = await self._decide(conversation_id, turn_index, message,
                                         turn_id=turn_id, user=user, confirm=confirm,
                                         deny=deny, shown=shown)  # fmt: skip
            decided.confirmed = Confirmed(tuple(decided.run), self.claimer(turn_id, user))
            return decided
        except self.store.unreachable_errors as e:
            log.warning("conversation %s: its pending actions could not be read (%s: %s); "
                        "nothing was decided", conversation_id, type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")  # fmt: skip
            if confirm or deny or await read_reply(message) in ("yes", "no"):
                return Decided(answer=UNREADABLE_ANSWER, why="pending actions unreadable")
            return Decided()

    async def _decide(
        self, conversation_id: str, turn_index: int, message: str, *,
        turn_id: int | None, user: Identity | None,
        confirm: str | None = None, deny: str | None = None, shown: str | None = None,
    ) -> Decided:  # fmt: skip
        store = self.store
        now = utc_iso()
        by = user.user_id if user is not None else "shopper"
        actions = await self._pending(conversation_id)
        explicit = confirm or deny
        if explicit is not None:
            chosen = [a for a in actions if a.id == explicit]
            if not chosen:
                return await self._not_pending(explicit, conversation_id)
            actions = chosen
        elif shown is not None:  # the caller's thread: only what it asked is answered
            actions = [a for a in actions if a.question and a.question in shown]
        decided = Decided()
        if not actions:
            return decided
        live: list[PendingAction] = []
        expired: list[PendingAction] = []
        for a in actions:
            (expired if a.expired(now, turn_index) else live).append(a)
        for a in expired:
            if a.row_id is not None:
                await store.off_loop(store.decide_action, a.row_id, "expired",
                                     decided_by="expiry", decided_at=now,
                                     decided_turn_id=turn_id)  # fmt: skip
            decided.decisions.append({"id": a.id, "tool": a.tool, "decision": "expired"})
        reply = "yes" if confirm else "no" if deny else await read_reply(message, live)
        texts = reply_texts(live or expired)
        for d in decided.decisions:
            d["reply"] = reply
        if reply == "side_request":  # a request beside the actions: they stay pending
            decided.asked = live
            decided.decisions += [{"id": a.id, "tool": a.tool, "decision": "kept",
                                   "reply": reply} for a in live]  # fmt: skip
            return decided
        if reply == "yes":
            if live:
                decided.run = live
                decided.decisions += [{"id": a.id, "tool": a.tool, "decision": "confirmed",
                                       "reply": reply} for a in live]  # fmt: skip
            else:
                decided.answer, decided.why = texts["expired"], "pending action expired"
        elif reply == "no" or reply == "new_request":
            decider = by if reply == "no" else "new_request"
            for a in live:
                if a.row_id is not None:
                    await store.off_loop(store.decide_action, a.row_id, "denied",
                                         decided_by=decider, decided_at=now,
                                         decided_turn_id=turn_id)  # fmt: skip
                decided.decisions.append({"id": a.id, "tool": a.tool, "decision": "denied",
                                          "reply": reply})  # fmt: skip
            if reply == "no" and (live or expired):
                decided.answer, decided.why = texts["denied"], "pending action denied"
        elif live:  # unclear: asked again
            decided.answer, decided.why = texts["again"], "pending action asked again"
            decided.asked = live
            decided.decisions += [{"id": a.id, "tool": a.tool, "decision": "asked_again",
                                   "reply": reply} for a in live]  # fmt: skip
        return decided

    async def _not_pending(self, action_id: str, conversation_id: str) -> Decided:
        row = await self.store.off_loop(self.store.action_row, action_id, conversation_id)
        if row is None or row.question is None:
            raise UserInputError(f"confirm: no action {action_id!r} waits in conversation "
                                 f"{conversation_id!r}")  # fmt: skip
        decided = Decided(decisions=[{"id": action_id, "tool": row.tool,
                                      "decision": "already_" + row.status}])  # fmt: skip
        decided.answer = (f"That was already decided ({row.status}), so nothing more was "
                          f"done: {row.question}")
        decided.why = f"pending action already {row.status}"
        return decided

    def claimer(self, turn_id: int | None, user: Identity | None) -> Any:
        """The ``claim`` of the turn's tools: decide an action ``confirmed`` right before
        it starts; False when another turn decided it first."""
        by = user.user_id if user is not None else "shopper"

        async def claim(action: PendingAction) -> bool:
            if action.row_id is None:
                return True
            won = await self.store.off_loop(
                self.store.decide_action, action.row_id, "confirmed", decided_by=by,
                decided_at=utc_iso(), decided_turn_id=turn_id,
            )  # fmt: skip
            return bool(won)

        return claim
