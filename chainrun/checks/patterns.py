"""Deterministic pattern checks: card numbers, IBANs, API keys, e-mail, phone, custom regexes.

They cost microseconds, so they run before any model check and outside its budget, on the
user's message (a message with a card number is blocked with no model call at all) and on
every window of a streamed answer (:mod:`chainrun.checks.holdback`). Each check either
``block`` s the text or ``redact`` s the match (replaced by ``[NAME]``).

Validation beyond the shape, so that ordinary numbers are not flagged:

* payment cards: 13-19 digits, single spaces or dashes allowed between them, that start
  with a card network's issuer identification number (IIN) prefix, have a length that
  network issues (:data:`CARD_NETWORKS`), and pass the Luhn checksum (ISO/IEC 7812-1,
  annex B). Luhn alone passes one digit string in ten, so a 13-digit millisecond
  timestamp or an order number would often be read as a card; digits after a ``+`` are
  an international phone number, and a 13-digit number that is a valid EAN-13 (GTIN) is
  read as the product code it more likely is in a shop's chat (13-digit Visa numbers
  are legacy);
* IBANs: 2 letters, 2 check digits, 11-30 letters or digits (written compact or in groups
  of four), valid when the number rearranged (first four characters moved to the end,
  letters as 10..35) is 1 modulo 97 (ISO 13616-1);
* API keys: the published prefixes of OpenAI (``sk-``), AWS access key ids
  (``AKIA``/``ASIA`` + 16), GitHub tokens (``ghp_`` ...), Slack (``xox?-``), Google
  (``AIza`` + 35), Stripe (``sk_live_`` ...) and JSON Web Tokens;
* phone numbers: an international ``+`` number or a national one with a trunk ``0`` or the
  North American ``(555) 123-4567`` shape, 7-15 digits (ITU-T E.164's maximum), not a date.

Findings carry positions and the check's name, never the matched text, so a log of them
holds no secret.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import regex as _regex

Action = Literal["block", "redact"]

#: The longest a configured regex may search one text, in s. A check costs microseconds;
#: a pattern with catastrophic backtracking (``(a|aa)+$``) would otherwise hold the event
#: loop, uninterruptibly, for minutes. Such a search fails closed (see PatternChecker).
CUSTOM_REGEX_TIMEOUT_S = 0.05

#: The built-in checks, in the order they claim text (an earlier finding wins an overlap).
BUILTIN_CHECKS = ("card", "iban", "api_key", "email", "phone")

#: What the shopper is told when a check blocks their message (``[checks]``), per built-in
#: check: what to do instead, never what was blocked (the message is not echoed). Override
#: per check with ``[checks.block_texts]``. chainrun's own wording.
BLOCK_TEXTS: dict[str, str] = {
    "card": "For your security, please don't share card numbers in chat: your message was "
    "not sent. Ask again without the number; payment details are only entered at checkout.",
    "iban": "For your security, please don't share bank account numbers (IBAN) in chat: "
    "your message was not sent. Ask again without the number.",
    "api_key": "Please don't share API keys, tokens or passwords in chat: your message was "
    "not sent. Ask again without it (and replace the key, since it has left your hands).",
    "email": "Please don't share e-mail addresses in chat: your message was not sent. Ask "
    "again without the address.",
    "phone": "Please don't share phone numbers in chat: your message was not sent. Ask "
    "again without the number.",
}
#: the text for a blocking check with none of its own (a configured pattern)
DEFAULT_BLOCK_TEXT = (
    "Your message contained details that can't be shared in chat, so it was not sent. "
    "Please ask again without them."
)


def luhn_valid(digits: str) -> bool:
    """Whether a string of digits passes the Luhn checksum (ISO/IEC 7812-1 annex B).

    Raises:
        ValueError: ``digits`` holds a non-digit.
    """
    if not digits.isdigit():
        raise ValueError(f"expected digits only, got {digits!r}")
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_valid(iban: str) -> bool:
    """Whether ``iban`` (spaces allowed, any case) passes the ISO 13616 mod-97 check.

    The first four characters move to the end, letters become 10..35, and the number
    must be 1 modulo 97.
    """
    s = iban.replace(" ", "").upper()
    if not re.fullmatch(r"[A-Z]{2}\d{2}[A-Z0-9]{11,30}", s):
        return False
    rearranged = s[4:] + s[:4]
    number = "".join(str(int(ch, 36)) for ch in rearranged)
    return int(number) % 97 == 1


Span = tuple[int, int]
#: Given the text and a regex match, the span of what really is a finding (or None).
Locate = Callable[[str, "re.Match[str]"], "Span | None"]


@dataclass(frozen=True)
class CardNetwork:
    """A card network's IIN prefix ranges and the card number lengths it issues.

    Attributes:
        name: the network.
        prefixes: inclusive ``(lo, hi)`` ranges of leading digits of equal length
            (``("51", "55")``: a number starting 51, 52, ... or 55).
        lengths: the card number lengths (digits) the network issues.
    """

    name: str
    prefixes: tuple[tuple[str, str], ...]
    lengths: frozenset[int]

    def issued(self, digits: str) -> bool:
        """Whether ``digits`` has one of this network's prefixes and lengths."""
        if len(digits) not in self.lengths:
            return False
        return any(lo <= digits[: len(lo)] <= hi for lo, hi in self.prefixes)


