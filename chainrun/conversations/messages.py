"""A Chat Completions ``messages`` list read as a conversation: the earlier turns and the
message to answer.

The OpenAI-compatible face keeps no state, as the API it copies: the client sends the
whole thread every time (OpenAI API reference, "Create chat completion": ``messages``,
"a list of messages comprising the conversation so far"). The chain reads it this way:

- the **last** ``user`` message is the message to answer;
- each earlier ``user`` message opens a turn of history, and the ``assistant`` messages
  that follow it (up to the next ``user`` message) are what the shopper was shown; a
  user message with no assistant message after it is a turn with no answer; a user
  message with no text (an image only) is left out, with its answers;
- ``system`` and ``developer`` messages are not used: the chain's steps have their own
  system texts (config), and a client's instructions are not passed to any step (a
  shop's assistant is not re-instructed by its users); they are counted in
  :attr:`Thread.ignored`;
- ``tool`` messages and an assistant's ``tool_calls`` carry no text for the shopper and
  are skipped; assistant messages before the first user message are dropped too;
- messages after the last user message (an assistant prefill) are not used.

Content may be a string or a list of content parts; the text parts are joined.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chainrun.conversations.history import HistoryTurn

__all__ = ["Thread", "message_text", "read_thread"]


def message_text(content: Any) -> str | None:
    """The text of a message's ``content``: a string, or the ``text`` parts of a list
    joined by newlines (None: no text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        texts = [p for p in parts if isinstance(p, str)]
        return "\n".join(texts) if texts else None
    return None


@dataclass(frozen=True)
class Thread:
    """A ``messages`` list read as a conversation (see the module text).

    Attributes:
        message: the last user message's text (None: there is none with text).
        history: the earlier turns, oldest first.
        ignored: how many ``system``/``developer`` messages were left out.
        opening: the chat's opening as sent: the texts of the ``system``/``developer``
            messages before its first user message with text, then that message's text;
            the same on every turn of a chat (a stateless client's conversation id is
            derived from it: :mod:`chainrun.desk.conversations`).
    """

    message: str | None
    history: tuple[HistoryTurn, ...] = field(default_factory=tuple)
    ignored: int = 0
    opening: tuple[str, ...] = ()

    @property
    def turn_index(self) -> int:
        """The 1-based position of the message to answer in its conversation."""
        return len(self.history) + 1


def read_thread(messages: Sequence[Any]) -> Thread:
    """Read ``messages`` (a Chat Completions request's list) as a :class:`Thread`.

    Entries that are not objects, or have no ``role``, are skipped like tool messages.
    """
    last_user = max(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
        default=None,
    )
    if last_user is None:
        return Thread(None)
    ignored = sum(
        1 for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")
    )
    turns: list[tuple[str, list[str]]] = []
    for m in messages[:last_user]:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        text = message_text(m.get("content"))
        if role == "user":
            turns.append((text or "", []))
        elif role == "assistant" and turns and text:
            turns[-1][1].append(text)
    history = tuple(
        HistoryTurn(msg, "\n".join(answers)) for msg, answers in turns if msg.strip()
    )
    return Thread(message_text(messages[last_user].get("content")), history, ignored,
                  _opening(messages))  # fmt: skip


def _opening(messages: Sequence[Any]) -> tuple[str, ...]:
    """The instructions before the first user message with text, and that message."""
    out: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        text = message_text(m.get("content"))
        if m.get("role") in ("system", "developer") and text:
            out.append(text)
        elif m.get("role") == "user" and text and text.strip():
            return (*out, text)
    return ()
