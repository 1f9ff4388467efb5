"""Chat UIs' background requests: a title, tags or follow-up suggestions generated from a
chat's history, sent to the same model as the chat itself.

Such a request is no shopper's turn: built from a chat that may have an action waiting
for a yes, it would otherwise be read as the shopper's reply (a long prompt reads as a
new request, which drops the pending action) and, with its id, claim a turn of the
conversation. A request recognised here is admitted as *background*
(:attr:`chainrun.desk.TurnRequest.background`): it runs in a conversation of its own,
decides no pending action and acts on nothing (a tool with side effects or ``confirm``
is refused ``not_started``).

Recognised by default, from the prompts the UIs send (matched against each message's
text):

- **Open WebUI**: every task prompt (title, tags, follow-ups, search queries,
  autocompletion) begins ``### Task:`` and carries the chat between ``<chat_history>``
  and ``</chat_history>`` (open-webui/open-webui, ``backend/open_webui/config.py``,
  ``DEFAULT_TITLE_GENERATION_PROMPT_TEMPLATE`` and its siblings; the request is one user
  message, its ``metadata`` removed before it leaves Open WebUI:
  ``backend/open_webui/routers/openai.py``);
- **LibreChat**: its agents' title prompts, ``Provide a concise, 5-word-or-less title for
  the conversation ...`` and ``Analyze this conversation and provide: 1. The detected
  language ...`` (danny-avila/agents, ``src/utils/title.ts``), and its older clients'
  ``Please generate ... ||>Title:`` (danny-avila/LibreChat,
  ``api/app/clients/OpenAIClient.js``, ``titleConvo``).

A shop whose chat UI sends other background prompts adds patterns of its own
(``chainrun serve --background-pattern REGEX``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_PATTERNS", "BackgroundRequests"]

_OPEN_WEBUI_TASK = re.compile(r"\A\s*### Task:.*<chat_history>.*</chat_history>", re.DOTALL)
#: (kind, pattern) of the background requests recognised by default (see the module text)
DEFAULT_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("task", _OPEN_WEBUI_TASK),
    ("title", re.compile(r"\A\s*Provide a concise, 5-word-or-less title for the conversation")),
    ("title", re.compile(r"\A\s*Analyze this conversation and provide:\s*1\. The detected "
                         r"language")),
    ("title", re.compile(r"\A\s*Please generate .*title.*\|\|>Title:\s*\Z", re.DOTALL)),
)  # fmt: skip
#: Open WebUI's task kinds, by a word of the task's first line
_TASK_KINDS = (("title", "title"), ("tags", "tags"), ("follow_ups", "follow-up"),
               ("queries", "queries"))  # fmt: skip


@dataclass(frozen=True)
class BackgroundRequests:
    """The patterns that make a request a chat UI's background request.

    Attributes:
        patterns: ``(kind, compiled pattern)``, searched in each message's text.
    """

    patterns: tuple[tuple[str, re.Pattern[str]], ...] = DEFAULT_PATTERNS

    @classmethod
    def with_extra(cls, extra: Iterable[str]) -> BackgroundRequests:
        """The default patterns and ``extra`` ones (regular expressions, Python's
        syntax, searched anywhere in a message; kind ``configured``).

        Raises:
            ValueError: a pattern that does not compile (the message names it).
        """
        added = []
        for text in extra:
            try:
                added.append(("configured", re.compile(text)))
            except re.error as e:
                raise ValueError(f"background pattern {text!r}: {e}") from None
        return cls((*DEFAULT_PATTERNS, *added))

    def kind(self, texts: Sequence[str]) -> str | None:
        """The kind of background request whose messages' ``texts`` these are (``title``,
        ``tags``, ``follow_ups``, ``queries``, ``task``, ``configured``), or None: a
        shopper's turn."""
        for text in texts:
            for kind, pattern in self.patterns:
                if pattern.search(text) is None:
                    continue
                if kind == "task":  # Open WebUI's: which task, from its first line
                    head = text.strip().split("\n", 2)[:2]
                    said = " ".join(head).lower()
                    return next((k for k, word in _TASK_KINDS if word in said), "task")
                return kind
        return None
