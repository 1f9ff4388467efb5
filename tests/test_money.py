"""chainrun.money: amounts formatted as a shop in a locale writes them (CLDR via Babel)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from chainrun.money import format_money, minor_digits

NBSP, NNBSP = "\u00a0", "\u202f"


@pytest.mark.parametrize(
    ("amount", "currency", "locale", "expected"),
    [
        (1299, "EUR", "de_DE", f"1.299,00{NBSP}€"),
        (1299, "EUR", "fr_FR", f"1{NNBSP}299,00{NBSP}€"),
        (1299, "CHF", "de_CH", f"CHF{NBSP}1'299.00"),
        (1299, "EUR", "en_IE", "€1,299.00"),
        (49.95, "EUR", "en_IE", "€49.95"),
        (Decimal("69.95"), "EUR", "de-DE", f"69,95{NBSP}€"),
        ("19.5", "USD", "en_US", "$19.50"),
    ],
)
def test_format_money_follows_the_locale(amount, currency, locale, expected):
    assert format_money(amount, currency, locale) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("x", "EUR", "de_DE"), "not an amount"),
        ((float("nan"), "EUR", "de_DE"), "not an amount"),
        ((1, "EUX", "de_DE"), "unknown currency 'EUX'"),
        ((1, "EUR", "zz"), "unknown locale 'zz'"),
    ],
)
def test_format_money_refuses_what_it_cannot_write(args, message):
    with pytest.raises(ValueError, match=message):
        format_money(*args)


def test_minor_digits_from_cldr():
    assert (minor_digits("EUR"), minor_digits("CHF"), minor_digits("JPY")) == (2, 2, 0)
