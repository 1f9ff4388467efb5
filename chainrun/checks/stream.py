"""The answer's checks as one list: the protocol a check of the answer's stream follows,
the list that runs them in order, and a registry of checks by name.

A **stream check** (:class:`StreamCheck`) is made fresh for each answer (each round of
a call with tools) and fed the answer as it streams, by the hold-back engine
(:class:`chainrun.checks.holdback.HoldBack`):

- **fed**: ``await check.check(text, final)``: ``text`` is what the engine holds (not
  yet released to the shopper; the checks before this one in the list have already
  applied their redactions to it); ``final`` is true once the stream has ended and
  ``text`` is all that is left (that call comes only when something is still held at
  the end: a check that must see the end holds something back). A check that needs a
  window of tokens held back says so with :attr:`StreamCheck.window_tokens` (the
  engine holds the largest of the list's).
  What was released is told to every check (:meth:`StreamCheck.released`), so a check
  can judge text that began before what is held. An answer that was not streamed is fed
  once, whole, with ``final`` true: the same checks, run the same way.
- **returns** a :class:`~chainrun.checks.holdback.WindowVerdict`: **release** (``ok``,
  nothing else), **hold** (``hold_from``: nothing from this offset is released yet),
  **drop** or **replace** spans (``redactions``: a drop is an empty replacement),
  **block** (``ok`` false with a ``reason``: the stream is closed and the turn refused
  or answered the check's text, :meth:`StreamCheck.on_block`), or **stop** (``stop``:
  release what the verdict leaves, then end the answer there and close the model's
  stream: the call is cancelled, the turn goes on with the answer so far).
- **finished**: once the answer has ended (or was blocked or stopped),
  :meth:`StreamCheck.finish` gives the check's verdict for the log (a JSON object, the
  step's ``detail[NAME]`` and the turn's ``verdicts[STEP][NAME]``; None: nothing to
  log), with the stream's figures (:class:`StreamFigures`).

:class:`CheckList` runs a list of them as the engine's one check: in order, each on the
text as the ones before left it; the first block or stop ends the list's verdict.

A check of a shop's own is registered by name (:func:`register_check`) and listed in
the answer step's ``checks``; nothing else is needed for it to run on the stream.

Knows nothing of LLMs, HTTP or the chain: text in, verdicts out.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chainrun.checks.holdback import HoldBackStats, Redaction, WindowVerdict

__all__ = [
    "CheckList",
    "CheckMaker",
    "StreamCheck",
    "StreamFigures",
    "apply_redactions",
    "compose_redactions",
    "register_check",
    "registered_check",
    "registered_checks",
]


@dataclass(frozen=True)
class StreamFigures:
    """What a finished answer went through, for a check's :meth:`StreamCheck.finish`.

    Attributes:
        streamed: the answer was streamed (False: checked whole, once).
        window_tokens: the tokens the engine held back (the list's largest).
        stats: the engine's figures (None: not streamed).
        blocked_by: the name of the check that blocked the answer (None: none).
        stopped_by: the name of the check that stopped it (None: none).
        reason: the blocking or stopping check's reason.
        released_before_block_tokens: tokens the shopper had before a block.
        tokens_per_s: the stream's measured generation speed (None: unknown).
    """

    streamed: bool
    window_tokens: int = 0
    stats: HoldBackStats | None = None
    blocked_by: str | None = None
    stopped_by: str | None = None
    reason: str | None = None
    released_before_block_tokens: int | None = None
    tokens_per_s: float | None = None


class StreamCheck(abc.ABC):
    """One check of the answer step's answer, made fresh per answer (see the module
    text for what it is fed, what it returns and how it is finished)."""

    #: tokens this check needs held back before release (0: none beyond its ``hold_from``)
    window_tokens: int = 0

    @abc.abstractmethod
    async def check(self, text: str, final: bool) -> WindowVerdict:
        """The verdict on ``text``, the held text (``final``: the answer has ended)."""

    def released(self, piece: str) -> None:  # noqa: B027 - optional hook
        """``piece`` reached the shopper (after every check's redactions)."""

    def finish(self, figures: StreamFigures) -> dict[str, Any] | None:
        """The check's verdict for the log once the answer ended (None: nothing)."""
        return None

    def on_block(self) -> tuple[str | None, bool]:
        """What the shopper is told when this check blocked the answer: (the text, None
        for the chain's refusal; whether the turn counts as ``replaced`` rather than
        ``refused``)."""
        return None, False

    def replacement_texts(self) -> tuple[str, ...]:
        """The texts this check writes in place of the model's (a safe text): an answer
        that starts with one starts with the check's words, not the model's."""
        return ()


#: makes a fresh check for one answer from the turn-state values (field name -> value)
CheckMaker = Callable[[Mapping[str, Any]], StreamCheck]

_REGISTRY: dict[str, CheckMaker] = {}


def register_check(name: str, make: CheckMaker) -> CheckMaker:
    """Register ``make`` under ``name``: an answer step whose ``checks`` list the name
    runs ``make(turn values)`` on each answer. Registering a name again replaces it.

    Raises:
        ValueError: ``name`` is empty or not a word of letters, digits, ``_`` or ``-``.
    """
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"a check's name is a word (letters, digits, _ or -), got {name!r}")
    _REGISTRY[name] = make
    return make


