"""The output check as an entry of the answer's checks: the deterministic pattern checks
(cards, IBANs, keys, the shop's own regexes) on windows of the answer's stream
(:mod:`chainrun.checks.holdback`, :mod:`chainrun.checks.patterns`)."""

from __future__ import annotations

from typing import Any

from chainrun.checks.holdback import WindowVerdict, exposure_bound, window_check
from chainrun.checks.patterns import PatternChecker
from chainrun.checks.stream import StreamCheck, StreamFigures

__all__ = ["OutputCheck"]


class OutputCheck(StreamCheck):
    """The pattern checks of one answer: a ``block`` match blocks (the turn answers
    ``reject_text``, default the chain's refusal), a ``redact`` match is shown as
    ``[NAME]``; the engine holds back ``window_tokens`` tokens for it.

    Args:
        patterns: the checks in force.
        window_tokens: c, the tokens held back (>= 1).
        reject_text: what the shopper is told on a block (None: the chain's refusal).
    """

    def __init__(
        self, patterns: PatternChecker, window_tokens: int, reject_text: str | None = None
    ) -> None:
        self.window_tokens = window_tokens
        self.reject_text = reject_text
        self._check = window_check(patterns=patterns)
        #: spans redacted (an unstreamed answer's; a stream's are the engine's figure)
        self.redactions = 0

    async def check(self, text: str, final: bool) -> WindowVerdict:
        verdict = await self._check(text)
        self.redactions += len(verdict.redactions)
        return verdict

    def on_block(self) -> tuple[str | None, bool]:
        return self.reject_text, False

    def finish(self, figures: StreamFigures) -> dict[str, Any]:
        """The check's figures: windows checked, check latency (ms), tokens held and
        released, the block (reason and tokens shown before it), and the exposure bound
        for the stream's measured generation speed and slowest check
        (:func:`~chainrun.checks.holdback.exposure_bound`). An answer not streamed:
        ``{streamed: false, checks: 1, redactions, status}``."""
        blocked = figures.blocked_by is not None
        st = figures.stats
        if st is None:
            doc: dict[str, Any] = {"streamed": False, "checks": 1,
                                   "redactions": self.redactions,
                                   "status": "blocked" if blocked else "passed"}  # fmt: skip
            if blocked:
                doc["reason"] = figures.reason
            return doc
        c = figures.window_tokens
        doc = {
            "window_tokens": c, "checks": st.checks,
            "check_ms_max": round(max(st.check_ms), 3) if st.check_ms else None,
            "tokens_in": st.tokens_in, "tokens_released": st.tokens_released,
            "max_held_tokens": st.max_held_tokens, "redactions": st.redactions,
            "status": "blocked" if blocked else "passed",
        }  # fmt: skip
        if blocked:
            doc["reason"] = figures.reason
            doc["released_before_block_tokens"] = figures.released_before_block_tokens
        if figures.tokens_per_s is not None and c >= 1:
            doc["tokens_per_s"] = round(figures.tokens_per_s, 1)
            doc["exposure"] = exposure_bound(c, figures.tokens_per_s,
                                             max(st.check_ms, default=0.0))  # fmt: skip
        return doc
