"""The grounding check: the facts an answer states, against the rows the turn has.

A model can write "[JKT-013] Women's City Drizzle Packable Rain Jacket | €49.95" when
JKT-013 is the 229 EUR Summit hardshell and was never shown to it. A model-based review
(the default ``validate`` step) can be talked round; this check cannot: it reads the
answer's **claims** and compares each with chainrun's own sources for the turn, by
rules, in microseconds.

Claims (found per segment of the answer: a line, or a sentence ending in ``.``, ``!``
or ``?`` before white space):

- ``product_id``: a catalogue id (``id_pattern``, default ``[A-Z]{2,5}-\\d{2,6}``);
  grounded when it is one of the turn's products (or named by one of its tool results).
- ``title``: a product title (the catalogue's, with or without its trailing colour in
  brackets); grounded when a product of that title is among the turn's; after an id in
  the same segment, it must be that id's title ("JKT-013 given the title of JKT-005").
- ``price``: an amount with a currency in the shop's formats (``€49.95``, ``49.95 EUR``,
  ``49,95 €``, ``EUR 49.95``, ``49.95 euros``, ``4495 cents``; another currency's sign or
  code is a claim too, and not grounded), or with none where it is said as a price
  (after a price word, "costs 19.99"; with two decimals beside a product, "JKT-008
  19.99"; not a size, an order number, a time or a measure: :func:`_is_bare_price`);
  about the product named before it in the segment (or after it), it must be that
  product's price; about none, the price of some product of the turn, a figure of a
  tool result or a fee of the policy (in a segment about delivery or returns, a fee of
  the policy whatever product it names). A negative (``-€44.95``, ``€-44.95``) or malformed
  (``€44.955``) price is never grounded. "under 100 EUR", "from 60 EUR" are bounds, not
  prices, and are not claims.
- ``stock``: "in stock in M", "available in S and M", "M is in stock", "sold out in L":
  about the product named in the segment (or the turn's only product), each size must
  exist and have stock (or none, for "sold out").
- ``colour``: a colour word (:mod:`chainrun.checks.colours`) said of a product ("comes in
  red", "is navy", a line's ``| olive/black |`` column), about the product as a price
  is: it must be one of that product's catalogue colours or a shade of one. Not a
  claim in a question, in quotes, after a negation, inside a title, or of a product the
  turn lacks.
- ``policy``: figures of the shop's policy: days ("within 30 days", "2-4 working days"),
  hours and fees: in a segment about returns, refunds, exchanges or delivery, the figure
  must be one the policy text gives on that subject.

Sources are chainrun's own: the products the turn's search handed to the answer step,
the turn's tool results, the shop's policy text. What a client sends as earlier
assistant turns (the OpenAI face's ``messages``) is what the client says the assistant
said, never a source.

What happens to an ungrounded claim is the ``action``:

- ``correct`` (the default): a wrong price, title or currency of a product the turn has
  is replaced by the row's; anything else ungrounded (a product the turn does not have,
  a price of nothing, a stock or policy figure that differs) drops its segment; an
  answer left empty is replaced by ``safe_text``.
- ``drop``: every segment with an ungrounded claim is dropped.
- ``replace``: the whole answer is replaced by ``safe_text``; ``refuse``: the turn is
  refused; ``flag``: the answer is left as it is; each is logged.

:class:`StreamGrounding` is the check on a stream: called by the hold-back engine
(:class:`chainrun.checks.holdback.HoldBack`) on what it holds, it judges each segment
once it is complete and asks the engine to hold back an open segment from the first
place a claim could start (an id, a digit, a currency, a title's first word), so text
before any claim reaches the shopper at once.

Limits (also in docs/guides/checks-and-guards.md): paraphrased prices ("under a hundred",
"about fifty euros") and paraphrased titles ("the yellow one") are not claims; a whole
number with no currency is a price only after a price word; a colour said another way
than after "in", "is", "are" or "colours" ("a red one") is not checked, and one said so
of another object ("wear it in black") is read as the product's; a product outside the
catalogue is only caught by its id or its price; English phrasings.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from chainrun.checks.colours import COLOUR_WORDS, SHADE_WORDS, colour_grounded
from chainrun.checks.holdback import Redaction, WindowVerdict

__all__ = [
    "DEFAULT_ID_PATTERN",
    "DEFAULT_SAFE_TEXT",
    "Claim",
    "GroundingAction",
    "GroundingSources",
    "ProductRow",
    "StreamGrounding",
    "TitleIndex",
    "check_text",
]

GroundingAction = Literal["correct", "drop", "replace", "refuse", "flag"]

#: the catalogue's id shape: two to five capitals, a dash, two to six digits (JKT-013)
DEFAULT_ID_PATTERN = r"[A-Z]{2,5}-\d{2,6}"
#: what the shopper is told when nothing of the answer is left (or ``replace``)
DEFAULT_SAFE_TEXT = (
    "I could not confirm the details of that answer against our catalogue. "
    "Please see the product pages for current prices and sizes."
)

_CURRENCY_SIGNS = {"€": "EUR", "$": "USD", "£": "GBP"}
_CURRENCY_WORDS = {"eur": "EUR", "euro": "EUR", "euros": "EUR", "usd": "USD",
                   "dollar": "USD", "dollars": "USD", "gbp": "GBP", "pound": "GBP",
                   "pounds": "GBP", "chf": "CHF"}  # fmt: skip
#: an amount: with thousands separators and decimals both ("1,234.50", "1.234,50"), or
#: up to six digits with one or two decimals after a point or a comma
_AMOUNT = r"\d{1,3}(?:,\d{3})+\.\d{2}|\d{1,3}(?:\.\d{3})+,\d{2}|\d{1,6}(?:[.,]\d{1,2})?"
_WORD_CUR = r"(?:EUR|USD|GBP|CHF|euros?|dollars?|pounds?)"
#: a minus sign: between the currency and the amount ("€-44.95", "EUR -44,95"), or just
#: before the price ("-€44.95", see :data:`_NEG_BEFORE`)
_MINUS = r"[-−]"
_PRICE = re.compile(
    # the look-ahead lets the engine pass over a position by its first character (a
    # sign, a code's first letter, a digit): three times faster on prose
    rf"(?=[€$£\dEUGC])(?:"
    rf"(?P<sign>[€$£])\s?(?P<neg2>{_MINUS})?(?P<a1>{_AMOUNT})"
    rf"|(?P<code>\b(?:EUR|USD|GBP|CHF))\s?(?P<neg3>{_MINUS})?\s?(?P<a2>{_AMOUNT})"
    rf"|(?P<a5>\b\d{{1,8}})\s?(?P<cents>cents?|ct)\b"
    rf"|(?P<a3>{_AMOUNT})\s?(?:(?P<sign2>[€$£])|(?P<word>{_WORD_CUR})\b))",
    re.I,
)
#: a minus sign just before a price, that does not close a range ("€30-€45") or a word
_NEG_BEFORE = re.compile(rf"(?<![\w€$£.,\-−]){_MINUS}$")
#: what makes a price that precedes it malformed ("€44.955", "€44.95.00", "€4,4,95")
_MALFORMED_TAIL = re.compile(r"(?:[.,]?\d)+")
_DIGIT = re.compile(r"\d")


def _in_number(before: str) -> bool:
    """Whether the character ``before`` an amount makes it the tail of a longer number
    or word ("1,234.5 EUR" read from "234", "x49 EUR")."""
    return before.isalnum() or before in "._,"


#: a bare amount (no currency), a price claim only in context (see :func:`_is_bare_price`)
_BARE = re.compile(
    rf"(?<![\w.,€$£\-−/#])(?P<neg>{_MINUS})?(?P<amount>{_AMOUNT})(?![\w%]|[.,]\d|-\d)"
)
#: words just before a bare amount that make it a price ("costs 19.99", "priced at 45")
_PRICE_CUE = re.compile(
    r"(?:\bcosts?|\bcosting|\bpriced\s+at|\bprice[sd]?(?:\s+(?:is|of|at))?\s*:?|"
    r"\b(?:sells?|selling|sold|retails?|retailing|yours|available)\s+(?:for|at)|"
    r"\breduced\s+to|\bdown\s+to|\bpay)\s+(?:(?:just|only|now)\s+)?$",
    re.I,
)
#: weaker words: a bare amount after them is a price only with decimals ("for 44.95")
_PRICE_CUE_DECIMAL = re.compile(r"(?:\bfor|\bnow|\bjust|\bonly|\|)\s*$", re.I)
#: words just before a bare number that make it no price: a size, an order or item
#: number, a time, a rating
_NOT_PRICE_BEFORE = re.compile(
    r"(?:\b(?:EU|UK|US|FR|IT|size|sizes|W|L|order|orders|no\.?|number|ref|item|items|"
    r"model|article|SKU|by|at|before|after|until|till|rated|rating|scored?|version)|[#/])"
    r"\s*$",
    re.I,
)
#: what may follow an amount that makes it a measure or a count, not a price
_UNIT_AFTER = re.compile(
    r"\s*(?:mm|cm|m|km|kg|g|l|ml|ft|inch(?:es)?|hours?|days?|weeks?|months?|years?|"
    r"mins?|minutes?|am|pm|h|x|stars?|pairs?|pieces?|items?|units?|pcs|people|"
    r"layers?|percent|out\s+of)\b",
    re.I,
)
#: words before an amount that make it a bound, not a price ("under 100 EUR")
_BOUND = re.compile(
    r"(?:under|below|less than|up to|from|over|above|around|about|budget of|within|"
    r"more than|at least|at most|max(?:imum)?|min(?:imum)?|spend|orders? over)\s*$",
    re.I,
)


def _list_of(item: str) -> str:
    """A pattern for one or more ``item`` s joined by commas, slashes, "and", "or", "&"."""
    return rf"{item}(?:\s*(?:,|/|and|or|&)\s*{item})*"


_SIZE = r"(?:XXXL|XXL|XL|XXS|XS|S|M|L|W\d{2}(?:/L\d{2})?|\d{2}(?:\.5)?|one size)"
_SIZES = _list_of(_SIZE)
_STOCK = [
    (re.compile(rf"\b(?:in stock|available)\s+in\s+(?:sizes?\s+)?(?P<sizes>{_SIZES})\b"), True),
    (re.compile(rf"\b(?:sizes?\s+)?(?P<sizes>{_SIZES})\s+(?:is|are)\s+(?:still\s+)?"
                r"(?:in stock|available)\b"), True),
    (re.compile(rf"\b(?:sold out|out of stock)\s+in\s+(?:sizes?\s+)?(?P<sizes>{_SIZES})\b",
                re.I), False),
]
_SIZE_TOKEN = re.compile(_SIZE)
_FIGURE = re.compile(
    r"(?<![\d.,])(?P<n>\d{1,3})(?:\s?(?:-|–|to)\s?(?P<m>\d{1,3}))?\s+"
    r"(?P<unit>(?:working\s+|business\s+)?days?|hours?)\b",
    re.I,
)
_TOPICS = {
    "returns": re.compile(
        r"\b(return|refund|exchange|send (?:it |them )?back|faulty|damaged)", re.I
    ),
    "delivery": re.compile(
        r"\b(deliver|shipping|ship|dispatch|arriv|express|courier|postage)", re.I
    ),
}
_COLOUR = "(?:" + "|".join(sorted(COLOUR_WORDS, key=len, reverse=True)) + ")"
_SHADE = "(?:(?:" + "|".join(sorted(SHADE_WORDS, key=len, reverse=True)) + r")[\s-])?"
_COLOURS = _list_of(f"{_SHADE}{_COLOUR}")
#: a colour said of a product: "comes in red", "in navy and black", "is olive", "colours:
#: navy, black", or a catalogue line's column "| navy/black |"
_COLOUR_CLAIM = re.compile(
    rf"\b(?:in|is|are|colou?rs?(?:\s+(?:is|are|include|includes))?\s*:?|colou?rways?:?)"
    rf"\s+(?:the\s+)?(?P<c1>{_COLOURS})\b(?!-)"
    rf"|\|\s*(?P<c2>{_COLOURS})\s*(?=\||$)",
    re.I,
)
_COLOUR_WORD = re.compile(rf"\b{_COLOUR}\b", re.I)
#: a negation before a colour: "not available in red", "no red", "isn't red"
_NEGATION = re.compile(r"\b(?:not|no|never|without|neither|nor)\b|n't\b", re.I)
#: quoted words ("you asked for 'red'"): the shopper's, not a claim
_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|(?<!\w)'[^']*'(?!\w)|‘[^’]*’")
_SEGMENT_END = re.compile(r"\n|(?<=[.!?])(?=\s)")
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


def core_title(title: str) -> str:
    """A title without its trailing bracket ("... Rain Jacket (yellow)" → "... Rain Jacket")."""
    return _TRAILING_BRACKET.sub("", title).strip()


def format_price(amount: float, like: str) -> str:
    """``amount`` written in the format of the price text ``like`` (sign before or code
    after, decimal comma or point; in cents for "4495 cents"; with no currency for a
    bare "19.99"); a minus sign in ``like`` is not copied."""
    comma = bool(re.search(r"\d,\d{1,2}$|\d,\d{1,2}\D", like))
    body = f"{amount:.2f}"
    if comma:
        body = body.replace(".", ",")
    stripped = re.sub(r"[-−]\s?(?=[\d€$£]|EUR|USD|GBP|CHF)", "", like.strip(), flags=re.I)
    if re.search(r"(?i)\d\s?(?:cents?|ct)$", stripped):
        return f"{round(amount * 100)} cents"
    if not re.search(r"[€$£A-Za-z]", stripped):
        return body  # a bare amount: as bare
    if stripped.startswith("€"):
        return f"€{' ' if stripped[1:2] == ' ' else ''}{body}"
    if re.match(r"(?i)EUR", stripped):
        return f"EUR {body}"
    if re.search(r"(?i)euros?\s*$", stripped):
        return f"{body} euros"
    if stripped.endswith("€"):
        return f"{body} €"
    if re.search(r"[$£]|USD|GBP|CHF|dollar|pound", stripped, re.I):
        return f"€{body}"  # another currency: the shop's own
    return f"{body} EUR"


def _amount(text: str) -> float:
    """An amount as written ("44.95", "44,95", "1,234.50", "1.234,50") as a number."""
    if "," in text and "." in text:  # thousands separators: the first kind
        text = text.replace("," if text.index(",") < text.index(".") else ".", "")
    return float(text.replace(",", "."))


def _price_of(m: re.Match[str]) -> tuple[float, str]:
    """The amount (in the currency's units: cents are read as hundredths) and the
    currency (ISO 4217) of a :data:`_PRICE` match."""
    if m.group("a5"):
        return round(int(m.group("a5")) / 100.0, 2), "EUR"
    amount = round(_amount(m.group("a1") or m.group("a2") or m.group("a3")), 2)
    cur = m.group("sign") or m.group("code") or m.group("sign2") or m.group("word") or ""
    return amount, _CURRENCY_SIGNS.get(cur) or _CURRENCY_WORDS.get(cur.lower(), "EUR")


@dataclass(frozen=True)
class _PriceText:
    """A price the segment states: its offsets, amount and currency, whether it has no
    currency (``bare``), a minus sign or a malformed amount."""

    start: int
    end: int
    amount: float
    currency: str
    bare: bool = False
    negative: bool = False
    malformed: bool = False
    #: a bare amount after a price word ("costs 19.99"): a price even about no product
    cued: bool = False


def _price_claims(seg: str, names_product: bool) -> list[_PriceText]:
    """The prices ``seg`` states, in order: each amount with a currency (a sign, a code,
    a word, or "cents"), unless a bound ("under 100 EUR"); and each bare amount said as
    a price (:func:`_is_bare_price`; ``names_product``: the segment names a product)."""
    out: list[_PriceText] = []
    taken: list[tuple[int, int]] = []
    if not _DIGIT.search(seg):
        return out
    for pm in _PRICE.finditer(seg):
        if pm.group("a3") and pm.start() and _in_number(seg[pm.start() - 1]):
            continue  # the tail of a longer number ("1,234.5 EUR" read from "234")
        tail = _MALFORMED_TAIL.match(seg, pm.end())
        end = tail.end() if tail else pm.end()
        start = pm.start()
        lead = _NEG_BEFORE.search(seg, max(0, start - 2), start)
        if lead is not None:
            start = lead.start()
        taken.append((start, end))
        if _BOUND.search(seg[max(0, start - 24) : start]):
            continue
        amount, currency = _price_of(pm)
        negative = lead is not None or bool(pm.group("neg2") or pm.group("neg3"))
        out.append(_PriceText(start, end, amount, currency, False, negative, bool(tail)))
    for bm in _BARE.finditer(seg):
        if any(a <= bm.start() < b or a < bm.end() <= b for a, b in taken):
            continue
        said = _is_bare_price(seg, bm, names_product)
        if said:
            out.append(_PriceText(bm.start(), bm.end(), round(_amount(bm["amount"]), 2),
                                  "EUR", True, bool(bm["neg"]), cued=said == "cued"))  # fmt: skip
    return sorted(out, key=lambda p: p.start)


def _is_bare_price(seg: str, bm: re.Match[str], names_product: bool) -> str | None:
    """Whether the bare amount ``bm`` of ``seg`` is said as a price: after a price word
    ("costs 19.99", "priced at 45"); or, written with two decimals ("19.99"), after
    "for", "now", "only" or a column bar, or in a segment that names a product
    ("JKT-008 19.99"). Never a bound ("under 50"), a size ("EU 42"), an order or item
    number ("order 1042"), a time ("at 10.30") or a measure or count ("2.50 m",
    "10 days"). Returns ``"cued"`` (after a price word), ``"beside"`` (the others) or
    None (no price)."""
    before = seg[max(0, bm.start() - 40) : bm.start()]
    if _UNIT_AFTER.match(seg, bm.end()) or _BOUND.search(before):
        return None
    if _PRICE_CUE.search(before):
        return "cued"
    if _NOT_PRICE_BEFORE.search(before) or not re.search(r"[.,]\d\d$", bm["amount"]):
        return None
    return "beside" if names_product or _PRICE_CUE_DECIMAL.search(before) else None


@dataclass(frozen=True)
class Claim:
    """One fact the answer states, and what the check made of it.

    Attributes:
        kind: ``product_id``, ``title``, ``price``, ``stock``, ``colour`` or ``policy``.
        text: the claim as written.
        start, end: its offsets in the checked text.
        product: the id the claim is about (None: none).
        grounded: whether the turn's sources say so.
        why: why not (None when grounded).
        correction: the text that would make it true (None: none known).
    """

    kind: str
    text: str
    start: int
    end: int
    product: str | None = None
    grounded: bool = True
    why: str | None = None
    correction: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "text": self.text, "product": self.product,
                               "grounded": self.grounded}  # fmt: skip
        if not self.grounded:
            out["why"] = self.why
            if self.correction is not None:
                out["correction"] = self.correction
        return out


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
        self._triggers: dict[str, re.Pattern[str]] = {}

    def with_rows(self, rows: Iterable[ProductRow]) -> TitleIndex:
        """This index, or one that also holds the titles of ``rows`` it lacks."""
        extra = [r for r in rows if r.title.lower() not in self.title_ids
                 or r.id not in self.title_ids[r.title.lower()]]  # fmt: skip
        return self if not extra else TitleIndex([*self.rows, *extra])

    def triggers(self, id_pattern: str) -> re.Pattern[str]:
        """What makes an open segment a claim to judge whole: an id, a title's first
        word, a stock phrase, a policy subject, a colour word (a price alone is held only
        while written)."""
        found = self._triggers.get(id_pattern)
        if found is None:
            # one look-behind before one alternation of words: the regex engine then
            # skips an alternative by its first character (a look-behind before each
            # word would be tried at every position, word by word)
            words = sorted(self.starts | COLOUR_WORDS, key=len, reverse=True)
            starts = "|".join(re.escape(w) for w in words)
            found = self._triggers[id_pattern] = re.compile(
                rf"\b{id_pattern}\b|(?<!\w)(?:{starts})(?!\w)"
                + r"|\b(?:in stock|available|sold out|out of stock)\b"
                + r"|\b(?:returns?|refunds?|exchanges?|deliver\w*|shipping|dispatch\w*|express)\b",
                re.I,
            )  # fmt: skip
        return found


class GroundingSources:
    """What a turn's answer may state: the turn's products, its tool results, the policy.

    Args:
        products: the products the answer step was handed (objects or dicts with ``id``,
            ``title``, ``price``, ``currency``, ``sizes``; :meth:`ProductRow.of`).
        policy: the shop's policy text (its figures: days, hours, fees).
        tool_results: the turn's tool results as text (their ids and figures count).
        catalogue: every product of the shop (id → row), to name the product a wrong id
            or title belongs to and to recognise titles of products the turn lacks
            (None: only the turn's products' titles are recognised).
        currency: the shop's currency (ISO 4217).
        id_pattern: the shape of a product id (a regular expression).
        titles: the catalogue's :class:`TitleIndex`, built once (None: built here from
            ``catalogue``; a turn's products it lacks are added either way).
    """

    def __init__(
        self,
        products: Iterable[Any] = (),
        *,
        policy: str = "",
        tool_results: Sequence[str] = (),
        catalogue: Mapping[str, ProductRow] | None = None,
        currency: str = "EUR",
        id_pattern: str = DEFAULT_ID_PATTERN,
        titles: TitleIndex | None = None,
    ) -> None:
        self.products = {r.id: r for r in (ProductRow.of(p) for p in products)}
        self.catalogue = dict(catalogue or {})
        self.currency = currency
        self.tool_text = "\n".join(tool_results)
        self.id_pattern = id_pattern
        self.id_re = re.compile(rf"\b{id_pattern}\b")
        self.tool_ids = set(self.id_re.findall(self.tool_text))
        self.tool_amounts = {round(_amount(a), 2) for a in re.findall(_AMOUNT, self.tool_text)}
        index = titles if titles is not None else TitleIndex(self.catalogue.values())
        self.titles = index.with_rows(self.products.values())
        self.title_ids = self.titles.title_ids
        self.title_re = self.titles.regex
        #: the first word of every title (a claim may start there: the engine holds it)
        self.title_starts = self.titles.starts
        self.policy = policy
        self.policy_sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n", policy) if s.strip()]
        self.fees = {_price_of(m)[0] for m in _PRICE.finditer(policy)}
        self.prices = {round(r.price, 2) for r in self.products.values()}

    def known(self, pid: str) -> ProductRow | None:
        return self.products.get(pid) or self.catalogue.get(pid)

    def describe(self, pid: str) -> str:
        row = self.known(pid)
        return f"{pid} ({row.title}, €{row.price:.2f})" if row else pid


def _segments(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, complete) of each segment of ``text``: a complete one ends at a line
    break or a sentence end; the last may be open."""
    out = []
    start = 0
    for m in _SEGMENT_END.finditer(text):
        end = m.end() if m.group(0) == "\n" else m.start()
        if end > start:
            out.append((start, end, True))
        start = end
    if start < len(text):
        out.append((start, len(text), False))
    return out


@dataclass
class _Mention:
    start: int
    end: int
    ids: frozenset[str]
    by: str  # "id" or "title"


def _mentions(src: GroundingSources, seg: str) -> list[_Mention]:
    found = [_Mention(m.start(), m.end(), frozenset({m.group(0)}), "id")
             for m in src.id_re.finditer(seg)]  # fmt: skip
    if src.title_re is not None:
        for m in src.title_re.finditer(seg):
            ids = src.title_ids.get(m.group(0).lower(), set())
            found.append(_Mention(m.start(), m.end(), frozenset(ids), "title"))
    return sorted(found, key=lambda x: x.start)


def _subject(mentions: list[_Mention], pos: int, src: GroundingSources,
             earlier: frozenset[str] = frozenset()) -> frozenset[str]:  # fmt: skip
    """The product(s) a claim at ``pos`` is about: the nearest mention before it (an
    id wins over the title after it), else the first after it; none in its segment: the
    product an earlier segment of the answer named last (``earlier``: "JKT-008 is our
    cheapest. It costs €44.95."), else the turn's only product, if it has one."""
    before = [m for m in mentions if m.end <= pos]
    if before:
        ids_before = [m for m in before if m.by == "id"]
        return (ids_before[-1] if ids_before else before[-1]).ids
    after = [m for m in mentions if m.start >= pos]
    if after:
        return after[0].ids
    if earlier:
        return earlier
    if len(src.products) == 1:
        return frozenset(src.products)
    return frozenset()


def check_segment(src: GroundingSources, seg: str, offset: int = 0,
                  earlier: frozenset[str] = frozenset()) -> list[Claim]:  # fmt: skip
    """The claims of one segment ``seg`` (offsets shifted by ``offset``); ``earlier``:
    the product the answer named last before this segment (see :func:`_subject`)."""
    claims: list[Claim] = []
    mentions = _mentions(src, seg)
    ids_in_seg = [m for m in mentions if m.by == "id"]
    for m in mentions:
        text = seg[m.start : m.end]
        at = (m.start + offset, m.end + offset)
        if m.by == "id":
            (pid,) = m.ids
            if pid in src.products or pid in src.tool_ids:
                claims.append(Claim("product_id", text, *at, pid))
            else:
                where = ("is in the catalogue but not among the products the turn was handed"
                         if pid in src.catalogue else "is no product the turn knows")  # fmt: skip
                claims.append(Claim("product_id", text, *at, pid, False,
                                    f"{src.describe(pid)} {where}"))  # fmt: skip
            continue
        # a title: of the id before it in the segment, or of a product the turn has
        prior = [i for i in ids_in_seg if i.end <= m.start]
        if prior:
            (pid,) = prior[-1].ids
            if pid in m.ids:
                claims.append(Claim("title", text, *at, pid))
            else:
                other = sorted(m.ids)[0] if m.ids else "?"
                row = src.products.get(pid)
                claims.append(Claim("title", text, *at, pid, False,
                                    f"{pid} given the title of {src.describe(other)}",
                                    row.title if row else None))  # fmt: skip
            continue
        mine = sorted(m.ids & set(src.products))
        if mine:
            claims.append(Claim("title", text, *at, mine[0]))
        else:
            owner = sorted(m.ids)[0] if m.ids else None
            named = src.describe(owner) if owner else text
            claims.append(Claim("title", text, *at, owner, False,
                                f"{named} is not among the products the turn was handed"))
    topic = next((name for name, rx in _TOPICS.items() if rx.search(seg)), None)
    for pc in _price_claims(seg, bool(mentions)):
        text = seg[pc.start : pc.end]
        at = (pc.start + offset, pc.end + offset)
        if (topic is not None and not pc.negative and not pc.malformed
                and pc.currency == src.currency and pc.amount in src.fees):  # fmt: skip
            # a fee of the policy in a sentence on its subject ("JKT-008 is €44.95 and
            # delivery is €4.95"), not the product's price
            claims.append(Claim("price", text, *at))
            continue
        subject = _subject(mentions, pc.start, src, earlier)
        if pc.bare and not pc.cued and not subject:
            continue  # a bare number beside no product: not said as a price
        rows = [src.products[i] for i in sorted(subject) if i in src.products]
        if subject and not rows:
            claims.append(Claim("price", text, *at, sorted(subject)[0], False,
                                f"a price of {sorted(subject)[0]}, which the turn was not "
                                "handed"))  # fmt: skip
            continue
        faulty = ("a negative price" if pc.negative else
                  "a malformed price" if pc.malformed else None)  # fmt: skip
        if rows:
            ok = [r for r in rows if abs(r.price - pc.amount) < 0.005]
            row = ok[0] if ok else rows[0]
            if faulty is not None:
                why = f"{text} is {faulty}; {row.id} costs €{row.price:.2f}"
            elif pc.currency != src.currency:
                why = f"{text} is in {pc.currency}; {row.id} costs €{row.price:.2f}"
            elif ok:
                claims.append(Claim("price", text, *at, row.id))
                continue
            else:
                why = f"{text} differs from {row.id}'s price €{row.price:.2f}"
            claims.append(Claim("price", text, *at, row.id, False, why,
                                format_price(row.price, text)))  # fmt: skip
            continue
        if faulty is None and pc.currency == src.currency and (
            pc.amount in src.prices or pc.amount in src.fees or pc.amount in src.tool_amounts
        ):
            claims.append(Claim("price", text, *at))
        else:
            why = (f"{text} is {faulty}" if faulty is not None
                   else f"no product, fee or tool result of the turn costs {text}")  # fmt: skip
            claims.append(Claim("price", text, *at, None, False, why))
    for pattern, in_stock in _STOCK:
        for sm in pattern.finditer(seg):
            subject = _subject(mentions, sm.start(), src, earlier)
            rows = [src.products[i] for i in sorted(subject) if i in src.products]
            if not rows:
                continue  # about no product the turn has: the id or title claim says so
            row = rows[0]
            sizes = [s for s in _SIZE_TOKEN.findall(sm.group("sizes"))]
            at = (sm.start() + offset, sm.end() + offset)
            bad = []
            for size in sizes:
                n = row.sizes.get(size)
                if n is None:
                    bad.append(f"{row.id} has no size {size}")
                elif in_stock and n <= 0:
                    bad.append(f"{row.id} is sold out in {size}")
                elif not in_stock and n > 0:
                    bad.append(f"{row.id} has {n} in stock in {size}")
            if bad:
                claims.append(Claim("stock", sm.group(0), *at, row.id, False, "; ".join(bad)))
            else:
                claims.append(Claim("stock", sm.group(0), *at, row.id))
    claims += _colour_claims(src, seg, offset, mentions, earlier)
    if topic is not None and src.policy:
        for fm in _FIGURE.finditer(seg):
            figure = fm.group("n") + (f"-{fm.group('m')}" if fm.group("m") else "")
            unit = "hour" if fm.group("unit").lower().startswith("hour") else "day"
            at = (fm.start() + offset, fm.end() + offset)
            on_topic = [s for s in src.policy_sentences if _TOPICS[topic].search(s)]
            given = _policy_figures(on_topic or src.policy_sentences, unit)
            if figure in given:
                claims.append(Claim("policy", fm.group(0), *at))
            else:
                said = ", ".join(sorted(given)) or "none"
                claims.append(Claim("policy", fm.group(0), *at, None, False,
                                    f"the policy on {topic} gives {unit}s {said}, not "
                                    f"{figure}"))  # fmt: skip
    return sorted(claims, key=lambda c: c.start)


def _colour_claims(src: GroundingSources, seg: str, offset: int, mentions: list[_Mention],
                   earlier: frozenset[str]) -> list[Claim]:  # fmt: skip
    """The colour claims of ``seg`` (see :data:`_COLOUR_CLAIM`): each colour word must be
    one of the colours of the product it is said of (subject as for prices), or a shade
    of one (:func:`chainrun.checks.colours.colour_grounded`). Not a claim: a question
    (the shopper's words asked back), words in quotes or in a product title, a colour
    after a negation, a colour of a product the turn lacks or whose colours are not
    known."""
    if seg.rstrip().endswith("?") or not _COLOUR_WORD.search(seg):
        return []
    quoted = [m.span() for m in _QUOTED.finditer(seg)]
    out: list[Claim] = []
    for cm in _COLOUR_CLAIM.finditer(seg):
        group = "c1" if cm.group("c1") else "c2"
        lo, hi = cm.span(group)
        if any(a <= lo < b for a, b in quoted) or _NEGATION.search(seg, 0, lo):
            continue
        if any(m.start <= lo < m.end for m in mentions):
            continue  # a title's own colour ("... Rain Jacket (yellow)")
        subject = _subject(mentions, lo, src, earlier)
        rows = [src.products[i] for i in sorted(subject) if i in src.products]
        rows = [r for r in rows if r.colours]
        if not rows:
            continue  # about no product the turn has, or colours not known
        for wm in _COLOUR_WORD.finditer(seg, lo, hi):
            word = wm.group(0)
            at = (wm.start() + offset, wm.end() + offset)
            ok = [r for r in rows if colour_grounded(word, r.colours)]
            if ok:
                out.append(Claim("colour", word, *at, ok[0].id))
            else:
                row = rows[0]
                out.append(Claim("colour", word, *at, row.id, False,
                                 f"{row.id} comes in {', '.join(row.colours)}, not "
                                 f"{word.lower()}"))  # fmt: skip
    return out


def _policy_figures(sentences: Sequence[str], unit: str) -> set[str]:
    out = set()
    for s in sentences:
        for fm in _FIGURE.finditer(s):
            u = "hour" if fm.group("unit").lower().startswith("hour") else "day"
            if u == unit:
                out.add(fm.group("n") + (f"-{fm.group('m')}" if fm.group("m") else ""))
    return out


def last_named(src: GroundingSources, seg: str) -> frozenset[str]:
    """The product ``seg`` names last (an id, else a title), or none."""
    mentions = _mentions(src, seg)
    ids = [m for m in mentions if m.by == "id"]
    return (ids or mentions)[-1].ids if mentions else frozenset()


def check_text(src: GroundingSources, text: str) -> list[Claim]:
    """Every claim of a whole answer ``text`` (all its segments complete)."""
    out: list[Claim] = []
    earlier: frozenset[str] = frozenset()
    for s, e, _ in _segments(text):
        out += check_segment(src, text[s:e], s, earlier)
        earlier = last_named(src, text[s:e]) or earlier
    return out


class StreamGrounding:
    """The grounding check of one answer stream, for the hold-back engine.

    Called with the text the engine holds (``await check(held, final=...)``); told what
    it released (:meth:`released`). It judges each segment once it is complete (or at
    the end), and returns the :class:`~chainrun.checks.holdback.WindowVerdict`: pass,
    redactions (a correction or a dropped segment, by ``action``), a block (``replace``
    or ``refuse``), and ``hold_from``: the offset of the held text from which nothing
    may be released yet (an open segment from its first possible claim).

    Attributes:
        claims: every claim judged, in order.
        actions: what was done, one entry per ungrounded claim (``corrected``,
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
        self._context = ""  # released text of the segment still open
        self._judged = 0  # chars of the held text already judged (complete segments)
        self._kept_any = False  # a segment with content reached (or will reach) the shopper
        self._released_any = False  # some of the answer has reached the shopper
        #: the product the answer named last, for a claim whose segment names none
        self._last_named: frozenset[str] = frozenset()
        self._triggers = sources.titles.triggers(sources.id_pattern)

    def released(self, piece: str) -> None:
        """The engine released ``piece``: it is context for the segment still open."""
        self._context += piece
        self._released_any = self._released_any or bool(piece.strip())
        self._judged = max(0, self._judged - len(piece))
        cut = max(self._context.rfind("\n"), -1)
        for m in _SEGMENT_END.finditer(self._context):
            cut = max(cut, m.end() if m.group(0) == "\n" else m.start())
        if cut > 0:
            self._context = self._context[cut:]

    def _held_tail(self, tail: str) -> int | None:
        """Where in ``tail`` (the open, unreleased part of a segment) a claim may be being
        written, so that nothing from there is released yet: its last word if it may
        still become an id, a title's first word, a currency or a stock phrase, or a
        number (or currency sign) that a currency or unit may follow; None: nothing."""
        if not tail:
            return None
        words = list(re.finditer(r"\S+", tail))
        if not words:
            return None
        last = words[-1]
        complete = last.end() < len(tail)  # white space after it
        word = last.group(0)
        if re.match(r"^[(\[]?[€$£]|^[(\[]?\d", word) or re.search(r"[€$£]", word):
            return last.start()  # a number or a currency: what follows may make it a price
        if complete:
            # a currency written before its amount ("EUR 5.00"): the amount may follow
            if word.lower().strip("(:") in _CURRENCY_BEFORE:
                return last.start()
            return None
        if word.startswith("[") or re.fullmatch(r"[A-Z]{1,5}-?\d*", word):
            return last.start()  # an id being written
        low = word.lower()
        if any(w.lower().startswith(low) for w in self.sources.title_starts) or any(
            p.startswith(low) for p in ("eur", "usd", "gbp", "euro", "in", "available", "sold")
        ) or any(c.startswith(low) for c in COLOUR_WORDS):
            return last.start()
        return None

    def judge(self, text: str) -> WindowVerdict:
        """The verdict on a whole answer ``text`` (not streamed: every segment complete)."""
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
        for start, end, complete in _segments(full):
            if end <= base + self._judged and complete:
                continue  # judged by an earlier call
            if not complete and not final:
                open_at = max(start, base)  # where the unreleased part of the segment starts
                trig = self._triggers.search(full, start)
                tail_at = self._held_tail(full[open_at:end])
                claim_at = _first_claim(full[open_at:end])
                if trig is not None and trig.start() < end:
                    hold_from = open_at - base  # the segment holds a claim: judge it whole
                elif claim_at is not None:
                    # a price or a stock claim whose product may come after it ("€5.00
                    # for JKT-008"): nothing from it on is released before the segment
                    # is complete and judged
                    hold_from = open_at + claim_at - base
                elif tail_at is not None:
                    hold_from = open_at + tail_at - base
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
            if self._released_any:  # the shopper saw the start: the safe text after it
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
        """Apply the action to a segment's ungrounded claims (offsets of ``full``)."""
        why = "; ".join(f"{c.kind} {c.text!r}: {c.why}" for c in bad)
        if self.action == "flag":
            self.actions.extend({"claim": c.text, "action": "flagged"} for c in bad)
            return None
        if self.action in ("replace", "refuse"):
            self.actions.extend({"claim": c.text, "action": self.action + "d"} for c in bad)
            return WindowVerdict(False, f"ungrounded: {why}")
        correctable = self.action == "correct" and all(
            c.correction is not None and c.start >= base for c in bad
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
        """The turn's grounding record: claims checked, the ungrounded ones and why, what
        was done, and the CPU per call (µs)."""
        bad = [c for c in self.claims if not c.grounded]
        cpu = sorted(self.check_us)
        return {
            "action": self.action,
            "claims": len(self.claims),
            "ungrounded": [c.as_json() for c in bad],
            "n_ungrounded": len(bad),
            "done": [{k: v for k, v in a.items() if k != "segment_dropped"}
                     for a in self.actions],
            "grounded": not bad,
            "checks": len(cpu),
            "cpu_us_p50": round(cpu[len(cpu) // 2], 1) if cpu else None,
            "cpu_us_max": round(cpu[-1], 1) if cpu else None,
        }  # fmt: skip


#: currency words and codes a shop writes before an amount ("EUR 5.00", "USD 19")
_CURRENCY_BEFORE = frozenset({"eur", "usd", "gbp", "chf", "€", "$", "£"})


def _first_claim(text: str) -> int | None:
    """Where in ``text`` (an open segment's unreleased part) the first price or stock
    claim starts (None: none): a bare amount with two decimals, or after a price word,
    counts (the product that makes it a price may come after it)."""
    starts = [m.start() for pattern, _ in _STOCK for m in pattern.finditer(text)]
    if _DIGIT.search(text):  # every price has a digit
        starts += [m.start() for m in _PRICE.finditer(text)]
        starts += [m.start() for m in _BARE.finditer(text)
                   if _is_bare_price(text, m, True)]  # fmt: skip
    return min(starts) if starts else None


def _merge(redactions: list[Redaction]) -> list[Redaction]:
    """Redactions without overlaps (a dropped segment swallows corrections inside it)."""
    out: list[Redaction] = []
    for r in sorted(redactions, key=lambda r: (r.start, -(r.end - r.start))):
        if out and r.start < out[-1].end:
            continue
        out.append(r)
    return out
