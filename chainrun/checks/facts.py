"""What a sentence of an answer states, read without judging it.

The grounding check (:mod:`chainrun.checks.grounding`) reads an answer sentence by
sentence (:func:`segments`: a line, or a sentence ending in ``.``, ``!`` or ``?`` before
white space, not after an abbreviation such as "ca." or "incl."), and in each:

- :func:`mentions`: the products it names: by id (``JKT-013``), by title (the
  catalogue's, with or without its trailing colour), or by a word of a title of a
  product the conversation showed ("the daypack");
- :func:`amounts`: every amount of money (:func:`chainrun.money.find_money`: the
  locale's format first, then price-parser's reading of the number's shape), and the
  bare numbers said as a price ("costs 19.99"), each with its **role**: a price
  (``unit``), an approximation ("about 120 EUR"), a bound ("under 100 EUR"), the low
  end of a price ("from €199"), the ends of a range ("€40–€60"), or an earlier price
  ("was €59.95");
- :class:`Cues`: the words that make an amount derived: a quantity ("two jackets"), a
  total ("come to", "together"), a difference ("€5 cheaper than"), a fee ("delivery"),
  VAT ("excl. VAT"), a discount ("20% off").

Where the words decide, they are English (plus the common German and French VAT and
approximation words); the amounts and currencies are read in any CLDR locale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from chainrun.checks.sources import DISCOUNT
from chainrun.checks.wording import ending, starting, words
from chainrun.money import find_money, minor_digits, read_in_text

if TYPE_CHECKING:
    from chainrun.checks.sources import GroundingSources

__all__ = [
    "Amount",
    "Cues",
    "Mention",
    "amounts",
    "cues_of",
    "mentions",
    "segments",
    "subject",
]

# -- sentences -------------------------------------------------------------------------------

_SEGMENT_END = re.compile(r"\n|(?<=[.!?])(?=\s)")
#: words after whose full stop a sentence goes on ("ca. 120 EUR", "incl. VAT")
_ABBREVIATIONS = frozenset(
    """ca approx incl excl inc ex e.g i.e eg ie etc vs no nr art approx. fr mr mrs ms dr st
    min max p.a resp""".split()
)
_WORD_BEFORE = re.compile(r"([\w.]+)\.$")


def segments(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, complete) of each segment of ``text``: a complete one ends at a line
    break or a sentence end; the last may be open. A segment holds the white space
    before it, so that dropping it leaves the sentences around it as they were."""
    out = []
    start = 0
    for m in _SEGMENT_END.finditer(text):
        end = m.end() if m.group(0) == "\n" else m.start()
        if m.group(0) != "\n":
            word = _WORD_BEFORE.search(text, max(0, end - 12), end)
            if word is not None and word.group(1).lower() in _ABBREVIATIONS:
                continue
        if end > start:
            out.append((start, end, True))
        start = end
    if start < len(text):
        out.append((start, len(text), False))
    return out


# -- products named --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mention:
    """A product named in a sentence: its offsets, the ids it may be, and how it was named
    (``id``, ``title`` or ``noun``: a word of the title of a product shown)."""

    start: int
    end: int
    ids: frozenset[str]
    by: str


_WORD = re.compile(r"[A-Za-zÀ-ÿ]+(?:'s)?")
_DIGIT = re.compile(r"\d")


def _noun_mentions(src: GroundingSources, seg: str, taken: list[tuple[int, int]]) -> list[Mention]:
    """Runs of title words of the conversation's products ("the rain jacket"), outside
    ids and titles; a run's ids are the products whose titles hold all its words. A
    word of no nearby product's title names the catalogue's products that hold it."""
    nouns = src.titles.nouns
    nearby = set(src.nearby)
    out: list[Mention] = []
    run: Mention | None = None
    for m in _WORD.finditer(seg):
        word = m.group(0).lower()
        if any(a <= m.start() < b for a, b in taken):
            run = None
            continue
        ids = nouns.get(word) or nouns.get(word.rstrip("s")) or (
            nouns.get(word[:-2]) if word.endswith("es") else None)  # fmt: skip
        if not ids:
            if run is not None and seg[run.end : m.start()].strip():
                run = None
            continue
        mine = ids & nearby if nearby else set()
        chosen = frozenset(mine or ids)
        if run is not None and not seg[run.end : m.start()].strip() and run.ids & chosen:
            run = Mention(run.start, m.end(), run.ids & chosen, "noun")
            out[-1] = run
        else:
            run = Mention(m.start(), m.end(), chosen, "noun")
            out.append(run)
    return out


