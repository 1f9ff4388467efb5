"""What an answer may state: the grounding check's sources, read once per turn.

- :class:`ProductRow`: a product as the check knows it (id, title, price in the shop's
  currency, sizes with stock, colours).
- :class:`TitleIndex`: the catalogue's titles, one compiled pattern, built once per
  catalogue.
- :class:`PolicyFacts`: the figures of the shop's policy text: its amounts (fees,
  thresholds), its day and hour figures by subject, its discount and VAT percentages,
  the countries it delivers to.
- :class:`GroundingSources`: one turn's sources: the products the answer step was
  handed, the products of the conversation's earlier turns, the whole catalogue, the
  turn's tool results, the policy, and the shop's currency and locale.

Amounts are :class:`~decimal.Decimal` s in the shop's currency, rounded to its decimals
(:func:`chainrun.money.quantize`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from typing import Any

from chainrun.checks.colours import COLOUR_WORDS
from chainrun.checks.wording import words
from chainrun.money import DEFAULT_LOCALE, find_money, quantize

__all__ = [
    "DEFAULT_ID_PATTERN",
    "EU_MEMBERS",
    "OFFER_WORDS",
    "GroundingSources",
    "PolicyFacts",
    "ProductRow",
    "TitleIndex",
    "core_title",
    "countries_in",
    "figures_in",
    "topics_of",
]

#: the catalogue's id shape: two to five capitals, a dash, two to six digits (JKT-013)
DEFAULT_ID_PATTERN = r"[A-Z]{2,5}-\d{2,6}"

_TRAILING_BRACKET = re.compile(r"\s*\([^()]*\)\s*$")


@dataclass(frozen=True)
class ProductRow:
    """A product as the check knows it: id, title, price (in ``currency``), sizes (units
    in stock by size label), colours (the catalogue's names, e.g. ``("navy",)``; empty:
    not known, and no colour claim about it is checked)."""

    id: str
    title: str
    price: float
    currency: str = "EUR"
    sizes: Mapping[str, int] = field(default_factory=dict)
    colours: tuple[str, ...] = ()

    @classmethod
    def of(cls, p: Any) -> ProductRow:
        """From a product object (attributes ``id``, ``title``, ``price``, ``currency``,
        ``sizes``, ``colours``, as the retrieve step hands on) or a dict with those keys.

        Raises:
            KeyError, AttributeError: ``id``, ``title`` or ``price`` is missing.
        """

        def get(name: str, default: Any = None) -> Any:
            if isinstance(p, Mapping):
                return p.get(name, default) if default is not None else p[name]
            return getattr(p, name, default) if default is not None else getattr(p, name)

        sizes = get("sizes", {}) or {}
        colours = get("colours", ()) or ()
        if isinstance(colours, str):
            colours = [colours]
        return cls(str(get("id")), str(get("title")), float(get("price")),
                   str(get("currency", "EUR") or "EUR"),
                   {str(s): int(n) for s, n in dict(sizes).items()},
                   tuple(str(c) for c in colours))  # fmt: skip

    @property
    def sizes_in_stock(self) -> list[str]:
        return [s for s, n in self.sizes.items() if n > 0]

    @property
    def amount(self) -> Decimal:
        """The price as an exact amount of ``currency``."""
        return quantize(self.price, self.currency)


def core_title(title: str) -> str:
    """A title without its trailing bracket ("... Rain Jacket (yellow)" → "... Rain Jacket")."""
    return _TRAILING_BRACKET.sub("", title).strip()


#: words of a title that say nothing of what the product is ("Women's", "with")
_NOT_NOUNS = frozenset(
    """women's womens women men's mens men kids kid's unisex girls boys with and the for
    from this that pack size sizes one new classic essential everyday""".split()
)


def _noun_words(title: str) -> list[str]:
    """The words of ``title`` a sentence may name the product by ("daypack", "tent"):
    letters only, four or more, not a colour or a word such as "women's"."""
    words = re.findall(r"[A-Za-zÀ-ÿ]+(?:'s)?", core_title(title).lower())
    return [w for w in words if len(w) >= 4 and w not in _NOT_NOUNS and w not in COLOUR_WORDS]


class TitleIndex:
    """Product titles (with and without their trailing bracket) → the ids that bear them,
    and one compiled pattern that finds any of them; built once per catalogue (a few ms
    for hundreds of titles), not per turn.

    Args:
        rows: the products whose titles are indexed.
    """

    def __init__(self, rows: Iterable[ProductRow]) -> None:
        self.rows = list(rows)
        by_title: dict[str, set[str]] = {}
        for row in self.rows:
            for t in {row.title, core_title(row.title)}:
                if len(t) >= 8:
                    by_title.setdefault(t.lower(), set()).add(row.id)
        self.title_ids = by_title
        titles = sorted(by_title, key=len, reverse=True)
        self.regex = (
            re.compile(r"(?<!\w)(?:" + "|".join(re.escape(t) for t in titles) + r")(?!\w)", re.I)
            if titles else None
        )  # fmt: skip
        self.starts = frozenset(t.split()[0] for t in titles if t.split())
        #: noun word → the ids whose title holds it ("daypack" → {"PCK-201"})
        self.nouns: dict[str, set[str]] = {}
        for row in self.rows:
            for w in _noun_words(row.title):
                self.nouns.setdefault(w, set()).add(row.id)

    def with_rows(self, rows: Iterable[ProductRow]) -> TitleIndex:
        """This index, or one that also holds the titles of ``rows`` it lacks."""
        extra = [r for r in rows if r.title.lower() not in self.title_ids
                 or r.id not in self.title_ids[r.title.lower()]]  # fmt: skip
        return self if not extra else TitleIndex([*self.rows, *extra])


# -- the policy's facts --------------------------------------------------------------------

#: subjects of the policy a sentence may speak of, by the words that name them
TOPICS: dict[str, re.Pattern[str]] = {
    "returns": words("returns?", "returned", "returning", "send (?:it |them )?back"),
    "refunds": words("refunds?", "refunded", "money back", "reimburs\\w*", "credited",
                     "paid back", "your money"),
    "exchanges": words("exchanges?", "exchanged", "swap"),
    "delivery": words("deliver\\w*", "shipping", "ships?", "shipped", "dispatch\\w*",
                      "arriv\\w*", "express", "courier", "postage", "parcels?", "tracking"),
    "cancel": words("cancel\\w*", "change (?:the |your )?address"),
    "faults": words("faulty", "damaged", "missing", "wrong item", "defect\\w*"),
    "service": words("customer service", "contact us", "reach us", "phone", "opening hours"),
}  # fmt: skip


def topics_of(text: str) -> frozenset[str]:
    """The policy subjects ``text`` speaks of (keys of :data:`TOPICS`)."""
    return frozenset(name for name, rx in TOPICS.items() if rx.search(text))


_NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fourteen": 14, "fifteen": 15,
    "twenty": 20, "thirty": 30, "forty-five": 45, "sixty": 60, "ninety": 90, "a": 1, "an": 1,
}  # fmt: skip
_N = r"\d{1,3}|" + "|".join(sorted((w for w in _NUMBER_WORDS if len(w) > 2), key=len,
                                   reverse=True))  # fmt: skip
#: a number of days, hours or weeks: "30 days", "2-4 working days", "2 to 4 days",
#: "between 2 and 4 days", "two weeks", "a 30-day return window", "24 hours"
FIGURE = re.compile(
    rf"(?<![\d.,])(?:between\s+)?(?P<n>{_N})(?:\s?(?:-|–|to|and)\s?(?P<m>{_N}))?"
    r"(?:\s+(?:more\s+|extra\s+)?|-)(?P<unit>(?:working\s+|business\s+|calendar\s+)?"
    r"(?:days?|hours?|weeks?))\b",
    re.I,
)


@dataclass(frozen=True)
class Figure:
    """A figure of days or hours as written: its offsets, its range in days or hours
    (weeks are read as seven days), and its unit (``day`` or ``hour``)."""

    start: int
    end: int
    text: str
    low: int
    high: int
    unit: str


def _number(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBER_WORDS[word.lower()]


#: a range with its unit left out, after a figure with one ("2-4 working days in
#: France, 3-6 in the rest of the EU"): read in the policy only
_ELIDED = re.compile(
    r"(?<![\d.,\w])(?P<n>\d{1,3})\s?[-–]\s?(?P<m>\d{1,3})(?![\d.,:%])"
    r"(?!\s?(?:mm|cm|m|kg|g|l|years?|months?|minutes?|EUR|CHF|USD|GBP|€)\b)"
)


def figures_in(text: str, *, elided: bool = False) -> list[Figure]:
    """The day, hour and week figures of ``text`` (see :data:`FIGURE`); ``elided``: also
    the ranges after one that leave its unit out ("2-4 working days in France, 3-6 in
    the rest of the EU": 3-6 days)."""
    out = []
    for m in FIGURE.finditer(text):
        unit = m.group("unit").lower().split()[-1]
        factor = 7 if unit.startswith("week") else 1
        low = _number(m.group("n")) * factor
        high = _number(m.group("m")) * factor if m.group("m") else low
        out.append(Figure(m.start(), m.end(), m.group(0), low, high,
                          "hour" if unit.startswith("hour") else "day"))  # fmt: skip
    if elided and out:
        first = out[0]
        for m in _ELIDED.finditer(text, first.end):
            if any(f.start <= m.start() < f.end for f in out):
                continue
            out.append(Figure(m.start(), m.end(), m.group(0), int(m.group("n")),
                              int(m.group("m")), first.unit))  # fmt: skip
    return out


#: the member states of the European Union (ISO 3166-1 alpha-2; the EU's own list,
#: european-union.europa.eu, "EU countries", 27 since 2020)
EU_MEMBERS = frozenset(
    "AT BE BG HR CY CZ DK EE FI FR DE GR HU IE IT LV LT LU MT NL PL PT RO SK SI ES SE".split()
)
_COUNTRY_ALIASES = {
    "uk": "GB", "u.k.": "GB", "britain": "GB", "great britain": "GB", "england": "GB",
    "scotland": "GB", "wales": "GB", "us": "US", "u.s.": "US", "usa": "US", "america": "US",
    "the states": "US", "holland": "NL",
}  # fmt: skip
_GROUPS = {"eu": EU_MEMBERS, "european union": EU_MEMBERS}
_EVERYWHERE = words("worldwide", "world-wide", "all countries", "everywhere", "anywhere")


@lru_cache(maxsize=8)
def _country_pattern(locale: str) -> tuple[re.Pattern[str], dict[str, str]]:
    """A pattern of country names (CLDR territory names in English and in ``locale``'s
    language, with common short forms: UK, USA, EU) and name → ISO code."""
    from babel import Locale

    names: dict[str, str] = {}
    for loc in ("en", locale):
        try:
            territories = Locale.parse(loc.replace("-", "_")).territories
        except (ValueError, Exception):
            continue
        for code, name in territories.items():
            if len(code) == 2 and code.isalpha() and len(name) >= 4:
                names.setdefault(name.lower(), code)
    names.update(_COUNTRY_ALIASES)
    words = sorted([*names, *_GROUPS], key=len, reverse=True)
    alt = "|".join(re.escape(w) for w in words)
    # short forms are capitals ("US", "EU", not "us"): checked by the caller
    return re.compile(rf"(?<![\w.])(?:{alt})(?![\w])", re.I), names


@dataclass(frozen=True)
class CountryMention:
    start: int
    end: int
    text: str
    codes: frozenset[str]


def countries_in(text: str, locale: str = DEFAULT_LOCALE) -> list[CountryMention]:
    """The countries (or the EU) ``text`` names, each with its ISO codes."""
    pattern, names = _country_pattern(locale)
    out = []
    for m in pattern.finditer(text):
        word = m.group(0)
        low = word.lower()
        if len(word) <= 3 and word != word.upper():
            continue  # "us", "eu" as words, not the US or the EU
        codes = _GROUPS.get(low) or frozenset({names[low]})
        out.append(CountryMention(m.start(), m.end(), word, frozenset(codes)))
    return out


#: words of a discount ("20% off", "a discount", "on sale", "promo code")
DISCOUNT = words(
    "off", "discounts?", "discounted", "on sale", "sale price", "save", "saving", "savings",
    "reduced", "reductions?", "markdowns?", "promo(?:tion)?s?", "promo codes?", "coupons?",
    "vouchers?", "rebates?", "clearance", "cheaper",
)
#: words that offer a discount with no number ("on sale", "a discount", "promo code")
OFFER_WORDS = words(
    "discount codes?", "discounts?", "discounted", "on sale", "sale prices?",
    "promo(?:tion)? codes?", "promotions?", "coupons?", "vouchers?", "markdowns?", "clearance",
    "price reductions?", "reduced prices?",
)
_PERCENT = re.compile(r"(?P<n>\d{1,3}(?:[.,]\d{1,2})?)\s?(?:%|percent\b|per cent\b)", re.I)
_VAT_WORD = r"(?:VAT|MwSt\.?|Mehrwertsteuer|TVA|IVA|sales tax)"
_VAT_RATE = re.compile(
    rf"(?P<a>\d{{1,2}}(?:[.,]\d{{1,2}})?)\s?%\s*(?:\w+\s+)?{_VAT_WORD}"
    rf"|{_VAT_WORD}\s*(?:of|at|is|:)?\s*(?P<b>\d{{1,2}}(?:[.,]\d{{1,2}})?)\s?%",
    re.I,
)
NEGATION = re.compile(r"\b(?:not|no|never|none|without|neither|nor|cannot)\b|n't\b", re.I)


def _percent(text: str) -> Decimal:
    return Decimal(text.replace(",", "."))


@dataclass(frozen=True)
class PolicyFacts:
    """The figures a policy text gives.

    Attributes:
        sentences: its sentences.
        amounts: every amount of the shop's currency it states (fees, thresholds).
        figures: the day or hour figures of each subject (:data:`TOPICS`), as
            ``(low, high, unit)``; ``"*"``: all of them.
        discounts: the percentages it offers as a discount (a sentence with a discount
            word and no negation); ``offers_discount``: any discount offered at all.
        vat_rates: the VAT rates it states, as fractions (19% → 0.19).
        delivers_to: ISO codes of the countries its delivery sentences name (the EU's
            members when it names the EU); ``delivers_everywhere``: it says worldwide.
    """

    sentences: tuple[str, ...]
    amounts: frozenset[Decimal]
    figures: Mapping[str, frozenset[tuple[int, int, str]]]
    discounts: frozenset[Decimal]
    offers_discount: bool
    vat_rates: frozenset[Decimal]
    delivers_to: frozenset[str]
    delivers_everywhere: bool

    @classmethod
    def read(cls, text: str, currency: str, locale: str) -> PolicyFacts:
        """The facts of the policy ``text`` (amounts read in ``currency`` and ``locale``)."""
        sentences = tuple(s for s in re.split(r"(?<=[.!?])\s+|\n", text) if s.strip())
        amounts = frozenset(m.amount for m in find_money(text, currency, locale)
                            if m.amount is not None and m.currency == currency)  # fmt: skip
        figures: dict[str, set[tuple[int, int, str]]] = {"*": set()}
        discounts: set[Decimal] = set()
        offers = False
        delivers: set[str] = set()
        everywhere = False
        for s in sentences:
            found = {(f.low, f.high, f.unit) for f in figures_in(s, elided=True)}
            figures["*"] |= found
            for topic in topics_of(s):
                figures.setdefault(topic, set()).update(found)
            if not NEGATION.search(s):
                found_pct = {_percent(m.group("n")) for m in _PERCENT.finditer(s)
                             if DISCOUNT.search(s, m.end(), m.end() + 20)}  # fmt: skip
                discounts |= found_pct
                offers = offers or bool(found_pct) or bool(OFFER_WORDS.search(s))
            if "delivery" in topics_of(s):
                for c in countries_in(s, locale):
                    delivers |= c.codes
                everywhere = everywhere or bool(_EVERYWHERE.search(s))
        rates = frozenset(_percent(m.group("a") or m.group("b")) / 100
                          for m in _VAT_RATE.finditer(text))  # fmt: skip
        return cls(sentences, amounts, {k: frozenset(v) for k, v in figures.items()},
                   frozenset(discounts), offers, rates, frozenset(delivers),
                   everywhere)  # fmt: skip


#: a number with two decimals in a tool result ("total": 89.90)
_DECIMAL_AMOUNT = re.compile(r"(?<![\d.,])\d{1,6}[.,]\d{2}(?!\d)")


class GroundingSources:
    """What a turn's answer may state: the turn's products, the conversation's, every
    catalogue product, its tool results, the policy.

    Args:
        products: the products the answer step was handed (objects or dicts with ``id``,
            ``title``, ``price``, ``currency``, ``sizes``; :meth:`ProductRow.of`).
        policy: the shop's policy text (its figures: days, hours, fees, countries).
        tool_results: the turn's tool results as text (their ids and amounts count).
        catalogue: every product of the shop (id → row): a fact about any of them is
            judged against its row (None: only the turn's and the history's are known,
            and a product outside them cannot be judged).
        history: the products earlier turns of the conversation showed.
        currency: the shop's currency (ISO 4217).
        locale: the shop's locale (CLDR: ``de_CH``), the format its amounts are read in
            first and corrections are written in.
        id_pattern: the shape of a product id (a regular expression).
        titles: the catalogue's :class:`TitleIndex`, built once (None: built here from
            ``catalogue``; the turn's and the history's products it lacks are added).
        policy_facts: the policy's :class:`PolicyFacts`, read once (None: read here).
    """

    def __init__(
        self,
        products: Iterable[Any] = (),
        *,
        policy: str = "",
        tool_results: Sequence[str] = (),
        catalogue: Mapping[str, ProductRow] | None = None,
        history: Iterable[Any] = (),
        currency: str = "EUR",
        locale: str = DEFAULT_LOCALE,
        id_pattern: str = DEFAULT_ID_PATTERN,
        titles: TitleIndex | None = None,
        policy_facts: PolicyFacts | None = None,
    ) -> None:
        self.products = {r.id: r for r in (ProductRow.of(p) for p in products)}
        self.history = {r.id: r for r in (ProductRow.of(p) for p in history)
                        if r.id not in self.products}  # fmt: skip
        self.catalogue = dict(catalogue or {})
        self.currency = currency
        self.locale = locale
        self.tool_text = "\n".join(tool_results)
        self.id_pattern = id_pattern
        self.id_re = re.compile(rf"\b{id_pattern}\b")
        self.tool_ids = set(self.id_re.findall(self.tool_text))
        self.tool_amounts = frozenset(
            m.amount for m in find_money(self.tool_text, currency, locale) if m.amount is not None
        ) | frozenset(quantize(a.replace(",", "."), currency)
                      for a in _DECIMAL_AMOUNT.findall(self.tool_text))  # fmt: skip
        index = titles if titles is not None else TitleIndex(self.catalogue.values())
        self.titles = index.with_rows([*self.products.values(), *self.history.values()])
        self.title_ids = self.titles.title_ids
        self.title_re = self.titles.regex
        self.policy = policy
        self.facts = policy_facts or PolicyFacts.read(policy, currency, locale)
        self.policy_sentences = list(self.facts.sentences)
        #: the policy's amounts (fees, thresholds)
        self.fees = self.facts.amounts
        #: the prices of the turn's products
        self.prices = frozenset(r.amount for r in self.products.values())
        #: the products each sentence names, by its text (:func:`chainrun.checks.facts.mentions`)
        self.mention_cache: dict[str, Any] = {}

    def known(self, pid: str) -> ProductRow | None:
        """The row of ``pid``: the turn's, the history's or the catalogue's (None: none)."""
        return self.products.get(pid) or self.history.get(pid) or self.catalogue.get(pid)

    @property
    def knows_catalogue(self) -> bool:
        """Whether every catalogue product is known (else an unknown id cannot be judged)."""
        return bool(self.catalogue)

    @property
    def nearby(self) -> dict[str, ProductRow]:
        """The products of this turn and of the conversation's earlier turns."""
        return {**self.history, **self.products}

    def describe(self, pid: str) -> str:
        from chainrun.money import format_money

        row = self.known(pid)
        if row is None:
            return pid
        return f"{pid} ({row.title}, {format_money(row.amount, self.currency, self.locale)})"