def _lengths(lo: int, hi: int) -> frozenset[int]:
    return frozenset(range(lo, hi + 1))


#: Card networks by IIN prefix and issued lengths, as the networks publish them (ISO/IEC
#: 7812-1 registers the IINs; the ranges below are the networks' own: Visa, Mastercard
#: including the 2-series of 2017, American Express, Discover with its UnionPay
#: co-branded range, Diners Club International, JCB, UnionPay, Maestro, Mir).
CARD_NETWORKS: tuple[CardNetwork, ...] = (
    CardNetwork("visa", (("4", "4"),), frozenset({13, 16, 19})),
    CardNetwork("mastercard", (("51", "55"), ("2221", "2720")), frozenset({16})),
    CardNetwork("american_express", (("34", "34"), ("37", "37")), frozenset({15})),
    CardNetwork(
        "discover", (("6011", "6011"), ("644", "649"), ("65", "65"), ("622126", "622925")),
        _lengths(16, 19),
    ),
    CardNetwork(
        "diners_club", (("300", "305"), ("3095", "3095"), ("36", "36"), ("38", "39")),
        _lengths(14, 19),
    ),
    CardNetwork("jcb", (("3528", "3589"),), _lengths(16, 19)),
    CardNetwork("unionpay", (("62", "62"),), _lengths(16, 19)),
    CardNetwork(
        "maestro",
        (("5018", "5018"), ("5020", "5020"), ("5038", "5038"), ("5893", "5893"),
         ("6304", "6304"), ("6759", "6759"), ("6761", "6763")),
        _lengths(13, 19),
    ),
    CardNetwork("mir", (("2200", "2204"),), _lengths(16, 19)),
)  # fmt: skip


def ean13_valid(digits: str) -> bool:
    """Whether 13 digits carry a valid EAN-13 (GTIN-13) check digit (GS1 General
    Specifications, section 7.9: weights 1 and 3 from the left, total a multiple of 10)."""
    if len(digits) != 13 or not digits.isdigit():
        return False
    return sum(int(d) * (3 if i % 2 else 1) for i, d in enumerate(digits)) % 10 == 0


def card_network(digits: str) -> str | None:
    """The network whose card number ``digits`` could be (prefix, length and Luhn), or
    None: a number no network issues, a failed checksum, or a valid EAN-13 product code.

    Raises:
        ValueError: ``digits`` holds a non-digit.
    """
    if not luhn_valid(digits):
        return None
    if len(digits) == 13 and ean13_valid(digits):
        return None
    for network in CARD_NETWORKS:
        if network.issued(digits):
            return network.name
    return None


def _card(text: str, m: re.Match[str]) -> Span | None:
    digits = re.sub(r"[ -]", "", m.group(0))
    return m.span() if card_network(digits) is not None else None