def mentions(src: GroundingSources, seg: str) -> list[Mention]:
    """The products ``seg`` names, in order (an id, a title, or a run of title words);
    kept per sentence on ``src`` (a sentence is read twice: its claims, then the product
    it names last for the next one)."""
    cache = src.mention_cache
    found = cache.get(seg)
    if found is None:
        found = cache[seg] = _find_mentions(src, seg)
        if len(cache) > 256:
            cache.pop(next(iter(cache)))
    return found


def _find_mentions(src: GroundingSources, seg: str) -> list[Mention]:
    found = [Mention(m.start(), m.end(), frozenset({m.group(0)}), "id")
             for m in src.id_re.finditer(seg)]  # fmt: skip
    if src.title_re is not None:
        for m in src.title_re.finditer(seg):
            ids = src.title_ids.get(m.group(0).lower(), set())
            found.append(Mention(m.start(), m.end(), frozenset(ids), "title"))
    taken = [(x.start, x.end) for x in found]
    found += _noun_mentions(src, seg, taken)
    return sorted(found, key=lambda x: x.start)


def subject(mentions: list[Mention], pos: int, src: GroundingSources,
            earlier: frozenset[str] = frozenset()) -> frozenset[str]:  # fmt: skip
    """The product(s) a claim at ``pos`` is about: the nearest mention before it (an id
    over the title after it, a title over a title word), else the first after it; none
    in its sentence: the product an earlier sentence named last (``earlier``: "JKT-008
    is our cheapest. It costs €44.95."), else the turn's only product, if it has one."""
    before = [m for m in mentions if m.end <= pos]
    if before:
        strong = [m for m in before if m.by != "noun"]
        if not strong:
            return before[-1].ids
        ids = [m for m in strong if m.by == "id"]
        chosen = (ids[-1] if ids else strong[-1]).ids
        last = before[-1]
        if last.by == "noun" and last.start >= strong[-1].end and not last.ids & chosen:
            return last.ids  # "JKT-008 is light, but the tent costs ...": the tent
        return chosen
    after = [m for m in mentions if m.start >= pos]
    if after:
        return after[0].ids
    if earlier:
        return earlier
    if len(src.products) == 1:
        return frozenset(src.products)
    return frozenset()


# -- amounts ---------------------------------------------------------------------------------

