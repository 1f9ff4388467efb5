"""The grounding check's judgement of a sentence: each fact it states against the sources.

A sentence's facts (:mod:`chainrun.checks.facts`) become :class:`Claim` s, each judged
true, false, or **not judged** (the sources cannot say: a product no source knows, an
amount that cannot be read, VAT when the policy gives no rate):

- ``product_id``: an id of a product the catalogue (or the turn, the conversation, a
  tool result) holds; another is false (not judged when no catalogue is known).
- ``title``: a catalogue title; after an id in the same sentence it must be that id's
  ("JKT-013 given the title of JKT-005").
- ``price``: an amount about the product its sentence names (by id, title, a word of
  its title, or the product the sentence before named; none named: one the turn or
  the conversation showed). True when it is that product's price, or a value the
  sentence's words derive from the sources: k × the price ("two jackets come to"), the
  sum of the prices named ("together"), a difference of two ("€5 cheaper than"), a
  price plus a policy fee ("with delivery"), a price without VAT or the VAT in it at
  the policy's rate; within :data:`APPROX_TOLERANCE` after "about" or "around". A bound
  ("under €100") holds when every product it is about is under it, "from €199" when
  the cheapest is, a range ("€40–€60") when every product it is about is in it; the
  shopper's own bound repeated ("you asked for under €100") is no claim.
- ``fee``: an amount in a sentence on delivery, returns or fees: one of the policy's.
- ``discount``: a discount percentage, an earlier price ("was €59.95"), or a discount
  offered ("on sale", "a discount"): only what the policy offers; the catalogue has
  no earlier prices, so "was" is never so.
- ``stock``, ``colour``: sizes in stock or sold out, colours, against the product's row.
- ``policy``: days and hours in a sentence on a policy subject (delivery, returns,
  refunds, exchanges, cancelling, faults), or said in working days anywhere: one the
  policy gives on that subject. ``country``: a country delivered to (or not), against
  the countries the policy's delivery sentences name.

:data:`CORRECTABLE` describes the only claims a ``correct`` action rewrites: a unit price
or a title of the one product its sentence names by id or title, in a sentence with no
word that makes an amount derived. Every other false or unjudged claim drops its
sentence: nothing is ever rewritten into a number the sources do not give for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from chainrun.checks.colours import COLOUR_WORDS, SHADE_WORDS, colour_grounded
from chainrun.checks.facts import (
    Amount,
    Cues,
    Mention,
    amounts,
    cues_of,
    mentions,
    said_as_difference,
    segments,
    step,
    subject,
    vat_excluded,
    vat_part,
)
from chainrun.checks.sources import (
    NEGATION,
    OFFER_WORDS,
    GroundingSources,
    ProductRow,
    countries_in,
    figures_in,
    topics_of,
)
from chainrun.checks.wording import ending, starting, words
from chainrun.money import format_money, format_number, minor_digits, quantize

__all__ = ["APPROX_TOLERANCE", "CORRECTABLE", "Claim", "check_segment", "check_text",
           "last_named"]  # fmt: skip

#: how far an approximation ("about €50") may be from the value it is judged against, as
#: a share of that value: 10% lets "about €50" stand for €44.95 to €55.55 and stops
#: "about 120 EUR" for €1,299 (a choice of this project, written in the docs)
APPROX_TOLERANCE = Decimal("0.10")

CORRECTABLE = (
    "a unit price or a title of the one product its sentence names by id or title, in a "
    "sentence with no quantity, total, difference, fee, VAT or discount word"
)


@dataclass(frozen=True)
class Claim:
    """One fact the answer states, and what the check made of it.

    Attributes:
        kind: ``product_id``, ``title``, ``price``, ``fee``, ``discount``, ``stock``,
            ``colour``, ``policy`` or ``country``.
        text: the claim as written.
        start, end: its offsets in the checked text.
        product: the id the claim is about (None: none).
        grounded: whether the sources say so (False when false or not judged).
        why: why not (None when grounded).
        correction: the text that would make it true (None: none known, or not
            :data:`CORRECTABLE`).
        judged: False when the sources cannot say whether it is so (``grounded`` is then
            False too: the claim is not shown).
    """

    kind: str
    text: str
    start: int
    end: int
    product: str | None = None
    grounded: bool = True
    why: str | None = None
    correction: str | None = None
    judged: bool = True

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "text": self.text, "product": self.product,
                               "grounded": self.grounded}  # fmt: skip
        if not self.judged:
            out["judged"] = False
        if not self.grounded:
            out["why"] = self.why
            if self.correction is not None:
                out["correction"] = self.correction
        return out


def _unjudged(kind: str, text: str, at: tuple[int, int], why: str,
              product: str | None = None) -> Claim:  # fmt: skip
    return Claim(kind, text, *at, product, False, why, None, False)


# -- products named: ids and titles ----------------------------------------------------------


def _named_claims(src: GroundingSources, seg: str, offset: int,
                  ms: list[Mention]) -> tuple[list[Claim], set[str]]:  # fmt: skip
    """The id and title claims of ``seg``, and the distinct products it names by id or
    title (a title after an id is that id's)."""
    claims: list[Claim] = []
    named: set[str] = set()
    ids_in_seg = [m for m in ms if m.by == "id"]
    for m in ms:
        if m.by == "noun":
            continue
        text = seg[m.start : m.end]
        at = (m.start + offset, m.end + offset)
        if m.by == "id":
            (pid,) = m.ids
            named.add(pid)
            if src.known(pid) is not None or pid in src.tool_ids:
                claims.append(Claim("product_id", text, *at, pid))
            elif src.knows_catalogue:
                claims.append(Claim("product_id", text, *at, pid, False,
                                    f"{pid} is no product of the catalogue"))  # fmt: skip
            else:
                claims.append(_unjudged("product_id", text, at, f"{pid} is not among the "
                                        "products known (no catalogue loaded)", pid))  # fmt: skip
            continue
        prior = [i for i in ids_in_seg if i.end <= m.start]
        if prior:
            (pid,) = prior[-1].ids
            if pid in m.ids:
                claims.append(Claim("title", text, *at, pid))
                continue
            row = src.known(pid)
            other = sorted(m.ids)[0] if m.ids else "?"
            claims.append(Claim("title", text, *at, pid, False,
                                f"{pid} given the title of {src.describe(other)}",
                                row.title if row else None))  # fmt: skip
            continue
        named |= set(m.ids) if len(m.ids) == 1 else {min(m.ids)}
        claims.append(Claim("title", text, *at, sorted(m.ids)[0] if m.ids else None))
    return claims, named


# -- amounts ---------------------------------------------------------------------------------


def _money(src: GroundingSources, value: Decimal) -> str:
    return format_money(value, src.currency, src.locale)


def _close(value: Decimal, target: Decimal, approx: bool, currency: str) -> bool:
    if approx:
        return abs(value - target) <= APPROX_TOLERANCE * abs(target) + step(currency) / 2
    return abs(value - target) < step(currency) / 2


def _prices(rows: Iterable[ProductRow], currency: str) -> set[Decimal]:
    return {quantize(r.price, currency) for r in rows}


def _derived(src: GroundingSources, seg: str, a: Amount, cues: Cues, subj_rows: list[ProductRow],
             named_rows: list[ProductRow]) -> tuple[set[Decimal], bool]:  # fmt: skip
    """The values ``a`` may truly have (its subject's price and what the sentence's words
    derive from the sources) and whether a value it needs is unknown (VAT without a
    rate in the policy)."""
    cur = src.currency
    q = Decimal(1).scaleb(-minor_digits(cur))
    subj = _prices(subj_rows, cur)
    every = subj | _prices(named_rows, cur)
    rates = src.facts.vat_rates
    if vat_part(seg, a):  # the VAT in a price
        if not rates:
            return set(), True
        return {(p * r / (1 + r)).quantize(q) for p in subj for r in rates}, False
    if vat_excluded(seg, a):  # a price without VAT: never the price itself
        if not rates:
            return set(), True
        return {(p / (1 + r)).quantize(q) for p in subj for r in rates}, False
    vals: set[Decimal] = set()
    bases = set(subj)  # what a fee may be added to
    if cues.quantities:
        multiples = {(k * p).quantize(q) for k in cues.quantities for p in every}
        vals |= multiples
        bases |= multiples
    distinct = {r.id: r for r in named_rows}
    if cues.total and len(distinct) >= 2:
        total = sum((quantize(r.price, cur) for r in distinct.values()), Decimal(0))
        vals.add(total)
        bases.add(total)
    if cues.difference:
        pool = sorted(every)
        vals |= {abs(x - y) for x in pool for y in pool if x != y}
    unknown = cues.vat_excl and not rates
    if cues.vat_excl and rates:
        vals |= {(p / (1 + r)).quantize(q) for p in subj for r in rates}
    if cues.discount and src.facts.discounts:
        vals |= {(p * (1 - d / 100)).quantize(q) for p in subj for d in src.facts.discounts}
    if cues.fee:
        vals |= {b + f for b in bases for f in src.fees}
    if not _not_unit(seg, a, cues, named_rows):
        vals |= subj
    return vals, unknown


def _not_unit(seg: str, a: Amount, cues: Cues, named_rows: list[ProductRow]) -> bool:
    """Whether the sentence's words say ``a`` is not one product's price: a total of
    several ("Two JKT-008 come to", "JKT-008 and JKT-005 together cost", "with delivery
    ... comes to") unless "each"; a difference ("€5 cheaper"); a price without VAT."""
    if vat_excluded(seg, a) or vat_part(seg, a) or said_as_difference(seg, a):
        return True
    several = bool(cues.quantities) or len({r.id for r in named_rows}) >= 2 or cues.fee
    return cues.sum_said and several and not cues.each


def _correction(src: GroundingSources, a: Amount, row: ProductRow) -> str:
    """The true price of ``row`` written as the shop writes it: in its locale and
    currency; a bare amount bare, an amount in cents in cents."""
    value = quantize(row.price, src.currency)
    if a.cents:
        return f"{int(value.scaleb(minor_digits(src.currency)))} cents"
    if a.bare:
        return format_number(value, src.currency, src.locale)
    return _money(src, value)


def _price_claims(src: GroundingSources, seg: str, offset: int, ms: list[Mention],
                  named: set[str], earlier: frozenset[str], found: list[Amount],
                  cues: Cues) -> list[Claim]:  # fmt: skip
    """The claims of the amounts ``found`` in ``seg`` (its ``cues``)."""
    if not found:
        return []
    named_rows = [r for i in sorted({i for m in ms for i in m.ids}) if (r := src.known(i))]
    paired = _respectively(ms, found)
    claims: list[Claim] = []
    for idx, a in enumerate(found):
        at = (a.start + offset, a.end + offset)
        claim = _judge_amount(src, seg, a, at, idx, found, ms, cues, named, named_rows, earlier,
                              paired.get(idx))  # fmt: skip
        if claim is not None:
            claims.append(claim)
    return claims


def _respectively(ms: list[Mention], found: list[Amount]) -> dict[int, frozenset[str]]:
    """Amounts listed after the products they are about, in the same order ("JKT-008
    and JKT-005 cost €44.95 and €49.95"): index of each amount → its product. Empty
    unless there are as many prices as products named (two or more) and every price
    comes after the last of them."""
    products: list[Mention] = []
    for m in ms:
        if m.by == "noun":
            continue
        prev = products[-1] if products else None
        if prev is not None and prev.by == "id" and m.by == "title" and m.start - prev.end < 4:
            continue  # "[JKT-003] <its title>": one product
        products.append(m)
    prices = [i for i, a in enumerate(found) if a.role in ("unit", "approx")]
    if len(products) < 2 or len(prices) != len(products):
        return {}
    if any(found[i].start < products[-1].end for i in prices):
        return {}
    return {i: m.ids for i, m in zip(prices, products, strict=True)}


_FEE_WORDS = ("deliver\\w*", "shipping", "postage", "express", "courier", "fees?", "surcharge",
              "P&P", "carriage", "returns?", "label", "free")  # fmt: skip
#: a fee word before an amount, in the same clause ("delivery is €4.95")
_FEE_BEFORE = re.compile(rf"\b(?:{'|'.join(_FEE_WORDS)})\b[^.,;]*$", re.I)
#: a fee word just after an amount ("€4.95 delivery", "€4.95 for express shipping")
_FEE_AFTER = starting(*(f"(?:for |of |in )?(?:standard |express |saturday )?{w}"
                        for w in _FEE_WORDS))  # fmt: skip
#: words before a bound that make it a threshold of the policy ("orders over €60")
_THRESHOLD = ending("(?:orders?|baskets?|purchases?|spend(?:ing)?|free(?: \\w+)?) "
                    "(?:over|above|from|of|at least|more than)")


def _judge_amount(src: GroundingSources, seg: str, a: Amount, at: tuple[int, int], idx: int,
                  found: list[Amount], ms: list[Mention], cues: Cues, named: set[str],
                  named_rows: list[ProductRow], earlier: frozenset[str],
                  paired: frozenset[str] | None = None) -> Claim | None:  # fmt: skip
    """One amount's claim (None: not said as a fact: a bare number beside nothing, the
    shopper's bound repeated, a bound about nothing); ``paired``: the product a list of
    prices gives it (:func:`_respectively`)."""
    cur = src.currency
    subj = paired if paired is not None else subject(ms, a.start, src, earlier)
    rows = [r for i in sorted(subj) if (r := src.known(i)) is not None]
    in_sentence = any(m.by in ("id", "title") and m.ids & subj for m in ms)
    if a.bare and not a.cued and not subj:
        return None
    if a.value is None:
        return _unjudged("price", a.text, at, a.why or f"{a.text} could not be read")
    if a.role in ("below", "above", "from") and cues.echo:
        return None
    bound = a.role in ("below", "above", "from")
    if bound and _THRESHOLD.search(seg[max(0, a.start - 30) : a.start]):
        # a threshold of the policy ("orders over €60 ship free"): one of its amounts
        if a.currency == cur and any(_close(a.value, f, False, cur) for f in src.fees):
            return Claim("fee", a.text, *at)
        return Claim("fee", a.text, *at, None, False, f"{a.text} is no amount of the policy")
    fee_like = cues.fee or bool(topics_of(seg))
    # a fee: said beside a fee word ("delivery costs €4.95", "€4.95 for shipping"), or in
    # a sentence on a policy subject that names no product
    fee_here = bool(_FEE_BEFORE.search(seg[max(0, a.start - 35) : a.start])
                    or _FEE_AFTER.match(seg, a.end)) or (fee_like and not named)  # fmt: skip
    if fee_here and a.currency == cur and not a.negative and not a.malformed and any(
        _close(a.value, f, a.role == "approx", cur) for f in src.fees
    ):
        return Claim("fee", a.text, *at)
    if a.role == "was":
        return Claim("discount", a.text, *at, rows[0].id if rows else None, False,
                     f"{a.text} is said as an earlier price; the catalogue gives none")
    faulty = ("a negative price" if a.negative else "a malformed price" if a.malformed
              else f"in {a.currency}, not {cur}" if a.currency != cur else None)  # fmt: skip
    correctable = (a.role == "unit" and not cues.derived and len(rows) == 1 and in_sentence
                   and len(named) == 1)  # fmt: skip
    if faulty is not None:
        if not rows:
            return Claim("price", a.text, *at, None, False, f"{a.text} is {faulty}")
        first = rows[0]
        return Claim("price", a.text, *at, first.id, False,
                     f"{a.text} is {faulty}; {first.id} costs {_money(src, first.amount)}",
                     _correction(src, a, first) if correctable else None)  # fmt: skip
    if subj and not rows:
        return _unjudged("price", a.text, at, f"a price of {sorted(subj)[0]}, which no "
                         "source knows", sorted(subj)[0])  # fmt: skip
    if a.role in ("below", "above", "from", "range_low", "range_high"):
        return _judge_bound(src, a, at, idx, found, ms, rows, fee_here)
    if not rows:
        pool = _prices(src.nearby.values(), cur) or _prices(src.catalogue.values(), cur)
        pool |= set(src.tool_amounts)
        if cues.fee:
            pool |= set(src.fees)
        if not pool:
            return _unjudged("price", a.text, at, "no product or fee is known to judge "
                             f"{a.text} against")  # fmt: skip
        if any(_close(a.value, p, a.role == "approx", cur) for p in pool):
            return Claim("price", a.text, *at)
        return Claim("price", a.text, *at, None, False,
                     f"no product, fee or tool result of the turn costs {a.text}")
    vals, unknown = _derived(src, seg, a, cues, rows, named_rows)
    approx = a.role == "approx"
    ok = [r for r in rows if _close(a.value, quantize(r.price, cur), approx, cur)
          and not _not_unit(seg, a, cues, named_rows)]  # fmt: skip
    if ok or any(_close(a.value, v, approx, cur) for v in vals):
        return Claim("price", a.text, *at, (ok or rows)[0].id)
    row = rows[0]
    if unknown:
        return _unjudged("price", a.text, at, f"{a.text} is said without VAT; the policy "
                         "gives no VAT rate", row.id)  # fmt: skip
    said = "about " if approx else ""
    why = f"{said}{a.text} differs from {row.id}'s price {_money(src, row.amount)}"
    if cues.derived:
        why += " and from what the sentence derives from it"
    return Claim("price", a.text, *at, row.id, False, why,
                 _correction(src, a, row) if correctable else None)


def _judge_bound(src: GroundingSources, a: Amount, at: tuple[int, int], idx: int,
                 found: list[Amount], ms: list[Mention], rows: list[ProductRow],
                 fee_like: bool) -> Claim | None:  # fmt: skip
    """A bound, a "from" or a range end: about the products it is about (a range: every
    product its sentence names, else the subject's)."""
    cur = src.currency
    assert a.value is not None
    if a.role in ("range_low", "range_high"):
        other = found[idx + 1] if a.role == "range_low" else found[idx - 1]
        if other.value is None:
            return _unjudged("price", a.text, at, f"the range's other end {other.text!r} "
                             "could not be read")  # fmt: skip
        lo, hi = sorted((a.value, other.value))
        ids = {i for m in ms for i in m.ids}
        pool = [r for i in sorted(ids) if (r := src.known(i))] or rows
        if not pool:
            return None  # a range about nothing named: the shopper's budget, not a claim
        out = [r for r in pool if not lo <= quantize(r.price, cur) <= hi]
        if not out:
            return Claim("price", a.text, *at, pool[0].id)
        r = out[0]
        return Claim("price", a.text, *at, r.id, False,
                     f"{r.id} costs {_money(src, r.amount)}, outside {a.text} to "
                     f"{other.text}" if a.role == "range_low" else
                     f"{r.id} costs {_money(src, r.amount)}, outside {other.text} to {a.text}")
    if not rows:
        if fee_like:
            return Claim("fee", a.text, *at, None, False,
                         f"{a.text} is no amount of the policy")  # fmt: skip
        return None  # a bound about nothing named: the shopper's budget, not a claim
    prices = {r.id: quantize(r.price, cur) for r in rows}
    if a.role == "from":
        low = min(prices.values())
        if abs(low - a.value) < step(cur) / 2:
            return Claim("price", a.text, *at, min(prices, key=lambda i: prices[i]))
        low_id = min(prices, key=lambda i: prices[i])
        return Claim("price", a.text, *at, low_id, False,
                     f"from {a.text}, but the lowest price of what it is about is "
                     f"{_money(src, low)} ({low_id})")  # fmt: skip
    bad = [i for i, p in prices.items() if (p >= a.value if a.role == "below" else p <= a.value)]
    if not bad:
        return Claim("price", a.text, *at, rows[0].id)
    word = "under" if a.role == "below" else "over"
    return Claim("price", a.text, *at, bad[0], False,
                 f"{bad[0]} costs {_money(src, prices[bad[0]])}, not {word} {a.text}")


# -- discounts -------------------------------------------------------------------------------

_PERCENT = re.compile(r"(?<![\d.,])(?P<n>\d{1,3}(?:[.,]\d{1,2})?)\s?(?:%|percent\b|per cent\b)",
                      re.I)  # fmt: skip
_VAT_NEAR = starting("(?:\\w+ )?(?:VAT|MwSt|TVA|IVA|sales tax|tax)")


def _discount_claims(src: GroundingSources, seg: str, offset: int, cues: Cues) -> list[Claim]:
    """Discount percentages ("65% off"), VAT rates ("incl. 19% VAT") and discounts said
    without a number ("on sale"), against the policy."""
    out: list[Claim] = []
    facts = src.facts
    for m in _PERCENT.finditer(seg):
        at = (m.start() + offset, m.end() + offset)
        value = Decimal(m.group("n").replace(",", "."))
        negated = bool(NEGATION.search(seg, max(0, m.start() - 30), m.start()))
        if _VAT_NEAR.match(seg, m.end()):
            if not facts.vat_rates:
                out.append(_unjudged("discount", m.group(0), at, "the policy gives no VAT rate"))
            elif value / 100 in facts.vat_rates:
                out.append(Claim("discount", m.group(0), *at))
            else:
                out.append(Claim("discount", m.group(0), *at, None, False,
                                 f"VAT is {', '.join(f'{r * 100:g}%' for r in facts.vat_rates)}"
                                 f" by the policy, not {m.group(0)}"))  # fmt: skip
            continue
        if not cues.discount:
            continue  # "100% wool": no discount
        if negated:
            ok = value not in facts.discounts
        else:
            ok = value in facts.discounts
        if ok:
            out.append(Claim("discount", m.group(0), *at))
        else:
            given = ", ".join(f"{d:g}%" for d in sorted(facts.discounts)) or "none"
            out.append(Claim("discount", m.group(0), *at, None, False,
                             f"a discount of {m.group(0)}; the policy's discounts: {given}"))
    if not out and not _PERCENT.search(seg):
        for m in OFFER_WORDS.finditer(seg):
            at = (m.start() + offset, m.end() + offset)
            negated = bool(NEGATION.search(seg, max(0, m.start() - 40), m.start()))
            said = _policy_says(src, m.group(0))
            if said is not None:  # the policy speaks of this very offer ("discount codes")
                ok = said == (not negated)
                out.append(Claim("discount", m.group(0), *at, None, ok,
                                 None if ok else f"the policy says {'no ' if not said else ''}"
                                 f"{m.group(0)}"))  # fmt: skip
                break
            if negated != facts.offers_discount:
                out.append(Claim("discount", m.group(0), *at))
            else:
                out.append(Claim("discount", m.group(0), *at, None, False,
                                 "the policy offers no discount" if not negated else
                                 "the policy offers a discount"))  # fmt: skip
            break
    return out


def _policy_says(src: GroundingSources, words: str) -> bool | None:
    """Whether the policy offers ``words`` ("discount codes"): True, False (a sentence
    says there are none), None (no sentence speaks of them)."""
    found = [s for s in src.facts.sentences if words.lower() in s.lower()]
    if not found:
        return None
    return not all(NEGATION.search(s) for s in found)


# -- stock and colours -----------------------------------------------------------------------


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
#: quoted words ("you asked for 'red'"): the shopper's, not a claim
_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|(?<!\w)'[^']*'(?!\w)|‘[^’]*’")