def registered_check(name: str) -> CheckMaker | None:
    """The maker registered under ``name`` (None: none)."""
    return _REGISTRY.get(name)


def registered_checks() -> list[str]:
    """The registered names, sorted."""
    return sorted(_REGISTRY)


def apply_redactions(text: str, redactions: Sequence[Redaction]) -> str:
    """``text`` with non-overlapping ``redactions`` (offsets into it) applied."""
    for r in sorted(redactions, key=lambda r: r.start, reverse=True):
        text = text[: r.start] + r.replacement + text[r.end :]
    return text


def compose_redactions(
    text: str, first: Sequence[Redaction], then: Sequence[Redaction]
) -> list[Redaction]:
    """One set of redactions on ``text`` that does what ``first`` (offsets into
    ``text``) and then ``then`` (offsets into ``text`` with ``first`` applied) do.

    A redaction of ``then`` that touches a replacement of ``first`` is widened to
    cover that replacement whole (its text kept around ``then``'s replacement); one of
    ``first`` inside it is swallowed."""
    if not first:
        return sorted(then, key=lambda r: r.start)
    firsts = sorted(first, key=lambda r: r.start)
    redacted = apply_redactions(text, firsts)
    # pieces of the redacted text: (new start, new end, original start, original end, copied)
    pieces: list[tuple[int, int, int, int, bool]] = []
    pos = new = 0
    for r in firsts:
        if r.start > pos:
            pieces.append((new, new + r.start - pos, pos, r.start, True))
            new += r.start - pos
        pieces.append((new, new + len(r.replacement), r.start, r.end, False))
        new += len(r.replacement)
        pos = r.end
    pieces.append((new, new + len(text) - pos, pos, len(text), True))

    def at(p: int, side: str) -> tuple[int, int]:
        """(original offset, widened offset in the redacted text) of boundary ``p``:
        the smallest for a start, the largest for an end."""
        found: list[tuple[int, int]] = []
        for ns, ne, os_, oe, copied in pieces:
            if not ns <= p <= ne:
                continue
            if copied:
                found.append((os_ + p - ns, p))
            elif side == "start":
                found.append((os_, ns))
            else:
                found.append((oe, ne))
        return min(found) if side == "start" else max(found)

    out: list[Redaction] = []
    for r in sorted(then, key=lambda r: r.start):
        o_s, w_s = at(r.start, "start")
        o_e, w_e = at(r.end, "end")
        out.append(Redaction(o_s, o_e, redacted[w_s : r.start] + r.replacement
                             + redacted[r.end : w_e]))  # fmt: skip
    kept = [f for f in firsts
            if not any(o.start <= f.start and f.end <= o.end for o in out)]  # fmt: skip
    return sorted([*kept, *out], key=lambda r: (r.start, r.end))


