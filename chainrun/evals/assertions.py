"""Eval assertions: what one logged turn must satisfy, and the verdict of checking it.

Types are named like promptfoo's where the meaning is the same (``equals``,
``contains``, ``icontains``, ``not-contains``, ``not-icontains``, ``regex``,
``is-json``, ``contains-json``, ``latency``, ``llm-rubric``); chainrun adds
``json-schema``, ``catalog-ids``, ``grounded``, ``tool-called`` (the turn's tool calls
and their arguments) and ``max-tokens``, and the marks of a usable answer:
``names-product`` (it names products the turn showed), ``no-repeat`` (no sentence said
twice, no phrase looping) and ``whole-sentences`` (no check's text inside a sentence, no
answer cut mid-sentence). An assertion that would pass saying nothing
fails instead: ``catalog-ids`` within what was retrieved, when nothing was.

Every assertion has ``type`` and an optional ``step`` saying what it looks at:

- omitted: the turn's final answer (``turns.output``), or for ``latency`` / ``max-tokens``
  the whole turn;
- a step name (``classify``, ``compose``, ``validate``...): that step's output
  (``steps.output``), duration or output tokens;
- ``"label"``: the label the chain parsed from classify's output (``turns.label``),
  which is what ``equals`` on a classification should usually check;
- ``"prose"``: the answer's sentence before the facts chainrun rendered from data after
  it (the answer step's ``facts``; the whole answer when it rendered none): the lead
  chainrun wrote, if any, and the model's words that continue it, what says whether
  the sentence fits the question (``whole-sentences`` fails a model text that does not
  continue its lead).

Checking returns a :class:`Verdict`. ``llm-rubric`` needs an async grader
``grade(prompt) -> str`` (injected so that tests need no model) and records the
pinned grader configuration with its verdict.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from chainrun.answer_json import check_schema, find_json_values, parse_json_output, schema_errors
from chainrun.checks.config import DEFAULT_SAFE_TEXT
from chainrun.config import GraderConfig

#: An async grading call: prompt in, the grader model's reply out.
Grade = Callable[[str], Awaitable[str]]

#: ``step`` value meaning the chain's parsed classify label (``turns.label``).
LABEL = "label"
#: ``step`` value meaning the model's own part of the answer (:attr:`TurnView.prose`).
PROSE = "prose"


@dataclass(frozen=True)
class Verdict:
    """The result of one assertion on one turn.

    ``passed`` is None when the assertion was *skipped* (no verdict could be given:
    ``llm-rubric`` without a grader, or with a grader reply that is not understood);
    ``detail`` then says why. ``step`` is None for the final answer / whole turn.
    ``grader`` is the grader configuration an ``llm-rubric`` verdict was given under
    (None otherwise).
    """

    type: str
    step: str | None
    passed: bool | None
    detail: str
    grader: dict[str, Any] | None = None

    @property
    def skipped(self) -> bool:
        """True when no verdict was given (``passed`` is None)."""
        return self.passed is None


@dataclass(frozen=True)
class TurnView:
    """What assertions look at, gathered from one logged turn (see ``scoring.turn_view``).

    Times in ms. ``output_tokens`` holds the winning attempt's count per LLM step
    (None = unknown: the provider did not report usage).
    """

    message: str
    answer: str | None = None
    label: str | None = None
    outputs: Mapping[str, str | None] = field(default_factory=dict)
    step_ms: Mapping[str, float | None] = field(default_factory=dict)
    turn_ms: float | None = None
    output_tokens: Mapping[str, int | None] = field(default_factory=dict)
    catalog_ids: frozenset[str] | None = None
    #: the answer step's grounding record (its row's ``detail["grounding"]``: claims
    #: checked, the ungrounded ones and why); None: the check did not run
    grounding: Mapping[str, Any] | None = None
    #: the turn's tool calls (``tool_calls`` rows: tool, arguments, status), in order
    tool_calls: tuple[Any, ...] = ()
    #: the answer's sentence before its facts (None: the same as ``answer``)
    prose: str | None = None
    #: the words chainrun started the answer with for the model to continue (the answer
    #: step's ``facts.lead``, filled); None: none
    lead: str | None = None
    #: the products the turn's search showed (``ShownProduct.as_json`` objects, in
    #: order); None: no search ran
    shown_products: tuple[Mapping[str, Any], ...] | None = None


def _where(step: str | None) -> str:
    if step is None:
        return "the answer"
    if step == LABEL:
        return "the label"
    if step == PROSE:
        return "the model's prose"
    return f"step {step}"


def _has(step: str | None, found: bool, value: str) -> str:
    return f"{_where(step)} {'contains' if found else 'lacks'} {value!r}"


def _short(text: str, limit: int = 80) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


# -- the assertion types ---------------------------------------------------------------


def _compiles(pattern: str) -> str:
    """``pattern`` if it is a valid regular expression (a pydantic validator body).

    Raises:
        ValueError: naming the regex error.
    """
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid regular expression ({e})") from None
    return pattern


class _Assertion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the assertion type's name (each subclass narrows it to one literal)
    type: str
    #: what to look at: None = the final answer / whole turn; a step name; or "label"
    step: str | None = None

    def verdict(
        self, passed: bool | None, detail: str, grader: dict[str, Any] | None = None
    ) -> Verdict:
        return Verdict(self.type, self.step, passed, detail, grader)

    @abc.abstractmethod
    def check(self, view: TurnView) -> Verdict:
        """Check one turn (synchronous; ``llm-rubric`` needs :meth:`evaluate`)."""

    async def evaluate(self, view: TurnView, grade: Grade | None = None) -> Verdict:
        """Check one turn (a skipped verdict when it cannot be run: llm-rubric, no grader)."""
        return self.check(view)

    def text_of(self, view: TurnView) -> str | None:
        if self.step is None:
            return view.answer
        if self.step == LABEL:
            return view.label
        if self.step == PROSE:
            return view.prose if view.prose is not None else view.answer
        return view.outputs.get(self.step)

    def missing(self) -> Verdict:
        return self.verdict(False, f"{_where(self.step)} has no output")


class _TextAssertion(_Assertion):
    def check(self, view: TurnView) -> Verdict:
        text = self.text_of(view)
        if text is None:
            return self.missing()
        return self.check_text(text)

    @abc.abstractmethod
    def check_text(self, text: str) -> Verdict:
        """Check the text the assertion looks at (never None here)."""


class Equals(_TextAssertion):
    """The text equals ``value`` (surrounding whitespace ignored; ``ignore_case`` optional)."""

    type: Literal["equals"] = "equals"
    value: str
    ignore_case: bool = False

    def check_text(self, text: str) -> Verdict:
        got, want = text.strip(), self.value.strip()
        if self.ignore_case:
            ok = got.casefold() == want.casefold()
        else:
            ok = got == want
        return self.verdict(ok, f"{_where(self.step)} is {_short(got)!r}, expected {want!r}")


class Contains(_TextAssertion):
    """The text contains ``value`` (case-sensitive)."""

    type: Literal["contains"] = "contains"
    value: str

    def check_text(self, text: str) -> Verdict:
        ok = self.value in text
        return self.verdict(ok, _has(self.step, ok, self.value))


class IContains(_TextAssertion):
    """The text contains ``value``, ignoring case."""

    type: Literal["icontains"] = "icontains"
    value: str

    def check_text(self, text: str) -> Verdict:
        ok = self.value.casefold() in text.casefold()
        return self.verdict(ok, _has(self.step, ok, self.value))


class NotContains(_TextAssertion):
    """The text does not contain ``value`` (case-sensitive)."""

    type: Literal["not-contains"] = "not-contains"
    value: str

    def check_text(self, text: str) -> Verdict:
        ok = self.value not in text
        return self.verdict(ok, _has(self.step, not ok, self.value))


class NotIContains(_TextAssertion):
    """The text does not contain ``value``, ignoring case."""

    type: Literal["not-icontains"] = "not-icontains"
    value: str

    def check_text(self, text: str) -> Verdict:
        ok = self.value.casefold() not in text.casefold()
        return self.verdict(ok, _has(self.step, not ok, self.value))


_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


class Regex(_TextAssertion):
    """Python ``re.search(value, text)`` finds a match; ``flags`` from ``"imsx"``."""

    type: Literal["regex"] = "regex"
    value: str
    flags: str = ""

    @field_validator("flags")
    @classmethod
    def _flags(cls, v: str) -> str:
        bad = set(v) - set(_FLAGS)
        if bad:
            raise ValueError(f"unknown regex flag {sorted(bad)[0]!r}; expected some of 'imsx'")
        return v

    @field_validator("value")
    @classmethod
    def _pattern(cls, v: str) -> str:
        return _compiles(v)

    def check_text(self, text: str) -> Verdict:
        flags = 0
        for f in self.flags:
            flags |= _FLAGS[f]
        m = re.search(self.value, text, flags)
        detail = f"/{self.value}/{self.flags} " + (
            f"matched {_short(m.group(0), 40)!r}" if m else f"no match in {_short(text)!r}"
        )
        return self.verdict(m is not None, detail)


class _SchemaMixin(_TextAssertion):
    @field_validator("value", check_fields=False)
    @classmethod
    def _schema(cls, v: Any) -> Any:
        if v is not None:
            check_schema(v)
        return v


class IsJson(_SchemaMixin):
    """The whole text is JSON (one code fence allowed); if ``value`` is a schema, it matches."""

    type: Literal["is-json"] = "is-json"
    value: dict[str, Any] | None = None

    def check_text(self, text: str) -> Verdict:
        ok, parsed = parse_json_output(text)
        if not ok:
            return self.verdict(False, f"{_where(self.step)} is not JSON: {_short(text)!r}")
        errs = schema_errors(parsed, self.value) if self.value is not None else []
        if errs:
            return self.verdict(False, "; ".join(errs[:3]))
        return self.verdict(True, "valid JSON" + (" matching the schema" if self.value else ""))


class ContainsJson(_SchemaMixin):
    """The text contains a JSON object or array (and, with ``value``, one matches the schema)."""

    type: Literal["contains-json"] = "contains-json"
    value: dict[str, Any] | None = None

    def check_text(self, text: str) -> Verdict:
        found = find_json_values(text)
        if not found:
            return self.verdict(False, f"no JSON in {_short(text)!r}")
        if self.value is None:
            return self.verdict(True, f"{len(found)} JSON value(s) found")
        errs: list[str] = []
        for v in found:
            errs = schema_errors(v, self.value)
            if not errs:
                return self.verdict(True, "embedded JSON matches the schema")
        return self.verdict(False, "no embedded JSON matches the schema: " + "; ".join(errs[:3]))


class JsonSchema(_SchemaMixin):
    """The text *is* JSON (as for ``is-json``) and matches the schema ``value`` (required).

    A stricter ``contains-json``: prose around the JSON fails, as the validate step's
    reply is meant to be JSON only (``{"ok": bool, "reason": str}``).
    """

    type: Literal["json-schema"] = "json-schema"
    value: dict[str, Any]

    def check_text(self, text: str) -> Verdict:
        ok, parsed = parse_json_output(text)
        if not ok:
            return self.verdict(False, f"{_where(self.step)} is not JSON: {_short(text)!r}")
        errs = schema_errors(parsed, self.value)
        if errs:
            return self.verdict(False, "; ".join(errs[:3]))
        return self.verdict(True, "JSON matches the schema")


#: Default shape of a product id in replies, that of the shipped catalogue (``JKT-001``):
#: 3 capitals, a dash, 3-5 digits. Order numbers such as ``FS-10293`` do not match.
DEFAULT_PRODUCT_ID = r"\b[A-Z]{3}-\d{3,5}\b"


class CatalogIds(_Assertion):
    """Every product id the text mentions (ids found by ``pattern``) is in the allowed set.

    The set is ``ids`` when given; else, with ``within = "retrieved"``, the ids the
    retrieve step returned for this turn (its output, a JSON list); else the catalogue's
    ids given to the scorer. ``min_ids`` requires at least that many mentions.
    """

    type: Literal["catalog-ids"] = "catalog-ids"
    ids: list[str] | None = None
    within: Literal["catalog", "retrieved"] = "catalog"
    pattern: str = DEFAULT_PRODUCT_ID
    min_ids: int = Field(default=0, ge=0)

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        return _compiles(v)

    def _allowed(self, view: TurnView) -> frozenset[str] | None:
        if self.ids is not None:
            return frozenset(self.ids)
        if self.within == "retrieved":
            raw = view.outputs.get("retrieve")
            ok, parsed = parse_json_output(raw) if raw else (False, None)
            if ok and isinstance(parsed, list):
                return frozenset(str(x) for x in parsed)
            return frozenset()
        return view.catalog_ids

    def vacuous(self, view: TurnView, allowed: frozenset[str]) -> str | None:
        """Why a pass would say nothing (None: it would not): ``within = "retrieved"``
        and nothing was retrieved, so no mention could be checked against anything."""
        if self.within == "retrieved" and self.ids is None and not allowed:
            return "nothing was retrieved: there is nothing to check the answer's ids against"
        return None

    def check(self, view: TurnView) -> Verdict:
        text = self.text_of(view)
        if text is None:
            return self.missing()
        allowed = self._allowed(view)
        if allowed is None:
            return self.verdict(False, "no catalogue ids given to the scorer (and no ids)")
        empty = self.vacuous(view, allowed)
        if empty is not None:
            return self.verdict(False, empty)
        mentioned = list(dict.fromkeys(re.findall(self.pattern, text)))
        unknown = [m for m in mentioned if m not in allowed]
        if unknown:
            return self.verdict(False, f"unknown product id(s): {', '.join(unknown[:5])}")
        if len(mentioned) < self.min_ids:
            return self.verdict(
                False, f"mentions {len(mentioned)} product id(s), expected ≥ {self.min_ids}"
            )
        return self.verdict(True, f"{len(mentioned)} product id(s), all known")


class Grounded(_Assertion):
    """The answer the model wrote stated no ungrounded claim: the answer step's
    grounding check (:mod:`chainrun.checks.grounding`) found every product id, title,
    price, stock claim and policy figure in the turn's own sources. It fails on a turn
    whose check corrected or dropped a claim too (the shopper was kept from it, the
    model still said it), and when the check did not run (no record to judge by)."""

    type: Literal["grounded"] = "grounded"

    def check(self, view: TurnView) -> Verdict:
        g = view.grounding
        if g is None:
            return self.verdict(False, "no grounding record: the answer step's grounding "
                                "check did not run (steps.ANSWER.grounding)")  # fmt: skip
        bad = list(g.get("ungrounded") or [])
        if not bad:
            return self.verdict(True, f"{g.get('claims', 0)} claim(s), all grounded")
        first = "; ".join(f"{b.get('kind')} {_short(str(b.get('text')), 40)!r}: {b.get('why')}"
                          for b in bad[:3])  # fmt: skip
        return self.verdict(False, f"{len(bad)} ungrounded claim(s): {first}")


class ToolCalled(_Assertion):
    """The turn's model called ``tool`` (with ``arguments`` among its arguments, when
    given: each key with that value) at least ``min_times`` and at most ``max_times``
    times, each such call with ``status`` (default ``ok``: it ran and returned). With
    ``max_times = 0`` it asserts the tool was not called (e.g. no action in a replay)."""

    type: Literal["tool-called"] = "tool-called"
    tool: str = Field(min_length=1)
    arguments: dict[str, Any] | None = None
    status: str | None = "ok"
    min_times: int = Field(default=1, ge=0)
    max_times: int | None = Field(default=None, ge=0)

    def _matches(self, call: Any) -> bool:
        if call.tool != self.tool or (self.status is not None and call.status != self.status):
            return False
        if self.arguments is None:
            return True
        try:
            given = json.loads(call.arguments or "{}")
        except ValueError:
            return False
        return isinstance(given, dict) and all(given.get(k) == v
                                               for k, v in self.arguments.items())

    def check(self, view: TurnView) -> Verdict:
        n = sum(1 for c in view.tool_calls if self._matches(c))
        what = self.tool + (f" with {json.dumps(self.arguments)}" if self.arguments else "")
        called = ", ".join(f"{c.tool}({c.status})" for c in view.tool_calls) or "no tool"
        if n < self.min_times:
            return self.verdict(False, f"{what} called {n} time(s), expected ≥ {self.min_times}"
                                f" (the turn called: {called})")  # fmt: skip
        if self.max_times is not None and n > self.max_times:
            return self.verdict(False, f"{what} called {n} time(s), expected ≤ {self.max_times}")
        return self.verdict(True, f"{what} called {n} time(s)")


class Latency(_Assertion):
    """The step's duration (or the turn's, without ``step``) is at most ``threshold`` ms."""

    type: Literal["latency"] = "latency"
    threshold: float = Field(gt=0)

    def check(self, view: TurnView) -> Verdict:
        ms = view.turn_ms if self.step is None else view.step_ms.get(self.step)
        if ms is None:
            return self.verdict(False, f"no duration recorded for {_where(self.step)}")
        ok = ms <= self.threshold
        where = "turn" if self.step is None else self.step
        return self.verdict(ok, f"{where} took {ms:.0f} ms (max {self.threshold:.0f})")


class MaxTokens(_Assertion):
    """The step's winning call generated at most ``threshold`` output tokens.

    Without ``step``: the sum over the turn's LLM steps. Unknown counts (no usage
    reported) fail, since the bound cannot be shown to hold.
    """

    type: Literal["max-tokens"] = "max-tokens"
    threshold: int = Field(ge=0)

    def check(self, view: TurnView) -> Verdict:
        if self.step is None:
            counts = list(view.output_tokens.values())
            n = None if not counts or None in counts else sum(c for c in counts if c is not None)
        else:
            n = view.output_tokens.get(self.step)
        where = "turn" if self.step is None else self.step
        if n is None:
            return self.verdict(False, f"output tokens of {where} unknown")
        ok = n <= self.threshold
        return self.verdict(ok, f"{where}: {n} output tokens (max {self.threshold})")


RUBRIC_PROMPT = (
    "You grade replies of an online fashion shop's chat assistant.\n"
    "Shopper: {message}\n"
    "Reply: {output}\n"
    "Rubric: {rubric}\n\n"
    'Does the reply satisfy the rubric? Answer only with JSON: {{"pass": true or false, '
    '"reason": "a few words"}}'
)


def parse_grade(reply: str) -> tuple[bool, str] | None:
    """The grader's verdict from its reply: a JSON object with a boolean ``pass`` (promptfoo's
    format), else a reply starting with yes/no/pass/fail; None when neither is found."""
    for value in find_json_values(reply):
        if isinstance(value, dict) and isinstance(value.get("pass"), bool):
            return value["pass"], str(value.get("reason", ""))
    m = re.match(r"\W*(yes|no|pass|fail|true|false)\b", reply.strip(), re.I)
    if m:
        return m.group(1).lower() in ("yes", "pass", "true"), _short(reply)
    return None


#: Why an ``llm-rubric`` is skipped, and how to give it a grader (shown by ``chainrun eval``).
GRADER_HOWTO = (
    'set a chat model as grader in chainrun.toml: [grader] provider = "NAME" '
    'model = "MODEL" (docs/guides/evals.md: the grader)'
)


class LlmRubric(_Assertion):
    """A grader model judges the text against the rubric ``value``.

    Needs an injected ``grade``; without one, or when the grader's reply is in no
    recognisable form, the verdict is *skipped* (``passed`` None, the reason in
    ``detail``): the grader failed, not the answer, so an unusable grader can neither
    pass nor fail a chain.
    """

    type: Literal["llm-rubric"] = "llm-rubric"
    value: str = Field(min_length=1)

    def check(self, view: TurnView) -> Verdict:
        raise TypeError("llm-rubric needs a grader: use `await evaluate(view, grade)`")

    async def evaluate(
        self,
        view: TurnView,
        grade: Grade | None = None,
        grader: GraderConfig | None = None,
    ) -> Verdict:
        """Grade one turn (skipped without a grader or when its reply is not understood).

        Raises whatever ``grade`` raises (e.g. a ProviderError)."""
        if grade is None:
            return self.verdict(None, f"no grader configured; {GRADER_HOWTO}")
        config = (grader or GraderConfig()).model_dump()
        text = self.text_of(view)
        if text is None:
            return self.verdict(False, f"{_where(self.step)} has no output", config)
        prompt = RUBRIC_PROMPT.format(message=view.message, output=text, rubric=self.value)
        reply = await grade(prompt)
        parsed = parse_grade(reply)
        if parsed is None:
            return self.verdict(
                None,
                f"the grader ({config['provider']} {config['model']}) gave no pass/fail the "
                f"scorer could read (reply {_short(reply, 40)!r}); {GRADER_HOWTO}",
                config,
            )
        ok, reason = parsed
        return self.verdict(ok, reason or ("pass" if ok else "fail"), config)



# -- the marks of a usable answer ----------------------------------------------------------

#: A sentence's end: terminal punctuation (closing quotes or brackets after it) before
#: white space, or a line break.
_SENTENCE_END = re.compile(r"""(?<=[.!?])["')\]]*\s+|\n+""")
#: Characters an answer may end with and still end a sentence (or a list line).
_ENDS_SENTENCE = tuple(".!?)\"'”’:;…") + tuple("0123456789")


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences (at terminal punctuation followed by white space, and
    at line breaks), each stripped; empty pieces dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class NamesProduct(_Assertion):
    """The answer names at least ``min`` of the products the turn's search showed (by id or
    by title, case ignored), counting only those in ``category`` and at most ``max_price``
    when given. It fails when the turn showed no such product: a pass must say that the
    shopper was pointed at a product that fits, never that nothing was there to name."""

    type: Literal["names-product"] = "names-product"
    min: int = Field(default=1, ge=1)
    category: str | None = None
    max_price: float | None = Field(default=None, ge=0)

    def check(self, view: TurnView) -> Verdict:
        text = self.text_of(view)
        if text is None:
            return self.missing()
        shown = view.shown_products
        if shown is None:
            return self.verdict(False, "no search ran: the turn showed no products")
        fits = [p for p in shown
                if (self.category is None or str(p.get("category", "")).lower()
                    == self.category.lower())
                and (self.max_price is None or float(p.get("price", 0)) <= self.max_price)]
        if not fits:
            return self.verdict(False, f"the turn showed {len(shown)} product(s), none "
                                f"{self._which()}")  # fmt: skip
        low = text.lower()
        named = [str(p["id"]) for p in fits
                 if str(p["id"]).lower() in low or str(p.get("title", "")).lower() in low]
        if len(named) < self.min:
            return self.verdict(False, f"names {len(named)} of the {len(fits)} shown "
                                f"product(s) {self._which()}, expected ≥ {self.min}")  # fmt: skip
        return self.verdict(True, f"names {', '.join(named[:5])}")

    def _which(self) -> str:
        parts = []
        if self.category is not None:
            parts.append(f"in {self.category}")
        if self.max_price is not None:
            parts.append(f"at most {self.max_price:g}")
        return " ".join(parts) or "at all"


