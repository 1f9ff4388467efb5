"""Guard verdicts in Llama Guard's reply format, and what a missing verdict means.

Llama Guard (Meta, "Llama Guard: LLM-based Input-Output Safeguard for Human-AI
Conversations", 2023; Llama Guard 3 model card) replies in two lines: ``safe``, or
``unsafe`` then the violated categories, comma-separated codes ``S1`` ... ``S14``; the
model card notes that a bare ``unsafe`` (no category line) occurs. The parser reads the
verdict word on the first non-blank line, case-insensitively (``UNSAFE``, ``Safe``), takes
the category line when there is one (codes normalised to ``S1`` ...), and calls anything
else unparseable: a guard that says something else has not given a verdict.

A missing verdict (``timeout``, ``error``, ``unparseable``) is decided by the guard's
policy, which has no default: ``open`` lets the turn through (availability matters more
and another layer catches what slips), ``closed`` refuses it (a wrong answer is worse
than none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MissingReason = Literal["timeout", "error", "unparseable"]
MissingPolicy = Literal["open", "closed"]

_CATEGORY = re.compile(r"S(?:[1-9]|1[0-4])")


@dataclass(frozen=True)
class GuardVerdict:
    """A guard's verdict: ``safe``, ``unsafe`` (with categories), or missing (with a reason).

    Attributes:
        status: "safe", "unsafe" or "missing".
        categories: the violated category codes of an ``unsafe`` verdict.
        missing: why there is no verdict (None unless ``status == "missing"``).
    """

    status: Literal["safe", "unsafe", "missing"]
    categories: tuple[str, ...] = ()
    missing: MissingReason | None = None

    def refuses(self, on_missing: MissingPolicy) -> bool:
        """Whether the turn is refused: only an explicit ``unsafe``, or a missing verdict
        under the ``closed`` policy."""
        if self.status == "unsafe":
            return True
        return self.status == "missing" and on_missing == "closed"

    def as_json(self) -> dict[str, object]:
        """``{status, categories, missing}`` for the turn's verdicts."""
        return {"status": self.status, "categories": list(self.categories), "missing": self.missing}


def parse_llama_guard(text: str | None) -> GuardVerdict:
    """Parse a Llama Guard reply: ``safe``; or ``unsafe``, optionally followed by a line
    of codes ``S1``-``S14`` (comma-separated).

    The verdict word is the first non-blank line, read case-insensitively; codes are read
    case-insensitively and returned upper-case (``("S1", "S2")``). Anything else (other
    words, a bad code, a line after ``safe``, more than one category line) is a missing
    verdict with reason ``unparseable``. Never raises.
    """
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return GuardVerdict("missing", missing="unparseable")
    word = lines[0].lower()
    if word == "safe" and len(lines) == 1:
        return GuardVerdict("safe")
    if word == "unsafe" and len(lines) == 1:
        return GuardVerdict("unsafe")
    if word == "unsafe" and len(lines) == 2:
        codes = tuple(code.strip().upper() for code in lines[1].split(","))
        if all(_CATEGORY.fullmatch(code) for code in codes):
            return GuardVerdict("unsafe", codes)
    return GuardVerdict("missing", missing="unparseable")


def missing_verdict(reason: MissingReason) -> GuardVerdict:
    """A missing verdict for ``reason`` (the guard timed out or failed)."""
    return GuardVerdict("missing", missing=reason)
