"""A turn that answers a pending action: what it decides before its steps start.

:class:`Confirmations` reads the conversation's pending actions from the run log (so the
turn that decides may be served by another process, or after a restart), expires those
past their turns or minutes, reads the shopper's reply (:func:`chainrun.tools.confirm.read_reply`,
or an explicit ``confirm=ID`` / ``deny=ID``) and says what the turn does
(:class:`Decided`):

- a **yes**: each action is first checked again against the tool as it is now (gone, its
  arguments no longer valid or its product gone from the catalogue: ``expired`` by
  ``changed``, nothing runs, chainrun says why; the tool's config changed: asked again
  with the question as it reads now), then claimed (``confirmed``, with the deciding
  turn, in one conditional update: of any number of turns deciding one action at once,
  on any number of processes, one wins) and handed to the turn's tools as one value
  (:class:`~chainrun.tools.runner.Confirmed`, :attr:`Decided.confirmed`); the tool is
  marked started right before it starts (once the turn is clear to act) and its outcome
  recorded when it ends; the turn runs as any turn, the model answering from the results.
  A turn that ends without starting a claimed action gives it back (pending again);
- a yes to an action **another turn took** (a client sending its yes again, a retry
  after a crash), by id or as a reply whose thread shows its question: chainrun says
  what happened to it (done; failed or timed out; being carried out now) and runs
  nothing. A claim whose run cannot still be going (its tool started longer ago than its
  ``timeout_s`` and :data:`START_GRACE_S`, or it never started within
  :data:`CLAIM_LEASE_S`) and that has no outcome is the run of a process that died: the
  action is pending again under the same id (the same tool key, so the shop's system can
  tell a retry) and chainrun says it may not have been done and asks again; so does a run
  that failed or timed out;
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from chainrun.answer_json import schema_errors
from chainrun.errors import UserInputError
from chainrun.identity import Identity
from chainrun.log.rows import RunKind
from chainrun.log.store import Store
from chainrun.tools.confirm import (
    PendingAction,
    config_digest,
    expires_at,
    outside_properties,
    question_text,
    read_reply,
    reply_texts,
    utc_iso,
)
from chainrun.tools.runner import Confirmed, KnownProducts, TurnTools, product_ids
from chainrun.tools.tool import Tool

__all__ = ["CLAIM_LEASE_S", "START_GRACE_S", "Confirmations", "Decided", "action_from_row"]

log = logging.getLogger("chainrun.tools")
#: s a turn waits for this process's own queued log writes before it reads the
#: conversation's pending actions
FLUSH_TIMEOUT_S = 2.0
#: s a confirmed action's claim may wait for its tool to start (its turn waits for the
#: checks that can still refuse it); past it, unstarted, its turn is taken to be gone
CLAIM_LEASE_S = 120.0
#: s past a started run's ``timeout_s`` after which a run with no outcome is taken to
#: have died with its process (a live run records its outcome by ``timeout_s``)
START_GRACE_S = 2.0

#: chainrun's answer to a yes or no it cannot act on: the log that holds the
#: conversation's pending actions did not answer (nothing is run or decided)
UNREADABLE_ANSWER = (
    "I could not reach the shop's records to act on that just now, so nothing was done. "
    "Please try again in a moment."
)


def action_from_row(row: Mapping[str, Any]) -> PendingAction:
    """The pending action an ``actions`` row holds."""
    try:
        arguments = json.loads(row.get("arguments") or "{}")
    except ValueError:
        arguments = {}
    return PendingAction(
        id=row["id"], tool=row["tool"], arguments=arguments, question=row.get("question") or "",
        step=row["step"], conversation_id=row.get("conversation_id"),
        turn_id=row.get("turn_id"), turn_index=row.get("turn_index"),
        asked_at=row.get("asked_at") or "", expires_at=row.get("expires_at") or "",
        expires_after_turn=row.get("expires_after_turn"), logged=True,
        config_sha256=row.get("config_sha256") or "", extra={"run_id": row.get("run_id")},
    )  # fmt: skip


def action_row(action: PendingAction, run_id: int | None) -> dict[str, Any]:
    """The ``actions`` row of a pending action as it is asked."""
    return {
        "id": action.id, "run_id": run_id, "turn_id": action.turn_id,
        "conversation_id": action.conversation_id, "turn_index": action.turn_index,
        "step": action.step, "tool": action.tool,
        "arguments": json.dumps(action.arguments, ensure_ascii=False),
        "question": action.question, "config_sha256": action.config_sha256,
        "asked_at": action.asked_at, "expires_at": action.expires_at,
        "expires_after_turn": action.expires_after_turn, "status": "awaiting_confirmation",
    }  # fmt: skip


def _seconds_since(iso: str | None, now: str) -> float:
    if not iso:
        return float("inf")
    return (datetime.fromisoformat(now) - datetime.fromisoformat(iso)).total_seconds()


def _clock(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%H:%M:%S UTC")


@dataclass
class Decided:
    """What a turn does about its conversation's pending actions.

    Attributes:
        run: actions the shopper said yes to, claimed by this turn: carried out by their
            step in this turn.
        confirmed: ``run`` with its start and finish hooks, as the turn's tools take it.
        answer: chainrun's own answer (no step runs); None: the turn runs as usual.
        why: the reason the steps are skipped (``detail.skipped``) with ``answer``.
        decisions: ``[{id, tool, decision, reply}]`` for the turn's record.
        asked: actions asked again (still pending), shown to the shopper again.
        claims: ``{action id: decided_at}`` of the claims in ``run`` (given back when
            the turn ends without starting them).
    """

    run: list[PendingAction] = field(default_factory=list)
    confirmed: Confirmed = field(default_factory=Confirmed)
    answer: str | None = None
    why: str = ""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    asked: list[PendingAction] = field(default_factory=list)
    claims: dict[str, str] = field(default_factory=dict)

    def say(self, text: str, why: str) -> None:
        """Add ``text`` to chainrun's own answer."""
        self.answer = text if self.answer is None else f"{self.answer} {text}"
        self.why = self.why or why