class NoRepeat(_Assertion):
    """No sentence of at least ``min_words`` words is said twice (case and punctuation
    ignored), and no run of ``ngram`` words comes back ``loops`` times or more (a loop
    that never ends a sentence): the marks of a small model repeating itself to its
    token cap."""

    type: Literal["no-repeat"] = "no-repeat"
    min_words: int = Field(default=3, ge=1)
    ngram: int = Field(default=6, ge=2)
    loops: int = Field(default=3, ge=2)

    def check(self, view: TurnView) -> Verdict:
        text = self.text_of(view)
        if text is None:
            return self.missing()
        seen: set[tuple[str, ...]] = set()
        for sentence in sentences(text):
            said = tuple(_words(sentence))
            if len(said) >= self.min_words and said in seen:
                return self.verdict(False, f"says {_short(sentence, 60)!r} twice")
            seen.add(said)
        words = _words(text)
        counts: dict[tuple[str, ...], int] = {}
        for i in range(len(words) - self.ngram + 1):
            gram = tuple(words[i : i + self.ngram])
            counts[gram] = counts.get(gram, 0) + 1
            if counts[gram] >= self.loops:
                return self.verdict(False, f"repeats {' '.join(gram)!r} "
                                    f"{counts[gram]} times")  # fmt: skip
        return self.verdict(True, "no sentence or phrase repeated")


