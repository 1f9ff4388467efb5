"""The grounding suites (tests/grounding_suite.py) through the stream check: on two
shops, every true answer reaches the shopper unchanged, every false fact is stopped,
and what the check writes instead is true; a property test over generated answers
holds the last part for any mix of true and false sentences."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal

import pytest
from grounding_suite import Case, Shop, bergpfad_shop, cases, sample_shop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrun.checks.facts import segments
from chainrun.checks.grounding import StreamGrounding, check_text
from chainrun.checks.holdback import HoldBack
from chainrun.money import find_money

SHOPS = {s.name: s for s in (sample_shop(), bergpfad_shop(), bergpfad_shop("EUR", "de_DE"))}
CASES = [c for shop in SHOPS.values() for c in cases(shop)]


async def _tokens(text: str) -> AsyncIterator[str]:
    for tok in re.findall(r"\S+\s*|\s+", text):
        yield tok


async def _shown(shop: Shop, case: Case, window: int = 0) -> tuple[str, StreamGrounding]:
    check = StreamGrounding(shop.sources(case.shown, case.history))
    out = [p async for p in HoldBack(check, window).stream(_tokens(case.answer))]
    return "".join(out), check


def test_the_suites_are_large_enough() -> None:
    for name in SHOPS:
        mine = [c for c in CASES if c.shop == name]
        assert len(mine) >= 100, (name, len(mine))
        assert sum(c.truth for c in mine) >= 40 and sum(not c.truth for c in mine) >= 30
    answers = " ".join(c.answer for c in CASES)
    for written in ("1.299,00\xa0€", "1\u202f299,00", "1'299.00", "€1,299", "2.290\xa0€",
                    "CHF\xa069.95", "$44.95", "€69.95", "Fr. 1'299.–"):  # fmt: skip
        assert written in answers, written


@pytest.mark.parametrize("case", [c for c in CASES if c.truth], ids=lambda c: f"{c.shop}-{c.name}")
async def test_every_true_answer_reaches_the_shopper_unchanged(case: Case) -> None:
    shop = SHOPS[case.shop]
    shown, check = await _shown(shop, case)
    report = check.report()
    assert shown == case.answer, report["ungrounded"]
    assert report["judged"] >= 1 and report["unjudged"] == 0  # checked, not passed by default
    assert report["grounded"]


@pytest.mark.parametrize("case", [c for c in CASES if not c.truth],
                         ids=lambda c: f"{c.shop}-{c.name}")  # fmt: skip
async def test_every_false_fact_is_stopped(case: Case) -> None:
    shop = SHOPS[case.shop]
    for window in (0, 8):
        shown, check = await _shown(shop, case, window)
        for wrong in case.wrong:
            assert wrong not in shown, (wrong, shown)
        if case.expect is not None:
            assert shown == case.expect
        assert not check.report()["grounded"]
        # what reached the shopper instead holds no fact that is not so
        if shown != check.safe_text:
            again = check_text(shop.sources(case.shown, case.history), shown)
            assert all(c.grounded for c in again), [c.why for c in again if not c.grounded]


@pytest.mark.parametrize(("currency", "locale", "sign"), [("CHF", "de_CH", "CHF "),
                                                          ("EUR", "de_DE", "€")])  # fmt: skip
async def test_the_four_wrong_facts_a_shop_saw_are_stopped(currency, locale, sign) -> None:
    """On the second shop, in its francs and as a German shop in euros: "€189.00" for
    the 69.95 daypack (189 is the trekking pack's price, shown in the same turn), "about
    120 EUR" for the 1,299 tent, "3-5 working days" for a 10-day refund, "65% off" and
    "a 20% discount on all our products"."""
    shop = bergpfad_shop(currency, locale)
    answers = [
        (f"The Piz 22 Daypack costs {sign}189.00.", f"{sign}189.00"),
        (f"The Familienlager 6 Tunnel Tent sleeps six. It's about 120 {currency}.",
         f"120 {currency}"),
        ("Your refund: you'll get your money back in 3-5 working days.", "3-5"),
        ("Good news: everything is 65% off!", "65%"),
        ("We offer a 20% discount on all our products.", "20%"),
    ]
    for text, wrong in answers:
        case = Case(shop.name, "issue", text, False, (wrong,))
        shown, check = await _shown(shop, case)
        assert wrong not in shown and not check.report()["grounded"], shown
    shown, _ = await _shown(shop, Case(shop.name, "issue", answers[0][0], False))
    assert shown == f"The Piz 22 Daypack costs {shop.correct('PCK-201')}."


# ---------------------------------------------------------------- generated answers

#: sentence templates: (context sentences that are true, the sentence with the amount,
#: how its true amount follows from the prices of a and b and the shop, whether a
#: correction may be written in it: :data:`chainrun.checks.judging.CORRECTABLE`)
TEMPLATES = [
    ((), "- [{a}] {ta} | x | {v}", lambda s, a, b: a, True),
    ((), "The {ta} costs {v}.", lambda s, a, b: a, True),
    ((), "{a} is {v}.", lambda s, a, b: a, True),
    ((), "Two {a} come to {v}.", lambda s, a, b: 2 * a, False),
    ((), "{a} and {b} together cost {v}.", lambda s, a, b: a + b, False),
    ((), "{a} is {v} cheaper than {b}.", lambda s, a, b: b - a, False),
    ((), "With standard delivery, {a} comes to {v}.", lambda s, a, b: a + s.fee_std, False),
    (("{a} is great.",), "It costs {v}.", lambda s, a, b: a, False),
    ((), "Express delivery costs {v}.", lambda s, a, b: s.fee_exp, False),
    ((), "{a} costs about {v}.", lambda s, a, b: a, False),
    ((), "Ten {a} would come to {v}.", lambda s, a, b: 10 * a, False),
    ((), "{a} costs {v} incl. VAT.", lambda s, a, b: a, False),
]
FACTORS = [Decimal("0.5"), Decimal("0.7"), Decimal("1.3"), Decimal("2.5")]


@dataclass(frozen=True)
class Written:
    """A sentence of a generated answer: its text, its true amount (None: no amount),
    whether it was written true, and whether a correction may be written in it."""

    text: str
    true: Decimal | None
    ok: bool
    correctable: bool


@st.composite
def answers(draw: st.DrawFn) -> tuple[str, list[Written]]:
    """An answer of 1-4 entries of :data:`TEMPLATES` on one shop, each true or false."""
    shop = SHOPS[draw(st.sampled_from(sorted(SHOPS)))]
    ids = sorted(shop.catalogue)
    out: list[Written] = []
    for _ in range(draw(st.integers(1, 4))):
        context, template, truth_of, correctable = draw(st.sampled_from(TEMPLATES))
        a = draw(st.sampled_from(ids))
        dearer = [i for i in ids if shop.price(i) > shop.price(a)]
        if not dearer:
            continue
        b = draw(st.sampled_from(dearer))
        true = truth_of(shop, shop.price(a), shop.price(b))
        ok = draw(st.booleans())
        value = true if ok else (true * draw(st.sampled_from(FACTORS))).quantize(Decimal("0.01"))
        style = draw(st.sampled_from(shop.styles[:4]))
        fill = {"a": a, "b": b, "ta": shop.row(a).title, "v": shop.money(value, style)}
        out += [Written(c.format(**fill), None, True, False) for c in context]
        out.append(Written(template.format(**fill), true, ok, correctable and not ok))
    return shop.name, out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers())
async def test_no_correction_writes_a_number_that_is_not_true(drawn) -> None:
    """Whatever mix of true and false sentences the model writes: each true sentence
    reaches the shopper unchanged; each false one is dropped, or corrected to its true
    amount (only where a correction may be written); nothing else reaches them."""
    name, written = drawn
    if not written:
        return
    shop = SHOPS[name]
    text = "\n".join(w.text for w in written) + "\n"
    check = StreamGrounding(shop.sources(shop.shown))
    shown = "".join([p async for p in HoldBack(check, 0).stream(_tokens(text))])
    if shown == check.safe_text:
        assert not any(w.ok for w in written)
        return
    got = [shown[s:e].strip() for s, e, _ in segments(shown) if shown[s:e].strip()]
    false = {w.text for w in written if not w.ok} - {w.text for w in written if w.ok}
    assert not false & set(got)  # a false sentence never reaches the shopper as written
    assert _explains(shop, written, got), (shown, written)


def _explains(shop: Shop, written: list[Written], got: list[str]) -> bool:
    """Whether ``got`` (the sentences the shopper read) is ``written`` with each true
    sentence kept as it was and each false one dropped or, where it may be, corrected
    to its true amount."""
    if not written:
        return not got
    w, rest = written[0], written[1:]
    here = got[0] if got else None
    if w.ok:
        return here == w.text and _explains(shop, rest, got[1:])
    if _explains(shop, rest, got):
        return True  # dropped
    if here is None or not w.correctable or not _same_but_amount(here, w.text):
        return False
    amounts = [m.amount for m in find_money(here, shop.currency, shop.locale)]
    return amounts == [w.true] and _explains(shop, rest, got[1:])


def _same_but_amount(line: str, written: str) -> bool:
    """Whether ``line`` is ``written`` with its amount rewritten (a correction)."""
    strip = re.compile(r"[\d.,'\u00a0\u202f €$£CHFEUR-]+")
    return strip.sub("#", line) == strip.sub("#", written)
