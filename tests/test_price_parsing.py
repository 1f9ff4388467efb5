"""Prices in shoppers' messages: thousands separators, decimal marks, currency, "k"."""

from __future__ import annotations

import pytest

from chainrun.retrieval.filters import parse_filters, parse_price, parse_query


@pytest.mark.parametrize(
    ("message", "max_price"),
    [
        ("under 1,299.50 EUR", 1299.50),  # was once read as 1.29
        ("under 99,90 euros", 99.90),  # decimal comma: kept
        ("under 1.299,50 €", 1299.50),  # dot thousands, decimal comma
        ("under 1\u2009299,50 €", 1299.50),  # thin space
        ("under 1\u202f299 €", 1299.0),  # narrow no-break space
        ("under 1'299.50", 1299.50),  # apostrophe (Swiss)
        ("under 1’299", 1299.0),  # typographic apostrophe
        ("under 1,299", 1299.0),  # a lone comma before 3 digits groups thousands
        ("under 1.299", 1299.0),
        ("under 12,345,678", 12345678.0),
        ("below €1,299.50", 1299.50),  # currency before
        ("below EUR 1.299,50", 1299.50),
        ("up to 1,299.50 euros", 1299.50),  # currency after
        ("max 79.99", 79.99),
        ("under 2k", 2000.0),  # k suffix
        ("under 1.5k euros", 1500.0),
        ("under 1,5 k", 1500.0),
        ("under 100", 100.0),
        ("below 79,9", 79.9),
    ],
)
def test_price_ceiling(message: str, max_price: float) -> None:
    assert parse_filters(message).max_price == max_price


def test_between_and_floor_use_the_same_reader() -> None:
    f = parse_filters("a coat between 1,000 and 1.499,99 €")
    assert (f.min_price, f.max_price) == (1000.0, 1499.99)
    assert parse_filters("over 1'000 euros").min_price == 1000.0


def test_units_and_sizes_are_not_prices() -> None:
    assert parse_filters("under 2 kg").max_price == 2.0  # "k" must end the word
    q = parse_query("a jacket under 1,299.50 EUR in size M")
    assert q.text == "a jacket" and q.filters.sizes == ("M",)


def test_parse_price_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_price("abc")