#: what may close a price that precedes it and makes it malformed ("€44.95.00")
_MALFORMED_TAIL = re.compile(r"(?:[.,]?\d)+")
#: a minus sign just before a price, that does not close a range ("€30-€45") or a word
_NEG_BEFORE = re.compile(r"(?<![\w€$£.,\-−])[-−]\s?$")
_BARE_NUMBER = (
    r"\d{1,3}(?:,\d{3})+(?:\.\d{1,2})?|\d{1,3}(?:\.\d{3})+(?:,\d{1,2})?|\d{1,6}(?:[.,]\d{1,2})?"
)
#: a bare amount (no currency), a price only in context (see :func:`_bare_price`)
_BARE = re.compile(
    rf"(?<![\w.,€$£\-−/#'’])(?P<neg>[-−])?(?P<amount>{_BARE_NUMBER})(?![\w%]|[.,]\d|-\d|['’]\d)"
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
_UNIT_AFTER = starting(
    "mm", "cm", "m", "km", "kg", "g", "l", "ml", "ft", "inch(?:es)?", "hours?", "days?",
    "weeks?", "months?", "years?", "mins?", "minutes?", "am", "pm", "h", "x", "stars?",
    "pairs?", "pieces?", "items?", "units?", "pcs", "people", "persons?", "layers?",
    "percent", "%", "out of", "°", "degrees?", "litres?", "liters?", "g/m",
)
#: words before an amount that make it an approximation ("about 120 EUR")
_APPROX_BEFORE = ending(
    "about", "around", "approximately", "approx\\.?", "roughly", "circa", "ca\\.", "~",
    "nearly", "almost", "close to", "just (?:under|over|below|above)",
    "a (?:little|bit) (?:under|over|less than|more than)", "in the region of", "ungefähr",
    "etwa", "rund", "environ", "some",
)
_APPROX_AFTER = starting("or so", "-?ish")
#: words before an amount that make it a bound: below it ("under"), above it ("over")
_BOUND_BELOW = ending(
    "under", "below", "less than", "up to", "at most", "max(?:imum)?\\.?", "no more than",
    "not more than", "within", "budget of", "budget", "spend(?:ing)?",
)
_BOUND_ABOVE = ending("over", "above", "more than", "at least", "min(?:imum)?\\.?",
                      "orders? (?:over|above|of|from)")  # fmt: skip
_FROM = ending("from", "starting (?:at|from)", "starts? (?:at|from)", "ab")
#: words before an amount that make it an earlier price ("was €59.95")
_WAS = ending(
    "was", "were", "originally", "reduced from", "down from", "instead of",
    "regular(?:ly)?(?: price)?", "usual(?:ly)?(?: price)?", "normally", "RRP", "list price",
    "compare at", "statt",
)
#: between the two ends of a range ("€40–€60", "€40 to €60", "between €40 and €60")
_RANGE_JOIN = re.compile(r"^\s*(-|–|—|to|and|bis)\s*$", re.I)
_BETWEEN = ending("between")
#: the shopper's words repeated: a bound there is theirs, not a claim
_ECHO = words(
    "you (?:asked|said|mentioned|want(?:ed)?|need(?:ed)?|(?:are|were) looking)",
    "you're looking", "your budget", "looking for",
)

Role = str  # "unit" | "approx" | "below" | "above" | "from" | "range_low" | "range_high" | "was"


@dataclass(frozen=True)
class Amount:
    """An amount a sentence states.

    Attributes:
        start, end: offsets in the sentence.
        text: as written.
        value: the amount, in ``currency`` units (None: unreadable, ``why``).
        currency: ISO 4217 code (the shop's for a bare amount).
        role: ``unit`` (said as a price), ``approx``, ``below`` / ``above`` (a bound),
            ``from`` (the lowest price of what it is about), ``range_low`` /
            ``range_high`` (a range's ends), ``was`` (an earlier price).
        bare: written with no currency; ``cued``: after a price word ("costs 19.99").
        negative, malformed, cents: a minus sign; a tail that makes it no amount
            ("€44.95.00"); written in cents.
        why: why ``value`` is None.
    """

    start: int
    end: int
    text: str
    value: Decimal | None
    currency: str
    role: Role = "unit"
    bare: bool = False
    cued: bool = False
    negative: bool = False
    malformed: bool = False
    cents: bool = False
    why: str | None = None


def _role(seg: str, start: int, end: int) -> Role:
    before = seg[max(0, start - 30) : start]
    if _APPROX_BEFORE.search(before) or _APPROX_AFTER.match(seg, end):
        return "approx"
    if _WAS.search(before):
        return "was"
    if _BOUND_BELOW.search(before):
        return "below"
    if _BOUND_ABOVE.search(before):
        return "above"
    if _FROM.search(before):
        return "from"
    return "unit"


def _bare_price(seg: str, bm: re.Match[str], names_product: bool) -> str | None:
    """Whether the bare amount ``bm`` of ``seg`` is said as a price: after a price word
    ("costs 19.99", "priced at 45"); or, written with two decimals ("19.99"), after
    "for", "now", "only" or a column bar, or in a segment that names a product
    ("JKT-008 19.99"). Never a size ("EU 42"), an order or item number ("order 1042"),
    a time ("at 10.30") or a measure or count ("2.50 m", "10 days"). Returns ``"cued"``
    (after a price word), ``"beside"`` (the others) or None (no price)."""
    before = seg[max(0, bm.start() - 40) : bm.start()]
    if _UNIT_AFTER.match(seg, bm.end()):
        return None
    if _PRICE_CUE.search(before):
        return "cued"
    if _NOT_PRICE_BEFORE.search(before) or not re.search(r"[.,]\d\d$", bm["amount"]):
        return None
    return "beside" if names_product or _PRICE_CUE_DECIMAL.search(before) else None


def amounts(src: GroundingSources, seg: str, names_product: bool) -> list[Amount]:
    """The amounts ``seg`` states, in order, each with its role (see :class:`Amount`):
    every amount with a currency, and each bare amount said as a price
    (``names_product``: the segment names a product). The second end of a range may
    be bare ("€40-60")."""
    if _DIGIT.search(seg) is None:
        return []
    out: list[Amount] = []
    ids = [m.span() for m in src.id_re.finditer(seg)]
    taken: list[tuple[int, int]] = list(ids)
    for mt in find_money(seg, src.currency, src.locale):
        start, end = mt.start, mt.end
        if any(a < end and start < b for a, b in ids):
            continue  # inside a product id
        if start and mt.text[0].isdigit() and (seg[start - 1].isalnum()
                                               or seg[start - 1] in "._,'’"):
            continue  # the tail of a longer number or word ("x49 EUR")
        tail = _MALFORMED_TAIL.match(seg, end)
        if tail is not None and tail.end() > end:
            end = tail.end()
        lead = _NEG_BEFORE.search(seg, max(0, start - 2), start)
        if lead is not None:
            start = lead.start()
        taken.append((start, end))
        out.append(Amount(start, end, seg[start:end], mt.amount, mt.currency,
                          _role(seg, start, end), False, False,
                          lead is not None or mt.negative, tail is not None, mt.cents,
                          mt.why))  # fmt: skip
    for bm in _BARE.finditer(seg):
        if any(a <= bm.start() < b or a < bm.end() <= b for a, b in taken):
            continue
        said = _bare_price(seg, bm, names_product)
        # a range's bare second end: "€40-60", "€40 to 60"
        prev = out[-1] if out else None
        ranged = prev is not None and not prev.bare and bool(
            _RANGE_JOIN.match(seg[prev.end : bm.start()]))
        if not said and not ranged:
            continue
        cur = prev.currency if ranged and prev is not None else src.currency
        value, why = read_in_text(bm["amount"], cur, src.locale)
        out.append(Amount(bm.start(), bm.end(), bm.group(0), value, cur,
                          _role(seg, bm.start(), bm.end()), True, said == "cued",
                          bool(bm["neg"]), why=why))  # fmt: skip
    out.sort(key=lambda a: a.start)
    return _ranges(seg, out)


def _ranges(seg: str, found: list[Amount]) -> list[Amount]:
    """Pairs of amounts joined as a range ("€40–€60", "between €40 and €60", "from €40
    to €60") get the roles ``range_low`` and ``range_high``."""
    out = list(found)
    for i in range(len(out) - 1):
        a, b = out[i], out[i + 1]
        join = _RANGE_JOIN.match(seg[a.end : b.start])
        if join is None or a.role not in ("unit", "from", "approx"):
            continue
        if join.group(1).lower() == "and" and not _BETWEEN.search(seg, max(0, a.start - 12),
                                                                 a.start):  # fmt: skip
            continue  # "cost €44.95 and €124.00": two prices, not a range
        out[i] = _with_role(a, "range_low")
        out[i + 1] = _with_role(b, "range_high")
    return out


def _with_role(a: Amount, role: Role) -> Amount:
    return Amount(a.start, a.end, a.text, a.value, a.currency, role, a.bare, a.cued,
                  a.negative, a.malformed, a.cents, a.why)  # fmt: skip


# -- the words that make an amount derived ---------------------------------------------------

_QTY_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
              "nine": 9, "ten": 10, "both": 2, "twice": 2, "pair": 2, "couple": 2}  # fmt: skip