def _iban(text: str, m: re.Match[str]) -> Span | None:
    """The longest valid IBAN at the match's start, trimming trailing groups (a four-letter
    word after a grouped IBAN looks like one more group)."""
    start, end = m.span()
    while end - start >= 15:
        if iban_valid(text[start:end]):
            return start, end
        cut = text.rfind(" ", start, end)
        if cut <= start:
            return None
        end = cut
    return None


_DATE = re.compile(r"\d{1,4}[./-]\d{1,2}[./-]\d{1,4}")


def _phone(text: str, m: re.Match[str]) -> Span | None:
    digits = re.sub(r"\D", "", m.group(0))
    ok = 7 <= len(digits) <= 15 and not _DATE.fullmatch(m.group(0).strip())
    return m.span() if ok else None


_PATTERNS: dict[str, tuple[str, Locate | None]] = {
    # not after a "+": an international phone number (+44 1234 567890...) is no card
    "card": (r"(?<![\d+-])\d(?:[ -]?\d){12,18}(?![\d])", _card),
    "iban": (
        # compact, or in groups of four with a last group of one to three
        r"\b[A-Za-z]{2}\d{2}"
        r"(?:[A-Za-z0-9]{11,30}|(?: [A-Za-z0-9]{4}){2,7}(?: [A-Za-z0-9]{1,3})?)\b",
        _iban,
    ),
    "api_key": (
        r"\b(?:sk-(?:proj-|svcacct-|admin-|ant-)?[A-Za-z0-9_-]{20,}"
        r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
        r"|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}"
        r"|xox[abposr]-[A-Za-z0-9-]{10,}"
        r"|AIza[0-9A-Za-z_-]{35}"
        r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
        r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})",
        None,
    ),
    "email": (r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b", None),
    "phone": (
        r"(?<![\w+])(?:\+\d{1,3}[ ./-]?(?:\(\d{1,4}\)[ ./-]?)?\d{1,4}(?:[ ./-]?\d{1,4}){1,5}"
        r"|\(?0\d{1,4}\)?[ ./-]?\d{2,4}(?:[ ./-]?\d{2,4}){1,3}"
        r"|\(\d{3}\) ?\d{3}[ .-]\d{4}|\b\d{3}[.-]\d{3}[.-]\d{4})(?![\w])",
        _phone,
    ),
}


@dataclass(frozen=True)
class PatternCheck:
    """One check: a name, a compiled pattern, what a match does, an optional validator.

    ``locate`` gets the text and a match and returns the span of what really is a finding
    (the match if it is a card number a network issues, for cards), or None; None
    accepts every match.
    """

    name: str
    #: ``re`` for the built-in checks; a ``regex`` module pattern for configured ones
    pattern: Any
    action: Action
    locate: Locate | None = None
    #: a search longer than this many s raises TimeoutError (None: no bound)
    timeout_s: float | None = None

    @classmethod
    def builtin(cls, name: str, action: Action) -> PatternCheck:
        """One of :data:`BUILTIN_CHECKS` with the given action.

        Raises:
            ValueError: an unknown name.
        """
        if name not in _PATTERNS:
            raise ValueError(f"unknown check {name!r}; expected one of {list(BUILTIN_CHECKS)}")
        regex, locate = _PATTERNS[name]
        return cls(name, re.compile(regex), action, locate)

    @classmethod
    def custom(
        cls, name: str, regex: str, action: Action, *, ignore_case: bool = False
    ) -> PatternCheck:
        """A configured regular expression (Python ``re`` syntax), searched with the
        ``regex`` module (its version-0 behaviour is ``re``'s) under
        :data:`CUSTOM_REGEX_TIMEOUT_S`, since only ``regex`` can stop a search.

        Raises:
            ValueError: the regex does not compile, or matches the empty string.
        """
        try:
            pattern = _regex.compile(regex, _regex.IGNORECASE if ignore_case else 0)
        except (_regex.error, re.error) as e:
            raise ValueError(f"check {name!r}: invalid regex ({e})") from None
        if pattern.fullmatch("", timeout=CUSTOM_REGEX_TIMEOUT_S):
            raise ValueError(f"check {name!r}: the regex matches the empty string")
        return cls(name, pattern, action, timeout_s=CUSTOM_REGEX_TIMEOUT_S)

    def spans(self, text: str) -> Iterable[Span]:
        """The (start, end) character spans of valid matches in ``text``.

        Raises:
            TimeoutError: a configured regex searched longer than its ``timeout_s``.
        """
        found = (
            self.pattern.finditer(text)
            if self.timeout_s is None
            else self.pattern.finditer(text, timeout=self.timeout_s)
        )
        for m in found:
            span = m.span() if self.locate is None else self.locate(text, m)
            if span is not None:
                yield span


