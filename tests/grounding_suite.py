"""The grounding suites: answers true and false, in the formats shops write prices in,
on two shops (the sample shop, EUR in en_IE; Bergpfad, CHF in de_CH, and the same
rows as a German shop writes them, EUR in de_DE), for
tests/test_grounding_suite.py and benchmarks/grounding_suite.py.

Every answer is a template of this file filled with a shop's own rows: the same suite
on each shop. The formats and phrasings follow public reports of how prices are written
and misread, named in each case's ``source``:

- scrapinghub/price-parser#39 (``1 298,00`` with a no-break space), #61 and PR #85 (the
  typographic apostrophe of Swiss prices), PR #72 (``'`` as a thousands separator);
  JavaMoney/jsr354-ri#193 (space and narrow no-break space thousands separators);
  jef/streetmerchant PR #2482 (``1 234.56`` read as 1.234);
- caiogondim/parse-price.js#4 (``1.234 €`` and ``€1,299``: a thousands or a decimal
  separator);
- tteon/seocho PR #327 (numeric grounding that flags derived values: totals, sums,
  differences);
- DumbWareio/DumbBudget#5 (a shop in one currency shown another's sign);
- the shops' own copy: a catalogue line, a product sentence, the policy's fees, days,
  countries and discounts.

A case: ``answer`` (what the model wrote), ``truth`` (``True``: every fact in it is
so), ``wrong`` (the false facts as written: none may reach the shopper), ``expect``
(what the shopper reads when the check corrects it; None: not fixed here), ``source``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import sqlite_utils

from chainrun.checks.grounding import GroundingSources, PolicyFacts, ProductRow, TitleIndex
from chainrun.money import format_money
from chainrun.retrieval.catalog import all_products, ensure_sample_catalog, read_catalog
from chainrun.shop_policy import load_policy

ROOT = Path(__file__).resolve().parents[1]
BERGPFAD = ROOT / "examples" / "bergpfad"

SPACE = "scrapinghub/price-parser#39, JavaMoney/jsr354-ri#193 (space thousands)"
APOSTROPHE = "scrapinghub/price-parser#61, PR #72 (apostrophe thousands)"
AMBIGUOUS = "caiogondim/parse-price.js#4 (1.234 € / €1,299)"
DERIVED = "tteon/seocho PR #327 (derived values)"
CURRENCY = "DumbWareio/DumbBudget#5 (another currency's sign)"
COPY = "shop copy"
ISSUE = "the four wrong facts a shop's shoppers read"


@dataclass(frozen=True)
class Case:
    """One answer of a suite (see the module text)."""

    shop: str
    name: str
    answer: str
    truth: bool
    wrong: tuple[str, ...] = ()
    expect: str | None = None
    source: str = COPY
    shown: tuple[str, ...] | None = None  # None: the shop's usual products
    history: tuple[str, ...] = ()


@dataclass
class Shop:
    """A shop of the suites: its rows, policy, and the products and facts the templates
    use (``a`` cheaper than ``b``, both shown; ``big`` shown; ``z`` in the catalogue,
    not shown)."""

    name: str
    currency: str
    locale: str
    catalogue: dict[str, ProductRow]
    policy: str
    a: str
    b: str
    big: str
    z: str
    noun_a: str  # a word of a's title no other shown product's title has
    size_in: str
    sold_out: tuple[str, str]  # a product and a size of it that is sold out
    colour_in: str
    colour_out: str
    fee_std: Decimal
    fee_exp: Decimal
    threshold: Decimal
    returns_days: int
    refund: str  # the policy's refund figure, as a sentence says it
    country_yes: str
    delivery_days: str  # to country_yes, as the policy gives it
    country_no: str
    vat: Decimal | None
    club_discount: int | None
    other_sign: str  # a currency sign the shop does not sell in
    styles: tuple[str, ...]
    titles: TitleIndex = field(init=False)
    facts: PolicyFacts = field(init=False)

    def __post_init__(self) -> None:
        self.titles = TitleIndex(self.catalogue.values())
        self.facts = PolicyFacts.read(self.policy, self.currency, self.locale)

    @property
    def shown(self) -> tuple[str, ...]:
        return (self.a, self.b, self.big)

    def row(self, pid: str) -> ProductRow:
        return self.catalogue[pid]

    def price(self, pid: str) -> Decimal:
        return self.catalogue[pid].amount

    def sources(self, shown: tuple[str, ...] | None = None,
                history: tuple[str, ...] = ()) -> GroundingSources:  # fmt: skip
        return GroundingSources(
            [self.catalogue[i] for i in (self.shown if shown is None else shown)],
            policy=self.policy, catalogue=self.catalogue,
            history=[self.catalogue[i] for i in history], currency=self.currency,
            locale=self.locale, titles=self.titles, policy_facts=self.facts,
        )  # fmt: skip

    def money(self, amount: Decimal, style: str | None = None) -> str:
        """``amount`` written in ``style``: a locale (``de_DE``: ``1.299,00 €``), or
        ``int_en`` / ``int_de`` (a whole amount without decimals: ``€1,299``,
        ``1.299 €``), ``code`` (``1299.00 EUR``), ``swiss`` (``Fr. 1'299.–``)."""
        style = style or self.locale
        if style == "code":
            return f"{amount:.2f} {self.currency}"
        if style == "swiss":
            return "Fr. " + format_money(amount, "CHF", "de_CH")[4:].replace(".00", ".–")
        if style.startswith("int_"):
            text = format_money(amount, self.currency, "en_IE" if style == "int_en" else "de_DE")
            assert text.endswith((".00", ",00\xa0€", ",00\xa0CHF")) or ".00" in text, text
            return text.replace(".00", "").replace(",00", "")
        return format_money(amount, self.currency, style)

    def correct(self, pid: str) -> str:
        """``pid``'s price as a correction writes it: the shop's locale and currency."""
        return format_money(self.price(pid), self.currency, self.locale)


def sample_shop() -> Shop:
    db = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(db)
    catalogue = {p["id"]: ProductRow.of(p) for p in all_products(db)}
    policy = "\n".join(s.text for s in load_policy().values())
    return Shop(
        "sample", "EUR", "en_IE", catalogue, policy, a="JKT-008", b="JKT-003", big="BAG-001",
        z="JKT-013", noun_a="Drizzle", size_in="S", sold_out=("JKT-005", "M"), colour_in="red",
        colour_out="green", fee_std=Decimal("4.95"), fee_exp=Decimal("9.95"),
        threshold=Decimal("60"), returns_days=30, refund="within 5 working days",
        country_yes="Germany", delivery_days="3-6", country_no="Japan", vat=None,
        club_discount=None, other_sign="$",
        styles=("en_IE", "de_DE", "fr_FR", "de_CH", "code"),
    )  # fmt: skip


def bergpfad_shop(currency: str = "CHF", locale: str = "de_CH") -> Shop:
    """The second shop (examples/bergpfad); ``currency`` and ``locale`` other than its
    own give the same rows and policy as a German shop would write them (the shop that
    saw the four wrong facts: ``1.299,00 €``), its policy's amounts rewritten so."""
    products = read_catalog(BERGPFAD / "catalog.csv", currency="CHF", locale="de_CH")
    catalogue = {p.id: ProductRow(p.id, p.title, p.price, currency, dict(p.sizes),
                                  tuple(p.colours)) for p in products}  # fmt: skip
    policy = "\n".join(s.text for s in load_policy(BERGPFAD / "policy.toml").values())
    if currency != "CHF":
        policy = re.sub(r"CHF (\d+\.\d\d)",
                        lambda m: format_money(Decimal(m.group(1)), currency, locale), policy)
    own = (currency, locale) == ("CHF", "de_CH")
    return Shop(
        "bergpfad" if own else f"bergpfad-{locale}", currency, locale, catalogue, policy,
        a="PCK-201", b="PCK-205",
        big="TNT-305", z="SLP-401", noun_a="Daypack", size_in="one size",
        sold_out=("BTS-501", "42"),
        colour_in="red", colour_out="green", fee_std=Decimal("8.90"),
        fee_exp=Decimal("19.90"), threshold=Decimal("150"), returns_days=30,
        refund="within 10 days", country_yes="Austria", delivery_days="4-7",
        country_no="Japan", vat=Decimal("0.081"), club_discount=10,
        other_sign="€" if own else "$",
        styles=("de_CH", "de_DE", "fr_FR", "en_IE", "code", "swiss") if own else
        (locale, "en_IE", "fr_FR", "de_CH", "code"),
    )  # fmt: skip


def _whole(x: Decimal) -> bool:
    return x == x.to_integral_value()


def cases(shop: Shop) -> list[Case]:
    """The suite on ``shop``: the same templates, filled with its rows."""
    s = shop
    a, b, big, z = (s.row(i) for i in (s.a, s.b, s.big, s.z))
    pa, pb, pbig, pz = (s.price(i) for i in (s.a, s.b, s.big, s.z))
    out: list[Case] = []

    def add(name: str, answer: str, truth: bool, *wrong: str, expect: str | None = None,
            source: str = COPY, shown: tuple[str, ...] | None = None,
            history: tuple[str, ...] = ()) -> None:  # fmt: skip
        out.append(Case(s.name, name, answer, truth, tuple(wrong), expect, source, shown,
                        history))  # fmt: skip

    # ---- true: a product's own price, in every format, shown or not
    for st in s.styles:
        src = SPACE if st == "fr_FR" else APOSTROPHE if st in ("de_CH", "swiss") else COPY
        add(f"line-{st}", f"- [{a.id}] {a.title} | packs | {s.money(pa, st)} | in stock", True,
            source=src)
        add(f"title-{st}", f"The {a.title} costs {s.money(pa, st)}.", True, source=src)
        add(f"id-{st}", f"{b.id} is {s.money(pb, st)}, a good price for what it is.", True,
            source=src)
        add(f"big-{st}", f"Our {big.title} is {s.money(pbig, st)}.", True, source=src)
        add(f"not-shown-{st}", f"We also have {z.id}, the {z.title}, at {s.money(pz, st)}.",
            True, source=src)
        add(f"not-shown-title-{st}", f"The {z.title} is {s.money(pz, st)}.", True, source=src)
        add(f"incl-vat-{st}", f"{a.id} costs {s.money(pa, st)} incl. VAT.", True, source=src)
    # thousands, in the formats the reports name (a whole amount: also without decimals)
    ten = 10 * pz
    for st in ("de_DE", "fr_FR", "de_CH", "en_IE", "int_en", "int_de"):
        src = {"fr_FR": SPACE, "de_CH": APOSTROPHE}.get(st, AMBIGUOUS)
        if st.startswith("int_") and not _whole(ten):
            continue
        add(f"ten-{st}", f"Ten {z.id} would come to {s.money(ten, st)}.", True, source=src)
    if _whole(pbig):
        for st in ("int_en", "int_de"):
            add(f"big-{st}", f"The {big.title} is {s.money(pbig, st)}.", True, source=AMBIGUOUS)
    # ---- true: derived amounts
    for st in s.styles[:3]:
        add(f"two-{st}", f"Two {a.id} come to {s.money(2 * pa, st)}.", True, source=DERIVED)
        add(f"three-{st}", f"Three of the {a.title} would be {s.money(3 * pa, st)} in total.",
            True, source=DERIVED)
        add(f"sum-{st}", f"{a.id} and {b.id} together cost {s.money(pa + pb, st)}.", True,
            source=DERIVED)
        add(f"diff-{st}", f"{a.id} is {s.money(pb - pa, st)} cheaper than {b.id}.", True,
            source=DERIVED)
        add(f"plus-fee-{st}", f"With standard delivery, {a.id} comes to "
            f"{s.money(pa + s.fee_std, st)}.", True, source=DERIVED)  # fmt: skip
        add(f"price-and-fee-{st}", f"{a.id} costs {s.money(pa, st)} and standard delivery is "
            f"{s.money(s.fee_std, st)}.", True)  # fmt: skip
        add(f"list-{st}", f"{a.id} and {b.id} cost {s.money(pa, st)} and {s.money(pb, st)}.",
            True)
    about = (pa / 5).quantize(Decimal(1)) * 5
    add("about", f"{a.title} is a good pick. It's about {s.money(about)}.", True,
        source=DERIVED)
    add("around", f"The {a.id} costs around {s.money(pa.quantize(Decimal(1)))}.", True)
    add("range", f"{a.id} and {b.id} are between {s.money(pa - 5)} and {s.money(pb + 5)}.", True)
    add("under", f"{a.id} is under {s.money(pa + 10)}.", True)
    add("echo", f"You asked for something under {s.money(Decimal(20))}: {b.id} is "
        f"{s.money(pb)}.", True)  # fmt: skip
    # ---- true: references
    add("history", f"The {a.id} you saw earlier is {s.money(pa)}.", True, shown=(s.b, s.big),
        history=(s.a,))
    add("noun", f"The {s.noun_a} costs {s.money(pa)}.", True)
    add("previous", f"{a.id} is light and packs small. It costs {s.money(pa)}.", True)
    add("stock", f"{a.id} is in stock in {s.size_in}.", True)
    add("colour", f"{a.id} comes in {s.colour_in}.", True)
    # ---- true: the policy
    add("fee-exp", f"Express delivery costs {s.money(s.fee_exp)}.", True)
    add("fee-std", f"Standard delivery is {s.money(s.fee_std)}.", True)
    add("threshold", f"Delivery is free from {s.money(s.threshold)}.", True)
    add("returns", f"Returns are accepted within {s.returns_days} days of delivery.", True)
    add("refund", f"Refunds reach you {s.refund} of the return arriving.", True)
    add("delivery", f"Standard delivery to {s.country_yes} takes {s.delivery_days} working "
        "days.", True)  # fmt: skip
    add("no-country", f"We don't deliver to {s.country_no}.", True)
    add("no-codes", "We give no discount codes.", True)
    if s.vat is not None:
        net = (pa / (1 + s.vat)).quantize(Decimal("0.01"))
        add("excl-vat", f"{a.id} is {s.money(net)} excl. VAT.", True, source=DERIVED)
        add("vat-rate", f"All prices include {(s.vat * 100).normalize()}% VAT.", True)
    if s.club_discount is not None:
        add("club", f"Alpine Club members get {s.club_discount}% off in our store.", True)

    # ---- false: a wrong price of a named product (the issue's first fact): corrected
    for st in s.styles[:4]:
        wrong = s.money(pb, st)
        add(f"wrong-line-{st}", f"- [{a.id}] {a.title} | packs | {wrong} | in stock", False,
            wrong, expect=f"- [{a.id}] {a.title} | packs | {s.correct(s.a)} | in stock",
            source=ISSUE)
        add(f"wrong-title-{st}", f"The {a.title} costs {wrong}.", False, wrong,
            expect=f"The {a.title} costs {s.correct(s.a)}.", source=ISSUE)
        wz = s.money(pz + 7, st)
        add(f"wrong-not-shown-{st}", f"{z.id} costs {wz}.", False, wz,
            expect=f"{z.id} costs {s.correct(s.z)}.")
    other = f"{s.other_sign}{pa:.2f}"
    add("other-currency", f"{a.id} costs {other}.", False, other,
        expect=f"{a.id} costs {s.correct(s.a)}.", source=CURRENCY)
    add("history-wrong", f"The {a.id} you saw earlier is {s.money(pb)}.", False, s.money(pb),
        expect=f"The {a.id} you saw earlier is {s.correct(s.a)}.", shown=(s.b, s.big),
        history=(s.a,))
    # ---- false: nothing can be rewritten: dropped
    far = (pbig / 10).quantize(Decimal(1))
    add("about-far", f"The {big.title} is our roomiest. It's about {far} {s.currency}.",
        False, f"{far} {s.currency}", source=ISSUE)
    add("two-wrong", f"Two {a.id} come to {s.money(2 * pa + 10)}.", False,
        s.money(2 * pa + 10), source=DERIVED)
    add("sum-wrong", f"{a.id} and {b.id} together cost {s.money(pa + pb + 5)}.", False,
        s.money(pa + pb + 5), source=DERIVED)
    add("diff-wrong", f"{a.id} is {s.money(pb - pa + 3)} cheaper than {b.id}.", False,
        s.money(pb - pa + 3), source=DERIVED)
    add("fee-sum-wrong", f"With standard delivery, {a.id} comes to "
        f"{s.money(pa + s.fee_std + 1)}.", False, s.money(pa + s.fee_std + 1),
        source=DERIVED)  # fmt: skip
    add("list-swapped", f"{a.id} and {b.id} cost {s.money(pb)} and {s.money(pa)}.", False,
        s.money(pb))
    add("fee-wrong", f"Express delivery costs {s.money(s.fee_exp + 2)}.", False,
        s.money(s.fee_exp + 2))
    add("threshold-wrong", f"Delivery is free from {s.money(s.threshold - 10)}.", False,
        s.money(s.threshold - 10))
    add("returns-wrong", f"Returns are accepted within {2 * s.returns_days} days.", False,
        f"{2 * s.returns_days} days")
    add("refund-3-5", "You'll get your money back in 3-5 working days.", False,
        "3-5 working days", source=ISSUE)
    add("country-wrong", f"We ship to {s.country_no} too.", False, s.country_no)
    add("65-off", "Everything in the shop is 65% off this week.", False, "65%", source=ISSUE)
    add("20-discount", "We offer a 20% discount on all our products.", False, "20%",
        source=ISSUE)
    was = s.money((pa * Decimal("1.3")).quantize(Decimal(1)))
    add("was", f"{a.id} was {was}, now {s.money(pa)}.", False, was)
    add("unknown-id", f"- [ZZZ-999] Phantom Jacket | jackets | {s.money(pa)}", False,
        "ZZZ-999")
    gone, size = s.sold_out
    add("sold-out", f"{gone} is in stock in {size}.", False, f"in stock in {size}")
    add("colour-wrong", f"{a.id} comes in {s.colour_out}.", False, s.colour_out)
    add("range-wrong", f"{a.id} and {b.id} are between {s.money(pa + 1)} and "
        f"{s.money(pb + 5)}.", False, s.money(pa + 1))  # fmt: skip
    add("under-wrong", f"{a.id} is under {s.money(pa - 10)}.", False, s.money(pa - 10))
    add("excl-vat-wrong", f"{a.id} costs {s.money(pa)} excl. VAT.", False,
        f"{s.money(pa)} excl. VAT")
    add("noun-wrong", f"The {s.noun_a} costs {s.money(pb)}.", False, s.money(pb))
    add("previous-wrong", f"{a.id} is light and packs small. It costs {s.money(pb)}.", False,
        f"It costs {s.money(pb)}")
    return out


def dump(path: Path, shops: list[Shop]) -> None:
    """Write every case as JSON lines (for reading the suite, not for the tests)."""
    with path.open("w", encoding="utf-8") as f:
        for shop in shops:
            for c in cases(shop):
                f.write(json.dumps(c.__dict__, ensure_ascii=False) + "\n")
