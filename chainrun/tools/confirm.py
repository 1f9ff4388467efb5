"""Actions that wait for the shopper's yes: a tool with ``confirm = true``.

When the model asks for such a tool, chainrun does not carry it out. It checks the
arguments against the tool's schema (and its ``product_arguments`` against the
catalogue: a product the catalogue does not hold is never asked about; an argument the
schema's properties do not name is refused: :func:`outside_properties`) and records a
**pending action**
(:class:`PendingAction`: the tool, the validated arguments, the conversation, the
question, the tool's config digest and when it expires) in the log's ``actions`` table
before its question goes anywhere, and in the asking turn's ``tool_calls`` row, status
``awaiting_confirmation``. The turn's answer is the question, written by chainrun from
the arguments (:func:`question_text`: every argument shown), never the model's
paraphrase.

The conversation's next turn decides (:func:`read_reply` reads the shopper's message
with :mod:`chainrun.classify.replies`: multilingual rules, then the nearest labelled
replies, biased so that only a clear yes is a yes):

- **yes** ("yes", "sure why not", "yes add it to my cart", "ja bitte", "👍"; or an
  explicit confirmation of the action's id): the action is carried out with exactly the
  recorded arguments, once (its status becomes ``confirmed`` in one conditional update,
  so of any number of turns serving the same "yes", on any number of processes, one runs
  it and the others say so), after the turn is clear to act; the model is handed the call
  and its result and writes the answer from them
  (:mod:`chainrun.actions.confirmations`: checked again first, and honest after a crash);
- **no** ("no", "cancel", "not now", "nein danke", "👎"; or an explicit denial):
  ``denied``, nothing runs, chainrun answers that nothing was done;
- **a new request that conflicts** with the action (it negates it, "no, show me the
  cheaper one"; changes it, "add the blue one instead", "actually make it 3"; or asks for
  the same thing with another product id or number, :func:`conflicts`): ``denied``
  (decided by ``new_request``), and the turn goes on as any turn;
- **a new request beside it** ("what is your return policy?", "do you have these in
  M?"): reply ``side_request``: the action stays pending (listed again in the turn's
  pending actions) and the turn goes on as any turn; a later yes still confirms it until
  it expires;
- **unclear** ("maybe", "hmm", "not sure", a yes with a condition: "yes if it's under
  50"): the question is asked again; the action stays pending. Nothing that is not a
  clear yes runs anything.

An action expires after ``confirm_turns`` later turns of its conversation or
``confirm_minutes`` minutes, whichever comes first (defaults 3 turns, 15 minutes): status
``expired``; a "yes" to it runs nothing and the answer says it expired.

Pure: no I/O. The log side is :mod:`chainrun.log.actions`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from chainrun.classify.replies import default_reader, words_of
from chainrun.tools.spec import ToolConfig

__all__ = [
    "CHANGE_WORDS",
    "Decision",
    "PendingAction",
    "Reply",
    "config_digest",
    "conflicts",
    "expires_at",
    "outside_properties",
    "question_text",
    "read_reply",
    "reply_texts",
    "utc_iso",
]

#: what a pending action's decision was
Decision = Literal["confirmed", "denied", "expired"]
#: how a shopper's message reads against a pending action (``side_request``: a new
#: request that does not conflict with it)
Reply = Literal["yes", "no", "unclear", "new_request", "side_request"]

#: words that make a new request a change of the pending action ("add the blue one
#: instead", "zeig mir lieber ...", "montre-moi plutôt ..."), accents folded
CHANGE_WORDS = frozenset("""
instead rather actually change changed different another only swap switch wrong not no
don't dont never cancel stop
stattdessen statt lieber andere anderen anderes ander andern aendern andern nein nicht kein
plutot lieu autre changer change non pas annule
vez lugar mejor otro otra otros cambiar cambia cancela
invece piuttosto altro altra altri cambia cambiare annulla
liever plaats ander andere wijzig veranderen annuleer nee niet geen
""".split())

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
        logged: it is in the log's ``actions`` table (decided there).
        config_sha256: :func:`config_digest` of the tool's config when it was asked (a
            yes to it once the config changed asks again).
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
    logged: bool = False
    config_sha256: str = ""
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


def config_digest(config: ToolConfig) -> str:
    """A SHA-256 (hex) of the tool's whole config (its schema, target, question, limits):
    equal digests, the same tool as when the shopper was asked."""
    text = json.dumps(config.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def outside_properties(arguments: dict[str, Any], config: ToolConfig) -> list[str]:
    """The arguments ``arguments`` holds that the tool's schema names no property for
    (a ``confirm`` tool refuses them: the shopper would not be asked about them)."""
    props = config.parameters.get("properties") or {}
    return [k for k in arguments if k not in props]


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def question_text(name: str, config: ToolConfig, arguments: dict[str, Any]) -> str:
    """The question the shopper is asked: the tool's ``confirm_question`` filled with the
    arguments (an argument the model left out reads as empty), or the description
    followed by every argument (``"Add a product to the cart: sku = JKT-12, qty = 2?"``).
    Arguments given that ``confirm_question`` does not name follow it in brackets
    (``"Add 2 x JKT-12 to your cart? (gift_wrap = true)"``). Written by chainrun from the
    validated arguments, so it shows every argument a yes runs."""
    if config.confirm_question is not None:
        from chainrun.tools.spec import question_fields

        fields = question_fields(config.confirm_question)
        values = {f: _shown(arguments.get(f, "")) for f in fields}
        text = config.confirm_question.format_map(values)
        rest = ", ".join(f"{k} = {_shown(v)}" for k, v in arguments.items() if k not in fields)
        return f"{text} ({rest})" if rest else text
    listed = ", ".join(f"{k} = {_shown(v)}" for k, v in arguments.items())
    what = config.description.rstrip(". ")
    return f"{what}: {listed}?" if listed else f"{what}?"


def _told(action: PendingAction) -> list[str]:
    """The texts whose words a reply to ``action`` may repeat: its question, its tool's
    name, its arguments' values."""
    values = [v if isinstance(v, str) else json.dumps(v) for v in action.arguments.values()]
    return [action.question, action.tool.replace("_", " "), *values]


