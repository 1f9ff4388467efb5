"""Catalogue prices read as the shop writes them (a locale per catalogue; an ambiguous
``1.299`` refused with its file and line, never silently another price), and shown in
the prompt as the shop writes them (chainrun.money through Babel)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
import sqlite_utils
from cli_runner import chainrun

from chainrun.errors import InputFileError, UserInputError
from chainrun.money import AmbiguousAmount, parse_amount, read_number
from chainrun.retrieval.base import format_for_prompt
from chainrun.retrieval.catalog import get_products, load_catalog, read_catalog
from chainrun.retrieval.products import ShownProduct, render_products

BERGPFAD = Path(__file__).resolve().parents[1] / "examples" / "bergpfad" / "catalog.csv"
HEADER = "id,title,category,sizes,price\n"


def _csv(tmp_path: Path, *prices: str) -> Path:
    path = tmp_path / "shop.csv"
    rows = [f'T-{i},Tent {i},tents,one size:1,"{p}"\n' for i, p in enumerate(prices)]
    path.write_text(HEADER + "".join(rows), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "locale", "expected"),
    [
        ("1.299,00", "de_DE", "1299.00"),
        ("1.299", "de_DE", "1299"),
        ("1\u202f299,00", "fr_FR", "1299.00"),
        ("1 299,00", "fr_FR", "1299.00"),  # typed with a plain space
        ("1'299.00", "de_CH", "1299.00"),
        ("1’299.00", "de_CH", "1299.00"),  # a typographic apostrophe
        ("1,299.00", "en_IE", "1299.00"),
        ("1'299.–", "de_CH", "1299"),
        ("1.299,00 €", "de_DE", "1299.00"),
        ("CHF 1'299.00", "de_CH", "1299.00"),
        # no locale: any shape that reads one way only
        ("1'299.00", None, "1299.00"),
        ("1.299,00", None, "1299.00"),
        ("1,299.00", None, "1299.00"),
        ("69.95", None, "69.95"),
        ("12,50", None, "12.50"),
    ],
)
def test_a_cell_reads_as_its_locale_writes_it(text, locale, expected) -> None:
    currency = "CHF" if locale == "de_CH" or "CHF" in text else "EUR"
    assert parse_amount(text, currency, locale) == Decimal(expected)


@pytest.mark.parametrize(
    ("text", "locale", "message"),
    [
        ("1.299", None, "ambiguous"),
        ("1,299", None, "ambiguous"),
        ("1.299", "en_IE", "not an amount of EUR as en_IE writes it"),  # 3 decimals
        ("12.50", "de_DE", "not an amount of EUR as de_DE writes it"),
        ("cheap", None, "expected an amount"),
        ("-5.00", None, "negative"),
        ("$5.00", None, "is in USD, expected EUR"),
    ],
)
def test_a_cell_that_is_no_price_of_the_catalogue_is_refused(text, locale, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_amount(text, "EUR", locale)
    if message == "ambiguous":
        with pytest.raises(AmbiguousAmount):
            read_number(text, "EUR", None)


def test_an_ambiguous_price_is_refused_with_its_file_and_line(tmp_path: Path) -> None:
    path = _csv(tmp_path, "70", "1.299")
    with pytest.raises(InputFileError) as e:
        read_catalog(path)
    assert str(e.value).startswith(f"{path}:3: price: '1.299' is ambiguous")
    assert "1299" in str(e.value) and "locale" in str(e.value)
    products = read_catalog(path, locale="de_DE")  # a German shop: 1299 euros
    assert [p.price for p in products] == [70.0, 1299.0]
    with pytest.raises(InputFileError, match=r"shop.csv:3: price: '1.299' is not an amount of "
                                             r"EUR as en_IE writes it"):  # fmt: skip
        read_catalog(path, locale="en_IE")


def test_a_json_number_with_more_decimals_than_the_currency_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shop.jsonl"
    row = {"id": "T-1", "title": "Tent", "category": "tents", "price": 1.299}
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"shop.jsonl:1: price: 1.299 has 3 decimals; "
                                             r"EUR has 2"):  # fmt: skip
        read_catalog(path)
    row["price"] = "1.299"  # text, as the shop writes it: read in the catalogue's locale
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    assert read_catalog(path, locale="de_DE")[0].price == 1299.0
    row["price"] = True
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(InputFileError, match="price: expected a number, got true"):
        read_catalog(path)


def test_an_unknown_locale_or_currency_is_one_clear_error(tmp_path: Path) -> None:
    path = _csv(tmp_path, "69.95")
    with pytest.raises(UserInputError, match="unknown locale 'xx_YY'"):
        read_catalog(path, locale="xx_YY")
    with pytest.raises(UserInputError, match="unknown currency 'EUX'"):
        read_catalog(path, currency="EUX")


def test_the_loader_keeps_the_currency_and_locale_and_the_prompt_shows_them() -> None:
    db = sqlite_utils.Database(memory=True)
    assert load_catalog(db, BERGPFAD, currency="CHF", locale="de_CH") == 25
    (tent,) = get_products(db, ["TNT-305"])
    assert (tent["price"], tent["currency"], tent["locale"]) == (1299.0, "CHF", "de_CH")
    line = format_for_prompt([tent])
    assert line.startswith("- [TNT-305] Familienlager 6 Tunnel Tent | tents | CHF\xa01'299.00")
    assert render_products([ShownProduct.from_item(tent)]) == line
    load = db.execute("select currency, locale from catalog_loads").fetchall()
    assert load == [("CHF", "de_CH")]


@pytest.mark.parametrize(
    ("currency", "locale", "shown"),
    [
        ("EUR", None, "€1,299.00"),  # the default: the sample shop's format
        ("EUR", "de_DE", "1.299,00\xa0€"),
        ("EUR", "fr_FR", "1\u202f299,00\xa0€"),
        ("CHF", "de_CH", "CHF\xa01'299.00"),
    ],
)
def test_prompt_lines_write_prices_as_the_shop_does(currency, locale, shown) -> None:
    item = {"id": "T-1", "title": "Tent", "category": "tents", "price": 1299.0,
            "currency": currency, "locale": locale}  # fmt: skip
    assert format_for_prompt([item]) == f"- [T-1] Tent | tents | {shown}"


def test_catalog_load_takes_the_locale_and_refuses_in_one_line(tmp_path: Path) -> None:
    path = _csv(tmp_path, "1.299")
    db = tmp_path / "log.db"
    res = chainrun("catalog", "load", str(path), "--db", str(db))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert f"{path}:2: price: '1.299' is ambiguous" in res.stderr and not db.exists()
    res = chainrun("catalog", "load", str(path), "--db", str(db), "--locale", "de_DE")
    assert res.returncode == 0, res.stderr
    res = chainrun("catalog", "load", str(path), "--db", str(db), "--locale", "xx_YY")
    assert res.returncode == 2 and "unknown locale 'xx_YY'" in res.stderr