class Confirmations:
    """The pending actions of one chain's conversations, in its log.

    Args:
        store: the run log.
        tools: the chain's tools (those with ``confirm`` make this needed).
        kinds: the run kinds whose turns' actions count (a live chain: ``live``); a chain
            of another kind (a replay, an eval) sees only its own run's actions, its
            conversations being copies of live ones.
        known_products: which product ids the chain's catalogue holds (an action's
            products are looked up again when it is confirmed); None: not checked.
    """

    def __init__(self, store: Store, tools: Mapping[str, Tool],
                 kinds: tuple[RunKind, ...] = ("live",),
                 known_products: KnownProducts | None = None) -> None:  # fmt: skip
        self.store = store
        self.tools = tools
        self.kinds = kinds
        self.known_products = known_products
        #: conversations in which this process asked (its own writes are flushed first)
        self.asked_in: set[str] = set()
        #: ids of the confirmed actions whose tool runs in this process now
        self.running: set[str] = set()

    def _run(self, run_id: int | None) -> int | None:
        """The run whose actions alone count (None: every run of :attr:`kinds`)."""
        return None if "live" in self.kinds else run_id

    async def _pending(self, conversation_id: str,
                       run_id: int | None) -> tuple[list[PendingAction], list[dict[str, Any]]]:
        """The conversation's pending actions, and the rows of its newest confirmed ones
        (at most 5), in one read of the log."""
        store = self.store
        if conversation_id in self.asked_in:
            try:
                await asyncio.wait_for(store.flush(), FLUSH_TIMEOUT_S)
            except TimeoutError:
                log.warning("conversation %s: the log's writes did not commit within %g s; "
                            "its pending actions are read without them", conversation_id,
                            FLUSH_TIMEOUT_S)  # fmt: skip
        rows = await store.off_loop(store.open_actions, conversation_id, self.kinds,
                                    self._run(run_id))  # fmt: skip
        pending = [action_from_row(r) for r in rows if r["status"] == "awaiting_confirmation"]
        return pending, [r for r in rows if r["status"] == "confirmed"][-5:]

    # -- asking ------------------------------------------------------------------------
    def asker(self, run_id: int | None) -> Callable[[PendingAction], Awaitable[None]]:
        """The ``ask`` of a turn's tools: record a pending action in the log (its own
        transaction) before its question goes anywhere.

        Raises (from the hook):
            the log's unreachable errors: nothing was recorded (the call is refused).
        """

        async def ask(action: PendingAction) -> None:
            await self.store.off_loop(self.store.record_action, action_row(action, run_id))
            if action.conversation_id is not None:
                self.asked_in.add(action.conversation_id)

        return ask

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
                row = await self.store.off_loop(self.store.action_row, action_id,
                                                conversation_id)  # fmt: skip
            except self.store.unreachable_errors:
                return
            if row is not None:
                return
        where = (f"conversation {conversation_id!r}" if conversation_id is not None
                 else "a new conversation (no conversation_id given)")  # fmt: skip
        raise UserInputError(f"confirm: no action {action_id!r} waits in {where}")

    # -- deciding ----------------------------------------------------------------------
    async def decide(
        self, conversation_id: str, turn_index: int, message: str, *,
        turn_id: int | None, user: Identity | None,
        confirm: str | None = None, deny: str | None = None, shown: str | None = None,
        last: str | None = None, received_at: str | None = None, run_id: int | None = None,
    ) -> Decided:  # fmt: skip
        """What the turn with ``message`` does (see the module text). A yes with nothing
        pending refers to an action another turn took (a retried yes, a yes after a
        crash) when ``last``, the conversation's last answer as the chain recorded it,
        is its question, or its run had not ended when the message arrived
        (``received_at``, ISO-8601 UTC). ``shown``: the
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
                                         deny=deny, shown=shown, last=last,
                                         received_at=received_at, run_id=run_id)  # fmt: skip
            decided.confirmed = Confirmed(tuple(decided.run), self.starter(turn_id),
                                          self.finisher())  # fmt: skip
            return decided
        except self.store.unreachable_errors as e:
            log.warning("conversation %s: its pending actions could not be read (%s: %s); "
                        "nothing was decided", conversation_id, type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")  # fmt: skip
            if confirm or deny or await read_reply(message) in ("yes", "no"):
                return Decided(answer=UNREADABLE_ANSWER, why="pending actions unreadable")
            return Decided()

    async def _expired(self, a: PendingAction, now: str, turn_index: int) -> bool:
        """Whether ``a`` expired for the turn with ``turn_index``: by time, or by the later
        turns of its conversation the shopper was answered (turns running beside this
        one, a retried yes among them, do not count)."""
        if a.expired(now, None):
            return True
        if not a.expired(now, turn_index) or a.turn_index is None:
            return False
        run_id = a.extra.get("run_id") if "live" not in self.kinds else None
        answered = await self.store.off_loop(self.store.answered_turns, a.conversation_id or "",
                                             a.turn_index, turn_index, self.kinds,
                                             run_id)  # fmt: skip
        return a.expired(now, a.turn_index + 1 + answered)

    async def _decide(
        self, conversation_id: str, turn_index: int, message: str, *,
        turn_id: int | None, user: Identity | None,
        confirm: str | None = None, deny: str | None = None, shown: str | None = None,
        last: str | None = None, received_at: str | None = None, run_id: int | None = None,
    ) -> Decided:  # fmt: skip
        store = self.store
        now = utc_iso()
        by = user.user_id if user is not None else "shopper"
        actions, confirmed = await self._pending(conversation_id, run_id)
        explicit = confirm or deny
        if explicit is not None:
            chosen = [a for a in actions if a.id == explicit]
            if not chosen:
                return await self._not_pending(explicit, conversation_id, turn_index,
                                               deny is not None)  # fmt: skip
            actions = chosen
        elif shown is not None:  # the caller's thread: only what it asked is answered
            actions = [a for a in actions if a.question and a.question in shown]
        decided = Decided()
        if not actions:
            return await self._repeated(confirmed, turn_index, message, shown, last,
                                        received_at)  # fmt: skip
        live: list[PendingAction] = []
        expired: list[PendingAction] = []
        for a in actions:
            (expired if await self._expired(a, now, turn_index) else live).append(a)
        for a in expired:
            await store.off_loop(store.decide_action, a.id, "expired", decided_by="expiry",
                                 decided_at=now, decided_turn_id=turn_id)  # fmt: skip
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
                await self._confirm(live, decided, now, turn_index, turn_id, by)
            else:
                decided.answer, decided.why = texts["expired"], "pending action expired"
        elif reply == "no" or reply == "new_request":
            decider = by if reply == "no" else "new_request"
            for a in live:
                await store.off_loop(store.decide_action, a.id, "denied", decided_by=decider,
                                     decided_at=now, decided_turn_id=turn_id)  # fmt: skip
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

    async def _confirm(self, live: Sequence[PendingAction], decided: Decided, now: str,
                       turn_index: int, turn_id: int | None, by: str) -> None:  # fmt: skip
        """A yes to ``live``: each checked again, then claimed by this turn (or, taken by
        another turn first, said what happened to it)."""
        store = self.store
        for a in live:
            gone, changed = await self._recheck(a)
            if gone is not None:
                await store.off_loop(store.decide_action, a.id, "expired", decided_by="changed",
                                     decided_at=now, decided_turn_id=turn_id)  # fmt: skip
                decided.decisions.append({"id": a.id, "tool": a.tool, "decision": "expired",
                                          "reply": "yes", "why": gone})  # fmt: skip
                decided.say(f"I can no longer do that, so nothing was done: {a.question} "
                            f"({gone})", "pending action no longer possible")  # fmt: skip
                continue
            if changed is not None:
                again = await self._ask_again(a, changed, now, turn_index)
                if again is not None:
                    decided.asked.append(again)
                    decided.decisions.append({"id": a.id, "tool": a.tool, "reply": "yes",
                                              "decision": "asked_again", "why": "changed"})
                    decided.say("Something changed since I asked, so please confirm again: "
                                f"{again.question}", "pending action changed")  # fmt: skip
                    continue
            won = await store.off_loop(store.decide_action, a.id, "confirmed", decided_by=by,
                                       decided_at=now, decided_turn_id=turn_id)  # fmt: skip
            if won:
                decided.run.append(a)
                decided.claims[a.id] = now
                decided.decisions.append({"id": a.id, "tool": a.tool, "decision": "confirmed",
                                          "reply": "yes"})  # fmt: skip
                continue
            row = await store.off_loop(store.action_row, a.id, a.conversation_id or "")
            if row is not None:
                await self._tell(row, decided, turn_index)
        if decided.answer is not None and decided.run:
            # the turn runs its claimed actions; what else was said is in its record
            decided.answer = None

    async def _recheck(self, a: PendingAction) -> tuple[str | None, str | None]:
        """``(gone, changed)``: why ``a`` can no longer run as asked (the tool gone, its
        arguments no longer valid, a product gone from the catalogue), or the tool's
        config digest now when its config changed since it was asked (asked again)."""
        tool = self.tools.get(a.tool)
        if tool is None:
            return f"the tool {a.tool!r} is no longer available", None
        errors = schema_errors(a.arguments, tool.config.parameters, limit=2)
        extra = outside_properties(a.arguments, tool.config) if tool.config.confirm else []
        if errors or extra:
            why = "; ".join(errors) or f"{', '.join(extra)} no longer taken"
            return f"its details no longer fit the tool: {why}", None
        ids = product_ids(a.arguments, tool)
        if ids and self.known_products is not None:
            known = set(await self.known_products(ids))
            missing = [i for i in ids if i not in known]
            if missing:
                return f"{', '.join(missing)} is no longer in the catalogue", None
        digest = config_digest(tool.config)
        if a.config_sha256 and a.config_sha256 != digest:
            return None, digest
        return None, None

    async def _ask_again(self, a: PendingAction, digest: str, now: str,
                         turn_index: int) -> PendingAction | None:  # fmt: skip
        """``a`` asked again with its tool's config as it is now (a new question and
        expiry); None: decided by another turn meanwhile."""
        tool = self.tools[a.tool]
        again = replace(a, question=question_text(a.tool, tool.config, a.arguments),
                        config_sha256=digest, asked_at=now,
                        expires_at=expires_at(now, tool.config),
                        expires_after_turn=turn_index + tool.config.confirm_turns)  # fmt: skip
        ok = await self.store.off_loop(self.store.reask_action, a.id, {
            "question": again.question, "config_sha256": digest, "asked_at": now,
            "expires_at": again.expires_at, "expires_after_turn": again.expires_after_turn})
        return again if ok else None

    async def _repeated(self, rows: Sequence[Mapping[str, Any]], turn_index: int,
                        message: str, shown: str | None, last: str | None,
                        received_at: str | None) -> Decided:  # fmt: skip
        """A message when nothing is pending: a yes to an action another turn took
        (``rows``: the conversation's newest confirmed ones), that the shopper was
        answering (the caller's thread, ``shown``, ends with its question; else the
        chain's, ``last``, does, or its run had not ended when the message arrived) is
        told what happened to it; anything else goes on as a turn."""
        candidates = []
        for row in rows:
            a = action_from_row(row)
            if shown is not None:
                if a.question not in shown:
                    continue
            elif not ((last is not None and a.question in last) or row.get("finished_at") is None
                      or (received_at is not None and row["finished_at"] >= received_at)):
                continue
            candidates.append((row, a))
        if not candidates:
            return Decided()
        if await read_reply(message, [a for _, a in candidates]) != "yes":
            return Decided()
        decided = Decided()
        for row, _ in candidates:
            await self._tell(row, decided, turn_index)
        return decided

    async def _not_pending(self, action_id: str, conversation_id: str, turn_index: int,
                           deny: bool) -> Decided:  # fmt: skip
        row = await self.store.off_loop(self.store.action_row, action_id, conversation_id)
        if row is None:
            raise UserInputError(f"confirm: no action {action_id!r} waits in conversation "
                                 f"{conversation_id!r}")  # fmt: skip
        decided = Decided()
        await self._tell(row, decided, turn_index, deny=deny)
        return decided

    async def _tell(self, row: Mapping[str, Any], decided: Decided, turn_index: int, *,
                    deny: bool = False) -> None:  # fmt: skip
        """Say what happened to an action another turn decided (``row``: its ``actions``
        row); a run that failed, timed out or died with its process is given back to the
        shopper (pending again, asked again under the same id and tool key)."""
        a = action_from_row(row)
        status, outcome, now = row["status"], row.get("outcome"), utc_iso()
        decision = {"id": a.id, "tool": a.tool, "decision": "already_" + status}
        decided.decisions.append(decision)
        if status != "confirmed":
            decided.say(f"That was already decided ({status}), so nothing more was done: "
                        f"{a.question}", f"pending action already {status}")  # fmt: skip
            return
        if outcome in ("ok", "stubbed", "recorded"):  # done (a replay's run: as if done)
            decided.say(f"That was already done (confirmed at {_clock(row['decided_at'])}), "
                        f"so nothing more was done: {a.question}", "pending action already done")
            return
        tool = self.tools.get(a.tool)
        timeout_s = tool.timeout_s if tool is not None else 0.0
        started = row.get("started_at")
        in_flight = a.id in self.running or (
            _seconds_since(started, now) < timeout_s + START_GRACE_S if started
            else outcome is None and _seconds_since(row["decided_at"], now) < CLAIM_LEASE_S)
        if outcome is None and in_flight:
            decision["state"] = "running"
            decided.say("Your earlier yes to this is being carried out now, so nothing more "
                        f"was done: {a.question}", "pending action being carried out")
            return
        # failed, timed out, or its run died with its process: the shopper decides again
        why = ("it failed" if outcome == "error" else
               "it did not finish in time, so whether it was done is unknown"
               if outcome == "timeout" else
               "I was interrupted before it finished, so I cannot say it was done"
               if started else "it was never started" if outcome is None
               else f"it was not done ({outcome})")  # fmt: skip
        changes: dict[str, Any] = {"asked_at": now}
        if tool is not None:
            changes["expires_at"] = expires_at(now, tool.config)
            changes["expires_after_turn"] = turn_index + tool.config.confirm_turns
        reopened = await self.store.off_loop(self.store.reopen_action, a.id, row["decided_at"],
                                             changes)  # fmt: skip
        decision["state"] = outcome or ("interrupted" if started else "not_started")
        if not reopened:  # another turn reopened or took it meanwhile
            decided.say(f"Another message of yours is deciding this now: {a.question}",
                        "pending action being decided")  # fmt: skip
            return
        if deny:
            decided.say(f"Okay: I tried this earlier but {why}; I will not try again: "
                        f"{a.question}", "pending action denied")  # fmt: skip
            await self.store.off_loop(self.store.decide_action, a.id, "denied",
                                      decided_by="shopper", decided_at=now,
                                      decided_turn_id=None)  # fmt: skip
            return
        decision["decision"] = "asked_again"
        decided.asked.append(replace(a, asked_at=now, **{k: v for k, v in changes.items()
                                                        if k != "asked_at"}))
        decided.say(f"I tried this earlier but {why}. Should I try again? (It will not be "
                    f"done twice.) {a.question}", "pending action asked again")  # fmt: skip

    # -- running ------------------------------------------------------------------------
    def starter(self, turn_id: int | None) -> Callable[[PendingAction], Awaitable[bool]]:
        """The ``claim`` of the turn's tools: mark a confirmed action started right before
        its tool starts; False: the turn no longer holds it (nothing runs)."""

        async def start(action: PendingAction) -> bool:
            if not action.logged:
                return True
            won = await self.store.off_loop(self.store.start_action, action.id, turn_id,
                                            utc_iso())  # fmt: skip
            if won:
                self.running.add(action.id)
            return bool(won)

        return start

    def finisher(self) -> Callable[[PendingAction, str], Awaitable[None]]:
        """The ``finish`` of the turn's tools: record a confirmed action's outcome (its
        tool status) once its run ended."""

        async def finish(action: PendingAction, outcome: str) -> None:
            try:
                if action.logged:
                    await self.store.off_loop(self.store.finish_action, action.id, outcome,
                                              utc_iso())  # fmt: skip
            finally:
                self.running.discard(action.id)

        return finish

    async def settle(self, decided: Decided, status: str, tools: TurnTools | None) -> None:
        """The turn ended with ``status``: the actions it claimed but never started go
        back to the shopper (pending again); the actions it asked about are withdrawn
        (``expired`` by ``turn_failed``) when the turn's answer was not the question
        (refused, failed, cancelled before it). Log errors are warned about, not raised."""
        try:
            ended = {r.action_id for r in (tools.records if tools is not None else [])
                     if r.action_id is not None and r.status != "not_started"}
            for a in decided.run:
                if a.id not in ended and a.id in decided.claims:
                    await self.store.off_loop(self.store.reopen_action, a.id,
                                              decided.claims[a.id], {})  # fmt: skip
            if tools is not None and status not in ("ok", "cut"):
                for a in tools.pending:
                    if a.logged:
                        await self.store.off_loop(
                            self.store.decide_action, a.id, "expired", decided_by="turn_failed",
                            decided_at=utc_iso(), decided_turn_id=a.turn_id)  # fmt: skip
        except self.store.unreachable_errors as e:
            log.warning("the turn's actions could not be settled in the log (%s: %s)",
                        type(e).__name__, e)  # fmt: skip
