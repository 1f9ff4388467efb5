"""Word lists as patterns: the grounding check's vocabulary is data, compiled one way.

Each list is a tuple of phrases (a regular expression fragment each; a space in one
matches any white space), matched case-blind as whole words.
"""

from __future__ import annotations

import re

__all__ = ["ending", "starting", "words"]


def _alternatives(phrases: tuple[str, ...]) -> str:
    return "|".join(p.replace(" ", r"\s+") for p in phrases)


def words(*phrases: str) -> re.Pattern[str]:
    """Any of ``phrases`` as whole words (``words("money back", "refunds?")``)."""
    return re.compile(rf"\b(?:{_alternatives(phrases)})(?!\w)", re.I)


def ending(*phrases: str) -> re.Pattern[str]:
    """Any of ``phrases`` at the end of a text, then white space and an optional colon:
    the words just before an amount (``ending("about", "around").search(before)``)."""
    return re.compile(rf"(?<!\w)(?:{_alternatives(phrases)})\s*:?\s*$", re.I)


def starting(*phrases: str) -> re.Pattern[str]:
    """Any of ``phrases`` at the start of a text, after white space: the words just
    after an amount (``starting("or so").match(text, end)``)."""
    return re.compile(rf"\s*(?:{_alternatives(phrases)})(?!\w)", re.I)
