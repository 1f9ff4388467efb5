"""The loop check: an answer that repeats itself is stopped on the stream, not streamed
to its token cap.

A small model at low temperature can fall into a loop ("I'm a shop assistant. I'm a
shop assistant. ..." until ``max_output_tokens``). The check finds two marks of one:

- **a sentence said again**: a complete sentence of at least ``min_words`` words whose
  words (case and punctuation ignored) are those of an earlier sentence of the answer;
- **a cycle**: a block of words repeated whole, back to back ("shop shop shop ...",
  "and then and then ..."), over at least ``cycle_words`` words past its first copy
  (any block of up to ``max_period`` words). Lines that share most of their words
  (three rain jackets listed with their ids and prices) are no cycle: no line is
  repeated whole.

When it finds one, the answer ends there: the text before the sentence in which the
repetition begins is kept (whole sentences), the rest is dropped, and the model's stream
is closed (:attr:`~chainrun.checks.holdback.WindowVerdict.stop`: the HTTP call is
cancelled). An answer left empty is replaced by ``safe_text``. The verdict for the log
says what repeated and where the answer was cut.

While the open sentence could be becoming a repeat (its words so far begin an earlier
sentence, or its last words already repeat the words before them) it is held back, so
that the shopper does not read the start of a repeat; any other text passes at once.

The thresholds. The words are compared as the ``no-repeat`` eval assertion compares them
(``\\w+``, lower case; a sentence of 3 words or more said twice), so an answer this
check lets through also passes that assertion's sentence rule. Both follow the DRY
("Don't Repeat Yourself") sampler's defaults (p-e-w, text-generation-webui pull request
5677, as llama.cpp's ``dry_allowed_length`` documents it): a repeat of up to 2 tokens is
natural and allowed, a longer one is penalised by ``multiplier · base^(n − 2)`` with the
recommended multiplier 0.8 and base 1.75. A repeated sentence of 3 words is the first
repeat DRY penalises; a cycle of 8 repeated words is one DRY would subtract ``0.8 ·
1.75^6 ≈ 23`` from the logit of, i.e. one no sampler with DRY on lets through: text
that long repeated back to back is a loop, not prose.

Knows nothing of LLMs or HTTP: text in, verdicts out.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Literal

from chainrun.checks.facts import segments
from chainrun.checks.holdback import Redaction, WindowVerdict
from chainrun.checks.stream import StreamCheck, StreamFigures

__all__ = ["DEFAULT_LOOP_TEXT", "LoopCheck", "Repeat", "find_repeat"]

#: what the shopper is told when the answer repeated itself from its first sentence
DEFAULT_LOOP_TEXT = "Sorry, I could not put that answer together. Could you ask me again?"

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Repeat:
    """A repetition found in an answer.

    Attributes:
        kind: ``sentence`` (a sentence said again) or ``cycle`` (words repeated back to
            back).
        text: the repeated sentence, or one copy of the repeated block.
        start: offset where the repetition begins (the second copy).
        cut: offset where the answer is cut: the start of the sentence ``start`` is in.
        copies: how many copies were seen (a cycle: whole and partial copies).
    """

    kind: Literal["sentence", "cycle"]
    text: str
    start: int
    cut: int
    copies: int

    def reason(self) -> str:
        """One line for the log."""
        said = " ".join(self.text.split())
        said = said if len(said) <= 60 else said[:59] + "…"
        if self.kind == "sentence":
            return f"loop: {said!r} said again"
        return f"loop: {said!r} repeated back to back ({self.copies} copies)"


def _words(text: str, start: int = 0) -> list[tuple[str, int, int]]:
    """The words of ``text`` (``\\w+``, lower case) with their start and end offsets
    (+ ``start``)."""
    return [(m.group(0).lower(), start + m.start(), start + m.end())
            for m in _WORD.finditer(text)]  # fmt: skip


class CycleFinder:
    """Back-to-back repetitions in a word stream, found as words are added: for each
    period p (1 ... ``max_period`` words), how many words in a row so far equal the
    word p before them (O(``max_period``) per word).

    Args:
        max_period: the longest repeated block looked for, in words.
        cycle_words: the run (words equal to the word a period before, past the first
            copy) that makes a loop.
    """

    def __init__(self, max_period: int, cycle_words: int) -> None:
        self.max_period = max_period
        self.cycle_words = cycle_words
        self.words: list[str] = []
        self._runs: list[list[int]] = []  # per word: the run for each period (index p - 1)

    def rewind(self, n: int) -> None:
        """Forget the words from index ``n`` on (they changed)."""
        del self.words[n:]
        del self._runs[n:]

    def add(self, word: str) -> tuple[int, int] | None:
        """Add ``word``; (period, run) when a run reaches ``cycle_words`` and a whole
        period at it (the block was repeated whole; the shortest such period), else
        None."""
        i = len(self.words)
        self.words.append(word)
        prev = self._runs[-1] if self._runs else []
        row = []
        hit: tuple[int, int] | None = None
        for p in range(1, min(self.max_period, i) + 1):
            run = (prev[p - 1] + 1 if p <= len(prev) else 1) if self.words[i - p] == word else 0
            row.append(run)
            if hit is None and run >= max(self.cycle_words, p):
                hit = (p, run)
        self._runs.append(row)
        return hit

    def last_run(self) -> int:
        """The longest run ending at the last word (0: none)."""
        return max(self._runs[-1], default=0) if self._runs else 0


def _cycle_repeat(
    text: str, words: list[tuple[str, int, int]], end: int, period: int, run: int
) -> Repeat:
    """The cycle whose run of ``run`` words at period ``period`` ends at word ``end``."""
    second = end - run + 1
    first = second - period
    at = words[second][1]
    cut = next((s for s, e, _ in segments(text) if s <= at < e), at)
    return Repeat("cycle", text[words[first][1] : at], at, cut, 1 + run // period)


def _sentence_repeat(
    text: str, min_words: int, final: bool, since: int
) -> Repeat | None:
    """The first complete sentence of at least ``min_words`` words said again that
    ends after ``since`` (``final``: the last sentence is complete too)."""
    seen: set[tuple[str, ...]] = set()
    for start, end, complete in segments(text):
        if not (complete or final):
            break
        said = tuple(_WORD.findall(text[start:end].lower()))
        if len(said) >= min_words and said in seen and end > since:
            return Repeat("sentence", text[start:end].strip(), start, start, 2)
        seen.add(said)
    return None


def find_repeat(
    text: str, *, min_words: int = 3, cycle_words: int = 8, max_period: int = 64
) -> Repeat | None:
    """The first repetition in the whole answer ``text`` (see the module text), or
    None: a sentence said again, else the first back-to-back cycle."""
    found = _sentence_repeat(text, min_words, True, 0)
    if found is not None:
        return found
    words = _words(text)
    cycles = CycleFinder(max_period, cycle_words)
    for i, (word, _, _) in enumerate(words):
        hit = cycles.add(word)
        if hit is not None:
            return _cycle_repeat(text, words, i, *hit)
    return None


class LoopCheck(StreamCheck):
    """The loop check of one answer (see the module text).

    Args:
        min_words: a sentence of at least this many words said again is a loop.
        cycle_words: words repeated back to back, past their first copy, that make a
            loop.
        max_period: the longest block of words (in words) a cycle is looked for with.
        safe_text: the answer when nothing was left before the repetition.

    Attributes:
        repeat: the repetition found (None: none).
        check_us: CPU time of each call, in µs (``time.thread_time_ns``).
    """

    def __init__(
        self, *, min_words: int = 3, cycle_words: int = 8, max_period: int = 64,
        safe_text: str = DEFAULT_LOOP_TEXT,
    ) -> None:  # fmt: skip
        self.min_words = min_words
        self.cycle_words = cycle_words
        self.max_period = max_period
        self.safe_text = safe_text
        self.repeat: Repeat | None = None
        self.kept_chars: int | None = None
        self.replaced = False
        self.check_us: list[float] = []
        self._released = ""  # what reached the shopper
        # what never changes again, kept between calls (each call costs what is held):
        self._mark = 0  # the end of the last complete sentence wholly released
        self._seen: set[tuple[str, ...]] = set()  # those sentences' words
        self._prefixes: set[tuple[str, ...]] = set()  # the starts of those of min_words+
        self._cycles = CycleFinder(max_period, cycle_words)
        #: the words fed to ``_cycles``, with their offsets in the answer
        self._fed: list[tuple[str, int, int]] = []

    def released(self, piece: str) -> None:
        self._released += piece

    async def check(self, text: str, final: bool) -> WindowVerdict:
        t0 = time.thread_time_ns()
        try:
            return self._check(text, final)
        finally:
            self.check_us.append((time.thread_time_ns() - t0) / 1000.0)

    def _remember(self, said: tuple[str, ...], into: set[tuple[str, ...]],
                  prefixes: set[tuple[str, ...]]) -> None:  # fmt: skip
        into.add(said)
        if len(said) >= self.min_words:
            prefixes.update(said[:k] for k in range(1, len(said) + 1))

    def _check(self, text: str, final: bool) -> WindowVerdict:
        base = len(self._released)
        full = self._released + text
        mark = self._mark
        seen_now: set[tuple[str, ...]] = set()  # sentences not wholly released yet
        prefixes_now: set[tuple[str, ...]] = set()
        found: Repeat | None = None
        open_start: int | None = None
        for s, e, complete in segments(full[mark:]):
            start, end = s + mark, e + mark
            if not (complete or final):
                open_start = start
                break
            said = tuple(_WORD.findall(full[start:end].lower()))
            again = len(said) >= self.min_words and (said in self._seen or said in seen_now)
            if again and end > base:
                found = Repeat("sentence", full[start:end].strip(), start, start, 2)
                break
            if complete and end <= base and start == self._mark:
                self._remember(said, self._seen, self._prefixes)
                self._mark = end
            else:
                self._remember(said, seen_now, prefixes_now)
        if found is None:
            found = self._cycle(full, final, base)
        if found is not None:
            self.repeat = found
            cut = max(found.cut, base) - base
            kept = full[: base + cut]
            replacement = ""
            if not kept.strip():
                replacement, self.replaced = self.safe_text, True
            self.kept_chars = 0 if self.replaced else len(kept.rstrip())
            return WindowVerdict(True, found.reason(),
                                 (Redaction(cut, len(text), replacement),), stop=True)  # fmt: skip
        if final or open_start is None:
            return WindowVerdict(True)
        # the open sentence is held while it is white space alone, begins an earlier
        # sentence, or its last words repeat the ones before them
        open_words = tuple(_WORD.findall(full[open_start:].lower()))
        hold = (not open_words or self._cycles.last_run() >= 2
                or open_words in self._prefixes or open_words in prefixes_now)  # fmt: skip
        return WindowVerdict(True, hold_from=max(open_start, base) - base if hold else None)

    def _cycle(self, full: str, final: bool, base: int) -> Repeat | None:
        """A cycle among the answer's words, fed to the finder as they come: the words
        wholly released are kept; the held ones are read again (an earlier check may
        have changed them) and fed again from the first that changed."""
        fed = self._fed
        stable = len(fed)
        while stable and fed[stable - 1][2] >= base:
            stable -= 1  # a word that reaches the held text may change
        start = fed[stable - 1][2] if stable else 0
        words = _words(full[start:], start)
        if words and not final and words[-1][2] == len(full):
            words = words[:-1]  # the last word may still be written
        same = 0
        while same < min(len(words), len(fed) - stable) and words[same] == fed[stable + same]:
            same += 1
        self._cycles.rewind(stable + same)
        del fed[stable + same :]
        for i in range(same, len(words)):
            fed.append(words[i])
            hit = self._cycles.add(words[i][0])
            if hit is not None:
                return _cycle_repeat(full, fed, len(fed) - 1, *hit)
        return None

    def replacement_texts(self) -> tuple[str, ...]:
        return (self.safe_text,)

    def finish(self, figures: StreamFigures) -> dict[str, Any] | None:
        """``{status: "stopped", kind, repeated, reason, copies, kept_chars, replaced,
        streamed, tokens_in, tokens_dropped, call_cancelled, checks, cpu_us_max}`` when
        the answer looped; None otherwise (nothing to log)."""
        rep = self.repeat
        if rep is None:
            return None
        stats = figures.stats
        cpu = max(self.check_us, default=0.0)
        return {
            "status": "stopped", "kind": rep.kind, "repeated": rep.text[:200],
            "reason": rep.reason(), "copies": rep.copies, "kept_chars": self.kept_chars,
            "replaced": self.replaced, "streamed": figures.streamed,
            "tokens_in": stats.tokens_in if stats is not None else None,
            "tokens_dropped": stats.tokens_dropped if stats is not None else None,
            # a streamed answer's model call was closed here, before its end
            "call_cancelled": figures.streamed and figures.stopped_by is not None,
            "checks": len(self.check_us), "cpu_us_max": round(cpu, 1),
        }  # fmt: skip