_QTY = re.compile(
    r"(?<![\w.,€$£-])(?:(?P<n>\d{1,2})\s?[x×]|[x×]\s?(?P<m>\d{1,2})|(?P<k>\d{1,2})(?=\s+[A-Za-z])|"
    r"(?P<w>two|three|four|five|six|seven|eight|nine|ten|both|twice|couple))(?![\w.,])",
    re.I,
)
_TOTAL = words(
    "totals?", "together", "altogether", "in all", "combined", "come to", "comes to",
    "came to", "coming to", "add up", "adds up", "sum", "for both", "both for",
    "for the (?:two|pair)", "would (?:be|cost)", "will (?:be|cost)", "makes?", "plus",
    "including", "incl\\.?", "with",
)
#: words that say an amount is a sum (narrower than :data:`_TOTAL`)
_SUM_SAID = words("totals?", "together", "altogether", "in all", "combined", "comes? to",
                  "came to", "coming to", "adds? up", "for both", "both for",
                  "for the (?:two|pair)", "would (?:be|cost)", "in total")  # fmt: skip
_EACH = words("each", "apiece", "a piece", "per (?:piece|item|unit|pair|person)")
#: a comparative just after an amount: it is a difference ("€5 cheaper than")
_COMPARATIVE_AFTER = starting("cheaper", "less", "more", "dearer", "pricier", "extra",
                              "above", "below", "over", "under")  # fmt: skip
_DIFFERENCE = words("cheaper", "less", "more", "dearer", "pricier", "difference", "differ\\w*",
                    "saves?", "saving", "savings", "extra", "than", "additional")  # fmt: skip