def _stock_claims(src: GroundingSources, seg: str, offset: int, ms: list[Mention],
                  earlier: frozenset[str]) -> list[Claim]:  # fmt: skip
    out: list[Claim] = []
    for pattern, in_stock in _STOCK:
        for sm in pattern.finditer(seg):
            subj = subject(ms, sm.start(), src, earlier)
            rows = [r for i in sorted(subj) if (r := src.known(i)) is not None]
            if not rows:
                continue  # about no product known: the id or title claim says so
            at = (sm.start() + offset, sm.end() + offset)
            sizes = _SIZE_TOKEN.findall(sm.group("sizes"))
            verdicts = []
            for row in rows:
                bad = []
                for size in sizes:
                    n = row.sizes.get(size)
                    if n is None:
                        bad.append(f"{row.id} has no size {size}")
                    elif in_stock and n <= 0:
                        bad.append(f"{row.id} is sold out in {size}")
                    elif not in_stock and n > 0:
                        bad.append(f"{row.id} has {n} in stock in {size}")
                verdicts.append((row, bad))
            good = [row for row, bad in verdicts if not bad]
            if good:
                out.append(Claim("stock", sm.group(0), *at, good[0].id))
            else:
                row, bad = verdicts[0]
                out.append(Claim("stock", sm.group(0), *at, row.id, False, "; ".join(bad)))
    return out


