"""A reasoning model's thought taken out of ``content``, where some servers put it.

Reasoning models served raw (MiniMax; llama-server with ``reasoning_format: none``)
stream their thought inside ``delta.content`` as ``<think>…</think>``, and llama-server's
templates can leave the opener out so that only a lone ``</think>`` marks the thought's
end. Read as content, the thought would reach the shopper, the answer, the checks and
the next turn's history. :class:`ThinkSplitter` moves it to the reasoning side of each
chunk, so it is logged (and counted for the TTFT) as reasoning, and the answer is what
follows ``</think>``.

Modes (``[providers.NAME] reasoning_in_content``):

- ``"auto"`` (the default): an answer whose content begins with ``<think>`` (after
  white space) is split; any other answer passes unchanged, after at most the seven
  characters it takes to tell. The request's stops go to the server as always, so a
  stop such as ``"\\n\\n"`` may end the call inside the thought (its answer is then
  empty); a lone ``</think>`` is not recognised in this mode (the text before it has
  been streamed as the answer by then).
- ``"think_tags"``: the server is known to think in content: everything before the
  first ``</think>`` is the thought, with or without the opener, and the request's
  stops are applied here to the answer only (they are not sent to the server, which
  would apply them to the thought too); a stop found ends the call with finish reason
  ``stop`` and closes its stream.
- ``"off"``: content is the answer, as the server sent it.

Pure: no I/O, no clock; fed one chunk at a time, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from chainrun.timing import Chunk

ReasoningInContent = Literal["auto", "think_tags", "off"]

OPEN = "<think>"
CLOSE = "</think>"


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkSplitter:
    """Splits each chunk's content into (reasoning, answer) for one call (see the module).

    Args:
        mode: ``"auto"`` or ``"think_tags"`` (``"off"`` needs no splitter).
        stops: ``think_tags`` only: stop sequences applied to the answer.

    Attributes:
        found: the call's content held a thought (it was moved to reasoning).
        stopped: a stop sequence ended the answer (``think_tags``).
    """

    def __init__(self, mode: ReasoningInContent, stops: Sequence[str] = ()) -> None:
        self.mode = mode
        self._stops = tuple(s for s in stops if s) if mode == "think_tags" else ()
        #: "start" (the opener not yet told), "thought", "answer", "plain" (no thought)
        self._state = "start"
        self._held = ""  # text that may be the start of a tag or a stop
        self._answer_started = False
        self.found = False
        self.stopped = False

    def apply(self, chunk: Chunk) -> Chunk:
        """``chunk`` with its content split; held text is released on the finish chunk."""
        if self._state == "plain" or self.stopped:
            return chunk
        text = chunk.content or ""
        if not text and not chunk.finish_reason:
            return chunk
        reasoning, content = self._split(self._held + text, final=bool(chunk.finish_reason))
        finish = "stop" if self.stopped else chunk.finish_reason
        if chunk.reasoning:
            reasoning = chunk.reasoning + reasoning
        return replace(chunk, content=content or None, reasoning=reasoning or None,
                       finish_reason=finish)  # fmt: skip

    def _split(self, text: str, *, final: bool) -> tuple[str, str]:
        self._held = ""
        if self._state == "start":
            stripped = text.lstrip()
            if stripped.startswith(OPEN):
                self._state, self.found = "thought", True
                text = stripped[len(OPEN):]
            elif OPEN.startswith(stripped) and not final:
                self._held = text  # not told yet: "<thi" may still be "<think>"
                return "", ""
            elif self.mode == "think_tags":
                self._state = "thought"
            else:
                self._state = "plain"
                return "", text
        reasoning = ""
        if self._state == "thought":
            end = text.find(CLOSE)
            if end < 0:
                keep = 0 if final else _partial_suffix(text, CLOSE)
                self._held = text[len(text) - keep:] if keep else ""
                return text[: len(text) - keep], ""
            reasoning, text = text[:end], text[end + len(CLOSE):]
            self._state, self.found = "answer", True
        if not self._answer_started:
            text = text.lstrip()  # the blank line(s) after </think> are no answer
            self._answer_started = bool(text)
        return reasoning, self._answer(text, final=final)

    def _answer(self, text: str, *, final: bool) -> str:
        """Answer text up to the first stop; a possible stop's start is held back."""
        if not self._stops:
            return text
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return text[:cut]
        keep = 0 if final else max(_partial_suffix(text, s) for s in self._stops)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]