_FEE = words("deliver\\w*", "shipping", "ships?", "shipped", "postage", "express", "courier",
             "fees?", "surcharge", "P&P", "carriage", "label", "free")  # fmt: skip
_VAT_NAMES = ("VAT", "MwSt\\.?", "Mehrwertsteuer", "TVA", "IVA", "sales tax")
_VAT = words(*_VAT_NAMES, "tax(?:es)?")
_VAT_EXCL = re.compile(
    r"\b(?:excl\.?|excluding|exclusive\s+of|plus|before|without|net\s+of|ex\.?|zzgl\.?|"
    r"ohne|hors)\s+(?:\w+\s+)?(?:VAT|MwSt|tax|TVA|IVA)|\bnet\b|\+\s*(?:VAT|MwSt)",
    re.I,
)
#: a price said without VAT, just after it ("€37.46 excl. VAT", "CHF 1'201.67 net")
_VAT_EXCL_AFTER = starting(
    "(?:excl\\.?|excluding|exclusive of|plus|before|without|net of|ex\\.?|zzgl\\.?|ohne|hors) "
    "(?:\\w+ )?(?:VAT|MwSt|tax|TVA|IVA)", "net",
)
_VAT_PART = ending("(?:VAT|MwSt\\.?|tax) (?:of|is|amounts to|comes to|:)")
_VAT_PART_AFTER = starting("(?:of|in|as) (?:VAT|MwSt|tax)")


@dataclass(frozen=True)
class Cues:
    """The words of a sentence that make an amount derived.

    Attributes:
        quantities: the multipliers it states ("two jackets" → 2; "both" → 2).
        total: it speaks of a total ("come to", "together", "plus", "including").
        difference: of a difference ("cheaper", "more than", "save").
        fee: of a fee or delivery ("delivery", "shipping", "fee").
        vat: of VAT; ``vat_excl``: a price without it ("excl. VAT", "net").
        discount: of a discount ("20% off", "discount", "sale").
        echo: the shopper's words repeated ("you asked for ... under 100 EUR").
        sum_said: an amount is said as a sum ("come to", "together", "in total").
        each: an amount is said per piece ("each", "apiece").
    """

    quantities: frozenset[int]
    total: bool
    difference: bool
    fee: bool
    vat: bool
    vat_excl: bool
    discount: bool
    echo: bool
    sum_said: bool = False
    each: bool = False

    @property
    def derived(self) -> bool:
        """Whether any amount of the sentence may be other than a unit price."""
        return bool(self.quantities or self.total or self.difference or self.fee or self.vat
                    or self.discount)  # fmt: skip


def cues_of(seg: str, spans: list[tuple[int, int]]) -> Cues:
    """The cues of ``seg``; ``spans``: the offsets of its amounts and product ids (a
    number inside one is no quantity)."""
    qty: set[int] = set()
    for m in _QTY.finditer(seg):
        if any(a <= m.start() < b for a, b in spans):
            continue
        n = m.group("n") or m.group("m") or m.group("k")
        k = int(n) if n else _QTY_WORDS[m.group("w").lower()]
        if 2 <= k <= 20:
            qty.add(k)
    return Cues(frozenset(qty), bool(_TOTAL.search(seg)), bool(_DIFFERENCE.search(seg)),
                bool(_FEE.search(seg)), bool(_VAT.search(seg)), bool(_VAT_EXCL.search(seg)),
                bool(DISCOUNT.search(seg)), bool(_ECHO.search(seg)),
                bool(_SUM_SAID.search(seg)), bool(_EACH.search(seg)))  # fmt: skip


def said_as_difference(seg: str, a: Amount) -> bool:
    """Whether ``a`` is said as a difference ("€5 cheaper than", "€10 more")."""
    return bool(_COMPARATIVE_AFTER.match(seg, a.end))


def vat_excluded(seg: str, a: Amount) -> bool:
    """Whether ``a`` is said as a price without VAT ("€37.46 excl. VAT")."""
    return bool(_VAT_EXCL_AFTER.match(seg, a.end))


def vat_part(seg: str, a: Amount) -> bool:
    """Whether ``a`` is said as the VAT within a price ("VAT of €7.18", "€7.18 of VAT")."""
    return bool(_VAT_PART.search(seg[max(0, a.start - 25) : a.start])
                or _VAT_PART_AFTER.match(seg, a.end))  # fmt: skip


def step(currency: str) -> Decimal:
    """The smallest amount of ``currency`` (0.01 for EUR)."""
    return Decimal(1).scaleb(-minor_digits(currency))
