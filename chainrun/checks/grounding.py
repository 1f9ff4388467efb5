"""The grounding check: the facts an answer states, against the shop's own sources.

A model can write "[JKT-013] Women's City Drizzle Packable Rain Jacket | €49.95" when
JKT-013 is the 229 EUR Summit hardshell, "about 120 EUR" for a €1,299 tent, or "3-5
working days" for a refund the policy gives 10 days. A model-based review (the default
``validate`` step) can be talked round; this check cannot: it reads the answer's
**claims** sentence by sentence and judges each against chainrun's own sources for the
turn, by rules, in microseconds.

The pieces:

- :mod:`chainrun.money`: amounts as shops write them (Babel's CLDR formats, then
  price-parser), in the shop's currency and locale.
- :mod:`chainrun.checks.sources`: the sources: the products the answer step was handed,
  the products the conversation showed before, the whole catalogue, the turn's tool
  results, the shop's policy (its fees, days, discounts, VAT rates, countries).
- :mod:`chainrun.checks.facts`: what a sentence states: the products it names, its
  amounts and their roles (a price, "about", "under", "from", a range, "was"), and the
  words that make an amount derived (a quantity, a total, a difference, a fee, VAT).
- :mod:`chainrun.checks.judging`: each claim judged true, false or not judged (the list
  of claim kinds is there).
- this module: :class:`StreamGrounding`, the check on a stream, and what is done with a
  claim that is not grounded (the ``action``).

Sources are chainrun's own. What a client sends as earlier assistant turns (the OpenAI
face's ``messages``) is what the client says the assistant said, never a source.

Actions on a claim that is false or not judged:

- ``correct`` (the default): a claim :data:`~chainrun.checks.judging.CORRECTABLE` (a
  wrong unit price or title of the one product a sentence names) is rewritten to the
  row's, in the shop's locale and currency; any other drops its **whole sentence**; an
  answer left empty is replaced by ``safe_text``, once.
- ``drop``: every sentence with such a claim is dropped (the same empty-answer rule).
- ``replace``: the whole answer is replaced by ``safe_text``; ``refuse``: the turn is
  refused; ``flag``: the answer is left as it is; each is logged.

On a stream (:class:`StreamGrounding`, run by the hold-back engine,
:class:`chainrun.checks.holdback.HoldBack`) a sentence is held back until it is complete
and judged: the shopper reads whole sentences, kept, corrected or left out, and never a
sentence's start followed by something else.

Limits (also in docs/guides/checks-and-guards.md): English words decide a sentence's
roles (amounts and currencies are read in any locale); a product is named by its id,
its title or words of its title; a policy figure is judged against the policy's figures
on the same subject, not per country or per case; the catalogue holds no earlier
("was") prices, so every "was" price is not so.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from chainrun.checks.facts import segments
from chainrun.checks.holdback import Redaction, WindowVerdict
from chainrun.checks.judging import Claim, check_segment, check_text, last_named
from chainrun.checks.sources import (
    DEFAULT_ID_PATTERN,
    GroundingSources,
    PolicyFacts,
    ProductRow,
    TitleIndex,
    core_title,
)

__all__ = [
    "DEFAULT_ID_PATTERN",
    "DEFAULT_SAFE_TEXT",
    "Claim",
    "GroundingAction",
    "GroundingSources",
    "PolicyFacts",
    "ProductRow",
    "StreamGrounding",
    "TitleIndex",
    "check_segment",
    "check_text",
    "core_title",
    "last_named",
]

GroundingAction = Literal["correct", "drop", "replace", "refuse", "flag"]

#: what the shopper is told when nothing of the answer is left (or ``replace``)
DEFAULT_SAFE_TEXT = (
    "I could not confirm the details of that answer against our catalogue. "
    "Please see the product pages for current prices and sizes."
)


class StreamGrounding:
    """The grounding check of one answer stream, for the hold-back engine.

    Called with the text the engine holds (``await check(held, final=...)``); told what
    it released (:meth:`released`). It judges each sentence once it is complete (or at
    the end), and returns the :class:`~chainrun.checks.holdback.WindowVerdict`: pass,
    redactions (a correction or a dropped sentence, by ``action``), a block (``replace``
    or ``refuse``), and ``hold_from``: the offset of the held text from which nothing
    may be released yet (the start of the sentence still being written).

    Attributes:
        claims: every claim judged, in order.
        actions: what was done, one entry per claim not grounded (``corrected``,
            ``dropped``, ``replaced``, ``refused``, ``flagged``).
        check_us: CPU time of each call, in µs (``time.thread_time_ns``: the calling
            thread's own).
    """

    streaming = True

    def __init__(
        self,
        sources: GroundingSources,
        action: GroundingAction = "correct",
        *,
        safe_text: str = DEFAULT_SAFE_TEXT,
    ) -> None:
        self.sources = sources
        self.action = action
        self.safe_text = safe_text
        self.claims: list[Claim] = []
        self.actions: list[dict[str, Any]] = []
        self.check_us: list[float] = []
        self._context = ""  # released text of the sentence still open (white space)
        self._judged = 0  # chars of the held text already judged (complete sentences)
        self._kept_any = False  # a sentence with content reached (or will reach) the shopper
        self._released_any = False  # some of the answer has reached the shopper
        #: the product the answer named last, for a claim whose sentence names none
        self._last_named: frozenset[str] = frozenset()

    def released(self, piece: str) -> None:
        """The engine released ``piece``: it is context for the sentence still open."""
        self._context += piece
        self._released_any = self._released_any or bool(piece.strip())
        self._judged = max(0, self._judged - len(piece))
        done = [e for _, e, complete in segments(self._context) if complete]
        if done:
            self._context = self._context[done[-1] :]

    def judge(self, text: str) -> WindowVerdict:
        """The verdict on a whole answer ``text`` (not streamed: every sentence complete)."""
        t0 = time.thread_time_ns()
        try:
            return self._check(text, True)
        finally:
            self.check_us.append((time.thread_time_ns() - t0) / 1000.0)

    async def __call__(self, held: str, final: bool = False) -> WindowVerdict:
        t0 = time.thread_time_ns()
        try:
            return self._check(held, final)
        finally:
            self.check_us.append((time.thread_time_ns() - t0) / 1000.0)

    def _check(self, held: str, final: bool) -> WindowVerdict:
        ctx = self._context
        full = ctx + held
        base = len(ctx)
        redactions: list[Redaction] = []
        hold_from: int | None = None
        for start, end, complete in segments(full):
            if end <= base + self._judged and complete:
                continue  # judged by an earlier call
            if not complete and not final:
                # a sentence still being written: none of it is released before it is
                # complete and judged, so the shopper reads whole sentences
                hold_from = max(start, base) - base
                break
            seg = full[start:end]
            claims = check_segment(self.sources, seg, start, self._last_named)
            self._last_named = last_named(self.sources, seg) or self._last_named
            self.claims.extend(claims)
            bad = [c for c in claims if not c.grounded]
            if seg.strip():
                dropped = False
                if bad:
                    verdict = self._act(bad, start, end, base, redactions)
                    if verdict is not None:
                        return verdict
                    dropped = any(a.get("segment_dropped") for a in self.actions[-len(bad):])
                if not dropped:
                    self._kept_any = True
            if complete:
                judged = end - base
                # in the held text as the engine keeps it: after this call's redactions
                judged += sum(len(r.replacement) - (r.end - r.start) for r in redactions
                              if r.end <= judged)  # fmt: skip
                self._judged = max(self._judged, judged)
        if final and not self._kept_any and self.action in ("correct", "drop") and self.actions:
            # every sentence was dropped: the shopper is told so, once, on its own
            if self._released_any:
                redactions = [Redaction(0, len(held), "\n\n" + self.safe_text)]
                self.actions.append({"action": "replaced", "why": "nothing of the answer was "
                                     "left after what had been released"})  # fmt: skip
            else:
                redactions = [Redaction(0, len(held), self.safe_text)]
                self.actions.append({"action": "replaced",
                                     "why": "nothing of the answer was left"})
        merged = _merge(redactions)
        if hold_from is not None:  # in the held text as redacted
            hold_from += sum(len(r.replacement) - (r.end - r.start) for r in merged
                             if r.end <= hold_from)  # fmt: skip
        return WindowVerdict(True, redactions=tuple(merged), hold_from=hold_from)

    def _act(
        self, bad: list[Claim], start: int, end: int, base: int, redactions: list[Redaction]
    ) -> WindowVerdict | None:
        """Apply the action to a sentence's claims not grounded (offsets of ``full``)."""
        why = "; ".join(f"{c.kind} {c.text!r}: {c.why}" for c in bad)
        if self.action == "flag":
            self.actions.extend({"claim": c.text, "action": "flagged"} for c in bad)
            return None
        if self.action in ("replace", "refuse"):
            self.actions.extend({"claim": c.text, "action": self.action + "d"} for c in bad)
            return WindowVerdict(False, f"ungrounded: {why}")
        correctable = self.action == "correct" and all(
            c.judged and c.correction is not None and c.start >= base for c in bad
        )
        if correctable:
            for c in bad:
                assert c.correction is not None
                redactions.append(Redaction(c.start - base, c.end - base, c.correction))
                self.actions.append({"claim": c.text, "action": "corrected",
                                     "to": c.correction})  # fmt: skip
            return None
        lo = max(start, base) - base
        redactions.append(Redaction(lo, end - base, ""))
        self.actions.extend({"claim": c.text, "action": "dropped", "segment_dropped": True}
                            for c in bad)  # fmt: skip
        return None

    def report(self) -> dict[str, Any]:
        """The turn's grounding record: claims checked (judged and not judged), those
        not grounded and why, what was done, and the CPU per call (µs).

        Keys: ``action``, ``claims`` (all), ``judged``, ``unjudged``, ``n_ungrounded``
        (judged and false), ``ungrounded`` (false or not judged, each as
        :meth:`Claim.as_json`), ``done``, ``grounded`` (every claim judged true),
        ``checks``, ``cpu_us_p50``, ``cpu_us_max``."""
        bad = [c for c in self.claims if not c.grounded]
        unjudged = sum(1 for c in self.claims if not c.judged)
        cpu = sorted(self.check_us)
        return {
            "action": self.action,
            "claims": len(self.claims),
            "judged": len(self.claims) - unjudged,
            "unjudged": unjudged,
            "ungrounded": [c.as_json() for c in bad],
            "n_ungrounded": sum(1 for c in bad if c.judged),
            "done": [{k: v for k, v in a.items() if k != "segment_dropped"}
                     for a in self.actions],
            "grounded": not bad,
            "checks": len(cpu),
            "cpu_us_p50": round(cpu[len(cpu) // 2], 1) if cpu else None,
            "cpu_us_max": round(cpu[-1], 1) if cpu else None,
        }  # fmt: skip


def _merge(redactions: list[Redaction]) -> list[Redaction]:
    """Redactions without overlaps (a dropped sentence swallows corrections inside it)."""
    out: list[Redaction] = []
    for r in sorted(redactions, key=lambda r: (r.start, -(r.end - r.start))):
        if out and r.start < out[-1].end:
            continue
        out.append(r)
    return out