class WholeSentences(_Assertion):
    """The shopper reads whole sentences: none of ``texts`` (chainrun's own texts that a
    check puts in place of what it stopped; by default the grounding check's safe text)
    starts inside a sentence, and the answer does not end cut mid-sentence (at the step's
    token cap: its last character is neither terminal punctuation nor a digit ending a
    list line), and the model's words continue the lead chainrun started the answer with
    (a capital letter straight after a lead that ends no sentence is a sentence of the
    model's own run into it: "Here are our rain jackets It's a camel.")."""

    type: Literal["whole-sentences"] = "whole-sentences"
    texts: list[str] | None = None

    def check(self, view: TurnView) -> Verdict:
        text = self.text_of(view)
        if text is None:
            return self.missing()
        for check_text in self.texts or (DEFAULT_SAFE_TEXT,):
            head = check_text.strip()[:40]
            at = text.find(head)
            while at > 0:
                before = text[:at].rstrip(" ")
                if before and not before.endswith((".", "!", "?", "\n", ":")):
                    return self.verdict(False, f"a check's text starts inside a sentence: "
                                        f"{_short(text[max(0, at - 40):at + 20], 60)!r}")
                at = text.find(head, at + 1)
        lead = (view.lead or "").strip()
        body = text.lstrip()
        if lead and body.startswith(lead) and not lead.endswith((".", "!", "?", ":")):
            rest = body[len(lead):].lstrip(" ")
            if rest[:1].isupper():
                return self.verdict(False, "the model's words do not continue the lead: "
                                    f"{_short(body[:len(lead) + 30], 70)!r}")
        end = text.rstrip()
        if end and not end.endswith(_ENDS_SENTENCE):
            return self.verdict(False, f"ends mid-sentence: {_short(end[-40:], 40)!r}")
        return self.verdict(True, "whole sentences")