def _colour_claims(src: GroundingSources, seg: str, offset: int, ms: list[Mention],
                   earlier: frozenset[str]) -> list[Claim]:  # fmt: skip
    """The colour claims of ``seg`` (see :data:`_COLOUR_CLAIM`): each colour word must be
    one of the colours of the product it is said of, or a shade of one
    (:func:`chainrun.checks.colours.colour_grounded`). Not a claim: a question (the
    shopper's words asked back), words in quotes or in a product title, a colour after a
    negation, a colour of a product no source knows or whose colours are not known."""
    if seg.rstrip().endswith("?") or not _COLOUR_WORD.search(seg):
        return []
    quoted = [m.span() for m in _QUOTED.finditer(seg)]
    out: list[Claim] = []
    for cm in _COLOUR_CLAIM.finditer(seg):
        group = "c1" if cm.group("c1") else "c2"
        lo, hi = cm.span(group)
        if any(a <= lo < b for a, b in quoted) or NEGATION.search(seg, 0, lo):
            continue
        if any(m.start <= lo < m.end and m.by != "noun" for m in ms):
            continue  # a title's own colour ("... Rain Jacket (yellow)")
        subj = subject(ms, lo, src, earlier)
        rows = [r for i in sorted(subj) if (r := src.known(i)) is not None and r.colours]
        if not rows:
            continue
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


