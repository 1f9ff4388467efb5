"""Config models of the deterministic checks: ``[checks]`` on the shopper's message and
``[steps.ANSWER.output_check]`` on the answer's stream (:mod:`chainrun.checks.patterns`,
:mod:`chainrun.checks.holdback`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chainrun.checks.grounding import DEFAULT_ID_PATTERN, DEFAULT_SAFE_TEXT
from chainrun.checks.loops import DEFAULT_LOOP_TEXT, LoopCheck
from chainrun.checks.output import OutputCheck
from chainrun.checks.patterns import BUILTIN_CHECKS, PatternCheck, PatternChecker
from chainrun.money import DEFAULT_LOCALE, locale_of, minor_digits


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: What a check does with a match: refuse the turn, mask the match, or nothing.
CheckAction = Literal["block", "redact", "off"]


class PatternConfig(_Strict):
    """A configured regex check (``[[checks.patterns]]``): Python ``re`` syntax."""

    #: the check's name (shown as ``[NAME]`` where it redacts, and in the log)
    name: str = Field(min_length=1)
    #: the pattern, Python ``re`` syntax (run by the ``regex`` engine with a timeout)
    regex: str
    #: ``block`` refuses the turn, ``redact`` masks the match
    action: Literal["block", "redact"] = "block"
    #: match regardless of case
    ignore_case: bool = False

    @model_validator(mode="after")
    def _compiles(self) -> PatternConfig:
        PatternCheck.custom(self.name, self.regex, self.action, ignore_case=self.ignore_case)
        return self


class _CheckRules(_Strict):
    """The deterministic checks in force: an action per built-in check, plus patterns."""

    #: payment card numbers (13-19 digits passing the Luhn checksum)
    card: CheckAction = "block"
    #: IBANs (valid mod-97 check digits)
    iban: CheckAction = "redact"
    #: API keys of well-known shapes (e.g. ``sk-...``)
    api_key: CheckAction = "redact"
    #: e-mail addresses
    email: CheckAction = "off"
    #: phone numbers
    phone: CheckAction = "off"
    #: the shop's own regex checks (``[[...patterns]]``)
    patterns: list[PatternConfig] = Field(default_factory=list)

    def checker(self) -> PatternChecker:
        """The checks in force, built-ins first (in :data:`BUILTIN_CHECKS` order)."""
        checks = [
            PatternCheck.builtin(name, action)
            for name in BUILTIN_CHECKS
            if (action := getattr(self, name)) != "off"
        ]
        checks += [
            PatternCheck.custom(p.name, p.regex, p.action, ignore_case=p.ignore_case)
            for p in self.patterns
        ]
        return PatternChecker(checks)


class ChecksConfig(_CheckRules):
    """Deterministic checks (``[checks]``), run on the user's message before any step and
    outside every step's budget (microseconds; :mod:`chainrun.checks.patterns`).

    Per built-in check: ``"block"`` refuses the turn with no model call, ``"redact"``
    replaces the match by ``[NAME]`` in what the model sees (and in the log), ``"off"``.
    A blocked or redacted message is logged with its matches masked. A blocked turn
    answers the blocking check's text: ``block_texts[NAME]``, else the built-in one
    (:data:`~chainrun.checks.patterns.BLOCK_TEXTS`: e.g. not to share card numbers in
    chat), never the blocked content.
    """

    #: what the shopper is told when a check blocks their message, by check name (a
    #: built-in or a pattern's name); unnamed checks keep their built-in text
    block_texts: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _block_texts_name_checks(self) -> ChecksConfig:
        known = [*BUILTIN_CHECKS, *(p.name for p in self.patterns)]
        for name, text in self.block_texts.items():
            if name not in known:
                raise ValueError(
                    f"block_texts.{name}: no such check; expected one of {', '.join(known)}"
                )
            if not text.strip():
                raise ValueError(f"block_texts.{name}: expected a non-empty text")
        return self


class OutputCheckConfig(_CheckRules):
    """Checks on the answer step's stream (``[steps.ANSWER.output_check]``), run by the
    hold-back engine (:mod:`chainrun.checks.holdback`).

    The stream is checked in windows of ``window_tokens`` (c) streamed chunks; the last c
    are held back from the user until a check has covered them and what follows, so a
    flagged phrase of at most c chunks never reaches the user, even split across chunks.
    The deterministic checks (the fields of ``[checks]``, same defaults, and
    ``[[...patterns]]``) run on every window: ``block`` stops the stream (the HTTP call is
    closed) and refuses the turn with ``reject_text`` (default: the chain's refusal);
    ``redact`` shows ``[NAME]`` instead of the match. Each token reaches the user about
    c / (tokens per s) + one check later; see :func:`chainrun.checks.holdback.exposure_bound`.
    """

    #: c: streamed chunks held back (a chunk of a streamed answer is about one token)
    window_tokens: int = Field(default=8, ge=1, le=4096)
    #: what the user is told when a window is blocked (None: the chain's refusal)
    reject_text: str | None = None

    def make(self) -> OutputCheck:
        """A fresh output check for one answer."""
        return OutputCheck(self.checker(), self.window_tokens, self.reject_text)


class GroundingConfig(_Strict):
    """The grounding check of the answer step's stream (``[steps.ANSWER.grounding]``):
    the answer's product ids, titles, prices (and amounts derived from them), fees,
    discounts, size and stock claims, colours, policy days and delivery countries
    against the shop's own sources (the products the step was handed and those earlier
    turns showed, the catalogue, the turn's tool results, the shop's policy text), on the
    stream in the hold-back engine (:mod:`chainrun.checks.grounding`). Client-sent
    assistant turns are never a source.
    """

    #: run the check (the default chain's answer step has it on)
    enabled: bool = True
    #: what an ungrounded claim does: ``correct`` (a wrong price, title or currency of a
    #: product the turn has is replaced by the row's; any other ungrounded claim drops its
    #: sentence or line), ``drop`` (drop the claim's sentence or line), ``replace`` (the
    #: whole answer becomes ``safe_text``), ``refuse`` (the turn is refused), ``flag``
    #: (only logged)
    action: Literal["correct", "drop", "replace", "refuse", "flag"] = "correct"
    #: what the shopper is told when nothing of the answer is left, or with ``replace``
    safe_text: str = Field(default=DEFAULT_SAFE_TEXT, min_length=1)
    #: the shape of a product id (a regular expression)
    id_pattern: str = DEFAULT_ID_PATTERN
    #: the shop's currency (ISO 4217): a price in another is a claim that is not so, and
    #: corrections are written in it
    currency: str = Field(default="EUR", pattern=r"^[A-Z]{3}$")
    #: the shop's locale (CLDR, e.g. ``de_CH``, ``fr_FR``): the number format the
    #: answer's amounts are read in first (``1'299.00``, ``1 299,00``), and the one
    #: corrections are written in (``CHF 1'299.00``)
    locale: str = DEFAULT_LOCALE
    #: the shop's policy file whose figures (days, hours, fees) the answer may state
    #: (None: the sample shop's, as the policy step's default)
    policy_file: str | None = None
    #: recognise the titles of every catalogue product (so a product the turn was not
    #: handed is caught by its title too); catalogues larger than this many products only
    #: the turn's titles are matched
    catalogue_titles_max: int = Field(default=20_000, ge=0)

    @model_validator(mode="after")
    def _compiles(self) -> GroundingConfig:
        import re

        try:
            re.compile(self.id_pattern)
        except re.error as e:
            raise ValueError(f"id_pattern: not a regular expression ({e})") from None
        try:
            minor_digits(self.currency)
            locale_of(self.locale)
        except ValueError as e:
            raise ValueError(str(e)) from None
        return self


class LoopConfig(_Strict):
    """The loop check of the answer step (``[steps.ANSWER.loop]``, on by default): an
    answer that repeats a sentence, or a block of words back to back, is stopped on the
    stream (the model's call cancelled), keeping the whole sentences before the
    repetition (:mod:`chainrun.checks.loops`, where the thresholds' source is given)."""

    #: run the check on the answer step
    enabled: bool = True
    #: a sentence of at least this many words said again is a loop
    min_words: int = Field(default=3, ge=1)
    #: words repeated back to back past their first copy that make a loop
    cycle_words: int = Field(default=8, ge=2)
    #: the longest block of words (in words) a back-to-back repetition is looked for with
    max_period: int = Field(default=64, ge=1, le=1024)
    #: what the shopper is told when the answer repeated itself from its first sentence
    safe_text: str = Field(default=DEFAULT_LOOP_TEXT, min_length=1)

    def make(self) -> LoopCheck:
        """A fresh loop check for one answer."""
        return LoopCheck(min_words=self.min_words, cycle_words=self.cycle_words,
                         max_period=self.max_period, safe_text=self.safe_text)  # fmt: skip


__all__ = [
    "CheckAction", "ChecksConfig", "GroundingConfig", "LoopConfig", "OutputCheckConfig",
    "PatternConfig",
]