Assertion = Annotated[
    Equals
    | Contains
    | IContains
    | NotContains
    | NotIContains
    | Regex
    | IsJson
    | ContainsJson
    | JsonSchema
    | CatalogIds
    | Grounded
    | ToolCalled
    | Latency
    | MaxTokens
    | LlmRubric
    | NamesProduct
    | NoRepeat
    | WholeSentences,
    Field(discriminator="type"),
]

_ADAPTER: TypeAdapter[Assertion] = TypeAdapter(Assertion)

#: Every assertion type name, as written in eval files.
ASSERTION_TYPES: tuple[str, ...] = (
    "equals", "contains", "icontains", "not-contains", "not-icontains", "regex", "is-json",
    "contains-json", "json-schema", "catalog-ids", "grounded", "tool-called", "latency",
    "max-tokens", "llm-rubric", "names-product", "no-repeat", "whole-sentences",
)  # fmt: skip


def parse_assertion(data: Mapping[str, Any]) -> Assertion:
    """Validate one assertion dict (``{"type": ..., ...}``).

    Raises:
        pydantic.ValidationError: unknown type, missing or bad field.
    """
    return _ADAPTER.validate_python(data)


async def evaluate(
    assertion: Assertion,
    view: TurnView,
    grade: Grade | None = None,
    grader: GraderConfig | None = None,
) -> Verdict:
    """Check ``assertion`` on ``view`` (``passed`` None when skipped: llm-rubric without a
    grader or with a grader reply not understood; ``detail`` says why)."""
    if isinstance(assertion, LlmRubric):
        return await assertion.evaluate(view, grade, grader)
    return assertion.check(view)