@dataclass(frozen=True)
class Finding:
    """A valid match: the check's name, its action and the span (character offsets)."""

    check: str
    action: Action
    start: int
    end: int
    #: the check's regex ran out of time: it fails closed, the whole text is its span
    timed_out: bool = False

    def as_json(self) -> dict[str, object]:
        """``{check, action, start, end}`` (and ``timed_out: true`` when it did): no
        matched text, so it can be logged."""
        out: dict[str, object] = {
            "check": self.check, "action": self.action, "start": self.start, "end": self.end,
        }  # fmt: skip
        if self.timed_out:
            out["timed_out"] = True
        return out


@dataclass(frozen=True)
class CheckResult:
    """What the checks made of a text: ``text`` with redactions applied, ``findings``, and
    ``blocked`` when any finding's action is ``block``."""

    text: str
    findings: tuple[Finding, ...]

    @property
    def blocked(self) -> bool:
        """Whether a ``block`` check matched."""
        return any(f.action == "block" for f in self.findings)

    @property
    def redacted(self) -> bool:
        """Whether a ``redact`` check changed the text."""
        return any(f.action == "redact" for f in self.findings)

    def block_text(self, texts: Mapping[str, str] | None = None) -> str | None:
        """What the shopper is told about a blocked message: the text of the first
        blocking finding's check from ``texts``, else :data:`BLOCK_TEXTS`, else
        :data:`DEFAULT_BLOCK_TEXT`; None when nothing blocked. Never the matched text."""
        first = next((f for f in self.findings if f.action == "block"), None)
        if first is None:
            return None
        texts = texts or {}
        return texts.get(first.check) or BLOCK_TEXTS.get(first.check) or DEFAULT_BLOCK_TEXT

    def as_json(self) -> dict[str, object]:
        """``{blocked, findings: [...]}`` for the turn's log (no matched text)."""
        return {"blocked": self.blocked, "findings": [f.as_json() for f in self.findings]}


class PatternChecker:
    """Runs a list of checks over a text; earlier checks claim overlapping text first.

    Args:
        checks: the checks, in priority order (cards before phones, so a card number is
            not also a phone number).
    """

    def __init__(self, checks: Sequence[PatternCheck]) -> None:
        self.checks = tuple(checks)

    def __bool__(self) -> bool:
        return bool(self.checks)

    def findings(self, text: str) -> list[Finding]:
        """Every valid match, sorted by start; a span overlapping an earlier check's is dropped.

        A configured regex that runs out of time fails closed: one ``block`` finding over
        the whole text, ``timed_out`` set (the text is neither shown nor logged unmasked).
        """
        taken: list[Finding] = []
        for check in self.checks:
            try:
                spans = list(check.spans(text))
            except TimeoutError:
                return [Finding(check.name, "block", 0, len(text), timed_out=True)]
            for start, end in spans:
                if any(start < f.end and f.start < end for f in taken):
                    continue
                taken.append(Finding(check.name, check.action, start, end))
        return sorted(taken, key=lambda f: f.start)

    def check(self, text: str) -> CheckResult:
        """Find matches and apply redactions (``[NAME]`` in place of the match).

        A blocked text is redacted too (every finding masked), so that what is logged of it
        holds no card number.
        """
        found = self.findings(text)
        if not found:
            return CheckResult(text, ())
        out: list[str] = []
        pos = 0
        for f in found:
            out.append(text[pos : f.start])
            out.append(f"[{f.check}]")
            pos = f.end
        out.append(text[pos:])
        return CheckResult("".join(out), tuple(found))