# -- the policy: days, hours, countries ------------------------------------------------------

_WORKING = words("(?:working|business) days?")
_UPPER = ending("up to", "within", "at most", "no more than", "max\\.?")


def _policy_claims(src: GroundingSources, seg: str, offset: int) -> list[Claim]:
    figures = figures_in(seg)
    topics = topics_of(seg)
    out: list[Claim] = []
    facts = src.facts
    for f in figures:
        at = (f.start + offset, f.end + offset)
        if topics:
            allowed = set().union(*(facts.figures.get(t, frozenset()) for t in topics))
            on = " and ".join(sorted(topics))
        elif _WORKING.search(f.text):
            allowed, on = set(facts.figures["*"]), "any subject"
        else:
            continue
        if not src.policy:
            out.append(_unjudged("policy", f.text, at, "no policy text to judge it against"))
            continue
        upper = bool(_UPPER.search(seg[max(0, f.start - 16) : f.start]))
        ok = (f.low, f.high, f.unit) in allowed or (
            upper and f.low == f.high and any(h == f.high and u == f.unit for _, h, u in allowed))
        if ok:
            out.append(Claim("policy", f.text, *at))
        else:
            said = ", ".join(sorted(f"{lo}-{hi}" if lo != hi else str(lo)
                                    for lo, hi, u in allowed if u == f.unit)) or "none"  # fmt: skip
            out.append(Claim("policy", f.text, *at, None, False,
                             f"the policy on {on} gives {f.unit}s {said}, not {f.text}"))
    if "delivery" in topics:
        for c in countries_in(seg, src.locale):
            at = (c.start + offset, c.end + offset)
            if not facts.delivers_to and not facts.delivers_everywhere:
                out.append(_unjudged("country", c.text, at, "the policy names no country "
                                     "it delivers to"))  # fmt: skip
                continue
            covered = facts.delivers_everywhere or c.codes <= facts.delivers_to
            negated = bool(NEGATION.search(seg, max(0, c.start - 40), c.start))
            if covered != negated:
                out.append(Claim("country", c.text, *at))
            else:
                out.append(Claim("country", c.text, *at, None, False,
                                 f"the policy {'does not deliver' if negated else 'delivers'}"
                                 f" to {c.text}" if covered else
                                 f"the policy names no delivery to {c.text}"))  # fmt: skip
    return out


