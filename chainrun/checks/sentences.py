"""The sentence limit: an answer ends after its first ``max_sentences`` sentences, on the
stream.

A small model asked for one sentence writes one and goes on: the embedded 270M model
followed "Here are our rain jackets!" with "They're made of high-quality materials and
can be worn all year round." and "Here are our wool coats for sale!" with "I'm looking
to buy 2 more of these." (the shopper's words, not the shop's). Stop sequences end most
of these at ". ", but the OpenAI Chat Completions API takes at most four stop sequences
("up to 4 sequences": platform.openai.com/docs/api-reference/chat/create, ``stop``), so
"! " and "? " are not among the default chain's. This check ends the answer where its
``max_sentences``-th sentence ends (terminal punctuation, closing quotes or brackets,
then white space and more words): the text after it is dropped and the model's stream
closed (:attr:`~chainrun.checks.holdback.WindowVerdict.stop`), as the loop check does.

Knows nothing of LLMs or HTTP: text in, verdicts out.
"""

from __future__ import annotations

import re
from typing import Any

from chainrun.checks.holdback import Redaction, WindowVerdict
from chainrun.checks.stream import StreamCheck, StreamFigures

__all__ = ["SentenceLimit"]

#: where a sentence ends and another begins: terminal punctuation (closing quotes or
#: brackets after it), white space, then a word
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s+\S*\w)")


class SentenceLimit(StreamCheck):
    """Ends one answer after ``max_sentences`` sentences (see the module text).

    Args:
        max_sentences: the sentences kept (>= 1).
    """

    def __init__(self, max_sentences: int) -> None:
        if max_sentences < 1:
            raise ValueError(f"max_sentences: expected at least 1, got {max_sentences}")
        self.max_sentences = max_sentences
        self._released = ""
        #: the characters of the model's text dropped after the last sentence kept
        self.dropped_chars = 0

    def released(self, piece: str) -> None:
        self._released += piece

    async def check(self, text: str, final: bool) -> WindowVerdict:
        base = len(self._released)
        full = self._released + text
        ends = [m.end() for m in _SENTENCE_END.finditer(full)]
        if len(ends) < self.max_sentences:
            return WindowVerdict(True)
        cut = max(ends[self.max_sentences - 1], base) - base
        self.dropped_chars = len(text) - cut
        return WindowVerdict(True, f"more than {self.max_sentences} sentence(s)",
                             (Redaction(cut, len(text), ""),), stop=True)  # fmt: skip

    def finish(self, figures: StreamFigures) -> dict[str, Any] | None:
        """``{"max_sentences", "dropped_chars"}`` when the answer was cut, else None."""
        if not self.dropped_chars:
            return None
        return {"max_sentences": self.max_sentences, "dropped_chars": self.dropped_chars}