def _shifted(offset: int, redactions: Sequence[Redaction]) -> int:
    """``offset`` of a text moved to the same place once ``redactions`` are applied (an
    offset inside a redacted span: the span's start)."""
    shift = 0
    for r in sorted(redactions, key=lambda r: r.start):
        if r.end <= offset:
            shift += len(r.replacement) - (r.end - r.start)
        elif r.start < offset:
            return r.start + shift
        else:
            break
    return offset + shift


class CheckList:
    """The answer's checks (``(name, check)`` in order) as the hold-back engine's one
    streaming check: each sees the held text as the checks before it left it; the
    verdict's redactions are theirs composed (offsets into the held text), its
    ``hold_from`` the earliest any asked for; the first block or stop ends it (the
    checks after it do not run)."""

    streaming = True

    def __init__(self, checks: Sequence[tuple[str, StreamCheck]]) -> None:
        self.checks = list(checks)
        #: the tokens held back: the largest any check asks for
        self.window_tokens = max((c.window_tokens for _, c in self.checks), default=0)
        #: the name of the check that blocked (None: none did)
        self.blocked_by: str | None = None
        #: the name of the check that stopped the answer (None: none did)
        self.stopped_by: str | None = None
        self.reason: str | None = None

    def released(self, piece: str) -> None:
        for _, check in self.checks:
            check.released(piece)

    async def __call__(self, text: str, final: bool = False) -> WindowVerdict:
        current = text
        redactions: list[Redaction] = []
        holds: list[int] = []  # offsets of ``current``
        reasons: list[str] = []
        stop = False
        for name, check in self.checks:
            verdict = await check.check(current, final)
            if not verdict.ok:
                self.blocked_by, self.reason = name, verdict.reason
                return verdict
            if verdict.redactions:
                holds = [_shifted(h, verdict.redactions) for h in holds]
                redactions = compose_redactions(text, redactions, verdict.redactions)
                current = apply_redactions(current, verdict.redactions)
            if verdict.hold_from is not None:
                holds.append(verdict.hold_from)
            if verdict.reason:
                reasons.append(verdict.reason)
            if verdict.stop:
                self.stopped_by, self.reason, stop = name, verdict.reason, True
                break
        return WindowVerdict(True, "; ".join(reasons) or None, tuple(redactions),
                             min(holds) if holds and not stop else None, stop=stop)  # fmt: skip

    def on_block(self) -> tuple[str | None, bool]:
        """What the shopper is told of a blocked answer: the blocking check's
        :meth:`StreamCheck.on_block` (none blocked: the chain's refusal)."""
        for name, check in self.checks:
            if name == self.blocked_by:
                return check.on_block()
        return None, False

    def replacement_texts(self) -> tuple[str, ...]:
        """Every check's :meth:`StreamCheck.replacement_texts`."""
        return tuple(t for _, check in self.checks for t in check.replacement_texts())

    def figures(
        self, stats: HoldBackStats | None, *, blocked_tokens: int | None = None,
        tokens_per_s: float | None = None,
    ) -> StreamFigures:  # fmt: skip
        """The figures each check's :meth:`StreamCheck.finish` is given."""
        return StreamFigures(
            streamed=stats is not None, window_tokens=self.window_tokens, stats=stats,
            blocked_by=self.blocked_by, stopped_by=self.stopped_by, reason=self.reason,
            released_before_block_tokens=blocked_tokens, tokens_per_s=tokens_per_s,
        )  # fmt: skip

    def finish(self, figures: StreamFigures) -> dict[str, dict[str, Any]]:
        """Each check's verdict for the log, by name (the checks with one)."""
        out = {}
        for name, check in self.checks:
            doc = check.finish(figures)
            if doc is not None:
                out[name] = doc
        return out
