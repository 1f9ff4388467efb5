"""Actions that wait for the shopper's yes: a tool with ``confirm = true``.

When the model asks for such a tool, chainrun does not carry it out. It checks the
arguments against the tool's schema (and its ``product_arguments`` against the
catalogue: a product the catalogue does not hold is never asked about) and records a
**pending action**
(:class:`PendingAction`: the tool, the validated arguments, the conversation, the
question and when it expires) in the asking turn's ``tool_calls`` row, status
``awaiting_confirmation``. The turn's answer is the question, written by chainrun from
the arguments (:func:`question_text`), never the model's paraphrase.

The conversation's next turn decides (:func:`read_reply` reads the shopper's message):

- **yes** (``yes``, ``ok``, ``sure``, ``go ahead``, ...; or an explicit confirmation of
  the action's id): the action is carried out with exactly the recorded arguments, once
  (the row's status becomes ``confirmed`` in one conditional update, so two processes
  serving the same "yes" cannot both run it), after the turn is clear to act; the
  model is handed the call and its result and writes the answer from them;
- **no** (``no``, ``cancel``, ``don't``, ...; or an explicit denial): ``denied``, nothing
  runs, chainrun answers that nothing was done;
- **a new request** (a message of more than :data:`UNCLEAR_WORDS` words that is neither):
  ``denied`` (decided by ``new_request``), and the turn goes on as any turn;
- **unclear** (a short message that is neither): the question is asked again; the
  action stays pending.

An action expires after ``confirm_turns`` later turns of its conversation or
``confirm_minutes`` minutes, whichever comes first (defaults 3 turns, 15 minutes): status
``expired``; a "yes" to it runs nothing and the answer says it expired.

Pure: no I/O. The log side is :mod:`chainrun.log.actions`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from chainrun.tools.spec import ToolConfig

__all__ = [
    "NO_WORDS",
    "UNCLEAR_WORDS",
    "YES_WORDS",
    "Decision",
    "PendingAction",
    "Reply",
    "expires_at",
    "question_text",
    "read_reply",
    "reply_texts",
    "utc_iso",
]

#: what a pending action's decision was
Decision = Literal["confirmed", "denied", "expired"]
#: how a shopper's message reads against a pending action
Reply = Literal["yes", "no", "unclear", "new_request"]

#: replies read as yes (a whole message made of them, punctuation aside)
YES_WORDS = frozenset({
    "yes", "y", "yeah", "yep", "yup", "sure", "ok", "okay", "confirm", "confirmed",
    "please", "do", "it", "go", "ahead", "that's", "thats", "right", "correct", "absolutely",
    "definitely", "of", "course", "ja", "oui", "si", "sí", "proceed", "fine", "great",
    "perfect", "add", "place", "order", "thanks", "thank", "you",
})  # fmt: skip
#: words that make a reply a no, wherever they stand in a short message
NO_WORDS = frozenset({
    "no", "n", "nope", "nah", "cancel", "don't", "dont", "stop", "never", "not", "nein",
    "non", "abort", "forget",
})  # fmt: skip
#: a message of at most this many words that is neither a yes nor a no is unclear (the
#: question is asked again); a longer one is a new request (the action is dropped)
UNCLEAR_WORDS = 3
#: words a yes must hold at least one of (``please``, ``thanks`` alone say nothing)
_AFFIRM = frozenset({
    "yes", "y", "yeah", "yep", "yup", "sure", "ok", "okay", "confirm", "confirmed", "go",
    "correct", "right", "absolutely", "definitely", "course", "ja", "oui", "si", "sí",
    "proceed", "fine", "great", "perfect",
})  # fmt: skip
_WORD = re.compile(r"[\w']+", re.UNICODE)


@dataclass(frozen=True)
class PendingAction:
    """An action waiting for the shopper's yes.

    Attributes:
        id: the asking call's idempotency key ``"{turn}:{step}:{round}:{position}"``
            (also the key the tool gets when it runs, so the shop's system can
            deduplicate on it).
        tool: the tool's name.
        arguments: the validated arguments.
        question: what the shopper was asked.
        step: the step whose model asked (the confirmed call is handed to it).
        conversation_id: the conversation it belongs to.
        turn_id: the asking turn (None: a chain without a log).
        turn_index: the asking turn's index in its conversation.
        asked_at: when it was asked (ISO-8601 UTC).
        expires_at: when it expires (ISO-8601 UTC).
        expires_after_turn: the last turn index that may decide it.
        row_id: its ``tool_calls`` row (None: not logged yet).
    """

    id: str
    tool: str
    arguments: dict[str, Any]
    question: str
    step: str
    conversation_id: str | None
    turn_id: int | None
    turn_index: int | None
    asked_at: str
    expires_at: str
    expires_after_turn: int | None
    row_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def expired(self, now: str, turn_index: int | None) -> bool:
        """Whether the action can no longer be decided at ``now`` (ISO-8601 UTC) by the
        turn with index ``turn_index``."""
        if _parse(now) >= _parse(self.expires_at):
            return True
        return (turn_index is not None and self.expires_after_turn is not None
                and turn_index > self.expires_after_turn)  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        """The action as the faces send it: ``{id, tool, arguments, question, step,
        conversation_id, expires_at, expires_after_turn}``."""
        return {"id": self.id, "tool": self.tool, "arguments": self.arguments,
                "question": self.question, "step": self.step,
                "conversation_id": self.conversation_id, "expires_at": self.expires_at,
                "expires_after_turn": self.expires_after_turn}  # fmt: skip


def utc_iso() -> str:
    """Now as ISO-8601 UTC with ms (the log's timestamp format)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _parse(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def expires_at(asked_at: str, config: ToolConfig) -> str:
    """``asked_at`` (ISO-8601 UTC) plus the tool's ``confirm_minutes``, in the log's
    timestamp format (ms)."""
    end = _parse(asked_at) + timedelta(minutes=config.confirm_minutes)
    return end.astimezone(UTC).isoformat(timespec="milliseconds")


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def question_text(name: str, config: ToolConfig, arguments: dict[str, Any]) -> str:
    """The question the shopper is asked: the tool's ``confirm_question`` filled with the
    arguments (an argument the model left out reads as empty), or the description
    followed by every argument (``"Add a product to the cart: sku = JKT-12, qty = 2?"``).
    Written by chainrun from the validated arguments, so it says exactly what a yes runs."""
    if config.confirm_question is not None:
        from chainrun.tools.spec import question_fields

        values = {f: _shown(arguments.get(f, "")) for f in question_fields(config.confirm_question)}
        return config.confirm_question.format_map(values)
    listed = ", ".join(f"{k} = {_shown(v)}" for k, v in arguments.items())
    what = config.description.rstrip(". ")
    return f"{what}: {listed}?" if listed else f"{what}?"


def read_reply(message: str) -> Reply:
    """How ``message`` answers a pending action (see the module text): ``no`` when a
    short message (at most 8 words) holds a no word; ``yes`` when every word is a yes
    word and one affirms; else ``unclear`` for at most :data:`UNCLEAR_WORDS` words,
    ``new_request`` for more."""
    words = [w.lower() for w in _WORD.findall(message)]
    if not words:
        return "unclear"
    if len(words) <= 8 and any(w in NO_WORDS or w.endswith("n't") for w in words):
        return "no"
    if all(w in YES_WORDS for w in words) and any(w in _AFFIRM for w in words):
        return "yes"
    return "unclear" if len(words) <= UNCLEAR_WORDS else "new_request"


def reply_texts(actions: list[PendingAction]) -> dict[str, str]:
    """What chainrun answers itself, by case: ``denied`` (after a no), ``again`` (an
    unclear reply: the question once more), ``expired`` (a yes to an expired action)."""
    questions = " ".join(a.question for a in actions)
    return {
        "denied": f"Okay, I have not done it. (You said no to: {questions})",
        "again": f"Please answer yes or no: {questions}",
        "expired": f"That request has expired, so nothing was done: {questions} "
                   "Ask again if you still want it.",
    }  # fmt: skip