# -- a sentence, a text ----------------------------------------------------------------------


def check_segment(src: GroundingSources, seg: str, offset: int = 0,
                  earlier: frozenset[str] = frozenset()) -> list[Claim]:  # fmt: skip
    """The claims of one segment ``seg`` (offsets shifted by ``offset``); ``earlier``:
    the product the answer named last before this segment (see
    :func:`chainrun.checks.facts.subject`)."""
    ms = mentions(src, seg)
    claims, named = _named_claims(src, seg, offset, ms)
    found = amounts(src, seg, bool(ms))
    spans = [(x.start, x.end) for x in found] + [(m.start, m.end) for m in ms if m.by != "noun"]
    if found or "%" in seg or OFFER_WORDS.search(seg) or "percent" in seg or "per cent" in seg:
        cues = cues_of(seg, spans)
        claims += _price_claims(src, seg, offset, ms, named, earlier, found, cues)
        claims += _discount_claims(src, seg, offset, cues)
    claims += _stock_claims(src, seg, offset, ms, earlier)
    claims += _colour_claims(src, seg, offset, ms, earlier)
    claims += _policy_claims(src, seg, offset)
    return sorted(claims, key=lambda c: c.start)


def last_named(src: GroundingSources, seg: str) -> frozenset[str]:
    """The product ``seg`` names last (an id, else a title, else a title word), or none."""
    ms = mentions(src, seg)
    for by in ("id", "title", "noun"):
        found = [m for m in ms if m.by == by]
        if found:
            return found[-1].ids
    return frozenset()


def check_text(src: GroundingSources, text: str) -> list[Claim]:
    """Every claim of a whole answer ``text`` (all its segments complete)."""
    out: list[Claim] = []
    earlier: frozenset[str] = frozenset()
    for s, e, _ in segments(text):
        out += check_segment(src, text[s:e], s, earlier)
        earlier = last_named(src, text[s:e]) or earlier
    return out