def conflicts(message: str, actions: Sequence[PendingAction], negated: bool = False) -> bool:
    """Whether a new request in ``message`` conflicts with the pending ``actions`` (so
    they are dropped): it began with a no (``negated``), it holds a word of change or
    negation (:data:`CHANGE_WORDS`), or it asks for the same tool again (a word of the
    tool's name) with a product id or number the action does not hold ("add 3 of
    JKT-12 to my cart" while "2 x JKT-12" waits)."""
    words = set(words_of(message))
    if negated or words & CHANGE_WORDS or any(w.endswith("n't") for w in words):
        return True
    for action in actions:
        tool_words = set(words_of(action.tool.replace("_", " "))) - {"to", "a", "the", "my"}
        held = {w for text in _told(action)[2:] for w in words_of(text)}
        numbers = {w for w in words if any(ch.isdigit() for ch in w)}
        if words & tool_words and numbers - held:
            return True
    return False


async def read_reply(message: str, actions: Sequence[PendingAction] = ()) -> Reply:
    """How ``message`` answers the pending ``actions`` (see the module text): the reading
    of :func:`chainrun.classify.replies.default_reader` (the words of the actions'
    questions and arguments may follow a leading yes: "yes, 2 of JKT-12"), with a new
    request split into ``new_request`` (it :func:`conflicts` with them) and
    ``side_request`` (it does not; without ``actions``, always ``new_request``)."""
    reading = await default_reader().read(
        message, [text for action in actions for text in _told(action)])
    if reading.label != "new_request" or not actions:
        return reading.label
    if conflicts(message, actions, negated=bool(reading.detail.get("negated"))):
        return "new_request"
    return "side_request"


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
