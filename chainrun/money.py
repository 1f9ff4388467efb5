"""Money as shops write it: amounts formatted and read in a locale and a currency.

The locale's formats and the currencies' symbols, names and decimals come from Babel
(the Unicode CLDR data: ``babel.numbers.format_currency``, ``parse_decimal``,
``get_currency_precision``, ``get_currency_symbol``, ``get_currency_name``); an amount
whose format is not the shop's locale's is read by scrapinghub's ``price-parser``
(``Price.fromstring``). Nothing here hand-writes a locale's number format.

- :func:`format_money`: ``format_money(1299, "EUR", "de_DE")`` is ``1.299,00 €`` (a
  no-break space before the sign); ``"de_CH"`` and ``CHF`` give ``CHF 1'299.00``;
  ``"fr_FR"`` gives ``1 299,00 €`` with a narrow no-break space (U+202F) between the
  thousands.
- :func:`parse_amount`: one catalogue cell (``1.299,00``, ``1'299.00``), strictly: a
  number that two formats read differently (``1.299``: 1299 in Germany, 1.299 in
  Ireland) is refused unless a locale is given.
- :func:`find_money`: every amount with a currency in free text (an answer), each with
  its offsets, its value read as the shop's locale writes it (else as price-parser
  reads it), its currency, and whether it was readable at all.

Amounts are :class:`~decimal.Decimal` s, never floats: ``49.95`` is exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from babel.core import Locale, UnknownLocaleError
from babel.numbers import (
    NumberFormatError,
    format_currency,
    get_currency_name,
    get_currency_precision,
    get_currency_symbol,
    get_group_symbol,
    is_currency,
    list_currencies,
    parse_decimal,
)
from price_parser import Price

__all__ = [
    "DEFAULT_LOCALE",
    "AmbiguousAmount",
    "MoneyText",
    "find_money",
    "format_money",
    "locale_of",
    "minor_digits",
    "parse_amount",
    "quantize",
    "read_in_text",
    "read_number",
]

#: the locale a shop gets when it names none (English, Ireland: ``€1,299.00``, the
#: sample shop's format)
DEFAULT_LOCALE = "en_IE"

#: white space a locale may group thousands with (CLDR: U+00A0 in many locales, U+202F
#: in French), and what shops type instead (U+0020, U+2009)
_SPACES = " \u00a0\u202f\u2009"
#: apostrophes a locale may group thousands with (CLDR de_CH: U+0027; typographic U+2019)
_APOSTROPHES = "'\u2019"


class AmbiguousAmount(ValueError):
    """A number that two common formats read as different amounts (``1.299`` is 1299 with
    a thousands point, 1.299 with a decimal point) and no locale says which."""


@lru_cache(maxsize=64)
def locale_of(name: str) -> Locale:
    """The Babel locale named ``name`` (``de_CH`` or ``de-CH``).

    Raises:
        ValueError: no such locale (the message names it).
    """
    try:
        return Locale.parse(name.replace("-", "_"))
    except (UnknownLocaleError, ValueError):
        raise ValueError(f"unknown locale {name!r}; expected a CLDR locale such as de_CH or "
                         "en_IE") from None


def _currency(code: str) -> str:
    if not is_currency(code):
        raise ValueError(f"unknown currency {code!r}; expected an ISO 4217 code such as EUR")
    return code


@lru_cache(maxsize=64)
def minor_digits(currency: str) -> int:
    """Digits after the decimal separator in ``currency`` (ISO 4217 code): 2 for EUR and
    CHF, 0 for JPY (CLDR's currency data).

    Raises:
        ValueError: an unknown currency.
    """
    return int(get_currency_precision(_currency(currency)))


def quantize(amount: Decimal | float | int | str, currency: str) -> Decimal:
    """``amount`` rounded half-even to ``currency``'s decimals (a float through its
    shortest repr: ``49.95`` is ``Decimal("49.95")``).

    Raises:
        ValueError: an unknown currency, or an amount that is no finite number.
    """
    try:
        value = amount if isinstance(amount, Decimal) else Decimal(str(amount))
    except InvalidOperation:
        raise ValueError(f"not an amount: {amount!r}") from None
    if not value.is_finite():
        raise ValueError(f"not an amount: {amount!r}")
    return value.quantize(Decimal(1).scaleb(-minor_digits(currency)))


def format_money(amount: Decimal | float | int | str, currency: str, locale: str) -> str:
    """``amount`` of ``currency`` (ISO 4217) as a shop in ``locale`` writes it (CLDR's
    currency pattern, with the currency's own number of decimals): ``1.299,00 €`` for
    ``(1299, "EUR", "de_DE")``, ``€49.95`` for ``(49.95, "EUR", "en_IE")``.

    Raises:
        ValueError: an unknown currency or locale, or an amount that is no number.
    """
    value = quantize(amount, currency)
    return str(format_currency(value, currency, locale=locale_of(locale)))


def format_number(amount: Decimal | float | int | str, currency: str, locale: str) -> str:
    """``amount`` with ``currency``'s decimals as ``locale`` writes a number, without the
    currency (``1.299,00`` for ``(1299, "EUR", "de_DE")``).

    Raises:
        ValueError: as :func:`format_money`.
    """
    value = quantize(amount, currency)
    digits = minor_digits(currency)
    pattern = "#,##0" + ("." + "0" * digits if digits else "")
    from babel.numbers import format_decimal

    return str(format_decimal(value, format=pattern, locale=locale_of(locale),
                              decimal_quantization=False))  # fmt: skip


def _places(value: Decimal) -> int:
    exp = value.as_tuple().exponent
    return -exp if isinstance(exp, int) and exp < 0 else 0


def _normalised(text: str, locale: Locale) -> str:
    """``text`` with white space and apostrophes between digits written as ``locale``
    groups thousands (so ``1 299,00`` typed with a plain space reads in ``fr_FR``)."""
    group = get_group_symbol(locale)
    if group in _SPACES:
        text = re.sub(f"(?<=\\d)[{_SPACES}](?=\\d)", group, text)
    elif group in _APOSTROPHES:
        text = re.sub(f"(?<=\\d)[{_APOSTROPHES}](?=\\d)", group, text)
    return text


def _in_locale(text: str, locale: Locale, digits: int) -> Decimal | None:
    """``text`` read strictly as ``locale`` writes numbers (Babel), None when it is not
    such a number or has more decimals than ``digits``."""
    try:
        value = parse_decimal(_normalised(text, locale), locale=locale, strict=True)
    except NumberFormatError:
        return None
    return value if _places(value) <= digits else None


def _by_shape(text: str, digits: int) -> Decimal | None:
    """``text`` read by price-parser (its reading of separators by the shape of the
    number), None when unreadable or with more than ``digits`` decimals."""
    value = Price.fromstring(text).amount
    if value is None or _places(value) > digits:
        return None
    return value


#: a number in a shop's text: grouped thousands (by a point, comma, apostrophe or a
#: space), a decimal part, or a Swiss ".–" for no rappen
_SWISS_ZERO = r"[.,][-–]{1,2}"
_NUMBER = (
    rf"\d{{1,3}}(?:[.,{_APOSTROPHES}{_SPACES}]\d{{3}})+(?:[.,]\d{{1,2}}(?!\d)|{_SWISS_ZERO})?"
    rf"|\d+(?:[.,]\d+)?(?:{_SWISS_ZERO})?"
)


def _swiss_zero(text: str) -> str:
    return re.sub(_SWISS_ZERO + "$", "", text)


def _ambiguous(text: str, digits: int) -> bool:
    """Whether ``text`` (digits and separators) reads as two different amounts: one
    separator kind, once, followed by exactly three digits (``1.299``, ``1,299``), when
    the currency has decimals (a thousands separator or a decimal one)."""
    seps = re.findall(r"[^\d]", text)
    return (digits > 0 and len(seps) == 1 and seps[0] in ".,"
            and re.fullmatch(r"\d{1,3}[.,]\d{3}", text) is not None)  # fmt: skip


def read_number(text: str, currency: str, locale: str | None) -> Decimal:
    """A number as a shop writes it (``1.299,00``, ``1'299.00``, ``1 299,00``, ``49.95``,
    ``1'299.–``), in ``currency`` (its decimals bound the reading): in ``locale``'s
    format when one is given (Babel, strict), else by its shape (price-parser), refusing
    a shape two formats read differently.

    Raises:
        AmbiguousAmount: no ``locale``, and the number reads two ways (``1.299``).
        ValueError: not a number in ``locale``'s format, or more decimals than
            ``currency`` has, or an unknown currency or locale.
    """
    digits = minor_digits(currency)
    raw = text.strip()
    if not re.fullmatch(_NUMBER, raw):
        raise ValueError(f"expected an amount such as 1299.00, got {text!r}")
    body = _swiss_zero(raw)
    if locale is not None:
        loc = locale_of(locale)
        value = _in_locale(body, loc, digits)
        if value is None:
            example = format_number(Decimal("1299"), currency, locale)
            raise ValueError(f"{text!r} is not an amount of {currency} as {locale} writes "
                             f"it (e.g. {example})")  # fmt: skip
        return value
    if _ambiguous(body, digits):
        raise AmbiguousAmount(
            f"{text!r} is ambiguous: {body.replace(',', '').replace('.', '')} with a "
            f"thousands separator, or {body.replace(',', '.')} with a decimal one; name the "
            "catalogue's locale, or write it as 1299.00")
    value = _by_shape(body, digits)
    if value is None:
        raise ValueError(f"{text!r} is not an amount of {currency} (at most {digits} decimals)")
    return value


def parse_amount(text: str, currency: str, locale: str | None = None) -> Decimal:
    """One catalogue cell as an amount of ``currency``: a number (:func:`read_number`),
    optionally with ``currency``'s sign or code before or after it (``1.299,00 €``,
    ``CHF 1'299.00``); a minus sign is refused.

    Raises:
        AmbiguousAmount, ValueError: see :func:`read_number`; a sign or code of another
            currency; a negative amount.
    """
    found = find_money(text, currency, locale or DEFAULT_LOCALE)
    raw = text.strip()
    if len(found) == 1 and found[0].start == 0 and found[0].end == len(raw.rstrip()):
        m = found[0]
        if m.currency != currency:
            raise ValueError(f"{text!r} is in {m.currency}, expected {currency}")
        if m.negative:
            raise ValueError(f"{text!r} is negative")
        raw = m.number
    if raw.startswith(("-", "−")):
        raise ValueError(f"{text!r} is negative")
    return read_number(raw, currency, locale)


# -- amounts in free text ------------------------------------------------------------------

#: currencies whose signs and names an answer may use (ISO 4217); any ISO code is read
_COMMON = ("EUR", "USD", "GBP", "CHF", "JPY", "SEK", "NOK", "DKK", "PLN", "CZK", "CAD",
           "AUD", "NZD", "CNY", "INR")  # fmt: skip
#: the languages whose currency signs and names are read (with the shop's own)
_NAME_LOCALES = ("en", "de", "fr", "it", "es", "nl")


@lru_cache(maxsize=32)
def _vocabulary(shop_currency: str, locale: str) -> tuple[dict[str, str], dict[str, str]]:
    """(sign → ISO code, word → ISO code) for an answer in a shop of ``shop_currency``
    writing in ``locale``: the signs and names of :data:`_COMMON` in CLDR's data for
    :data:`_NAME_LOCALES`; a sign shared by several currencies (``$``, ``kr``) is the
    shop's when the shop's locale writes its currency so, else the first's."""
    signs: dict[str, str] = {}
    words: dict[str, str] = {}
    shop_sign = get_currency_symbol(shop_currency, locale_of(locale))
    signs[shop_sign] = shop_currency
    for loc in (locale, *_NAME_LOCALES):
        for code in (shop_currency, *_COMMON):
            sign = get_currency_symbol(code, loc)
            if sign != code:
                signs.setdefault(sign, code)
            for count in (1, 2):
                name = get_currency_name(code, count, loc).lower().split()
                if name:
                    words.setdefault(name[-1], code)
    signs.setdefault("Fr.", "CHF")
    words.update({"cents": shop_currency, "cent": shop_currency, "ct": shop_currency})
    return signs, words


@lru_cache(maxsize=1)
def _codes() -> frozenset[str]:
    return frozenset(c for c in list_currencies() if len(c) == 3 and c.isupper())


@lru_cache(maxsize=32)
def _pattern(shop_currency: str, locale: str) -> re.Pattern[str]:
    signs, words = _vocabulary(shop_currency, locale)
    sign_alt = "|".join(re.escape(s) for s in sorted(signs, key=len, reverse=True))
    word_alt = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    minus = "[-−]"
    return re.compile(
        rf"(?:(?P<sign>{sign_alt})|(?P<code>\b[A-Z]{{3}}))\s?(?P<neg>{minus})?\s?"
        rf"(?P<num>{_NUMBER})(?!\d)"
        rf"|(?P<neg2>{minus})?(?P<num2>(?<![\d.,]){_NUMBER})(?!\d)[{_SPACES}]?"
        rf"(?:(?P<sign2>{sign_alt})|(?P<code2>[A-Z]{{3}}\b)|(?P<word>(?:{word_alt}))\b)",
        re.I,
    )


@dataclass(frozen=True)
class MoneyText:
    """An amount with a currency in a text.

    Attributes:
        start, end: offsets of the whole mention (sign, minus and number).
        text: the mention as written.
        number: the number as written (``1.299,00``).
        amount: its value in ``currency`` units (cents read as hundredths); None when
            it could not be read (``why`` says so).
        currency: ISO 4217 code of the sign, code or word.
        negative: a minus sign before or after the currency sign.
        cents: written in cents (``4495 cents``).
        why: why ``amount`` is None.
    """

    start: int
    end: int
    text: str
    number: str
    amount: Decimal | None
    currency: str
    negative: bool = False
    cents: bool = False
    why: str | None = None


def read_in_text(number: str, currency: str, locale: str) -> tuple[Decimal | None, str | None]:
    """A number of an answer (``number``: digits and separators) and why it has no
    value: in the shop's ``locale``'s format if it is one (Babel, strict), else as
    price-parser reads its shape; more decimals than ``currency`` has is no reading
    (``1.299 €`` is 1299 in any locale, since the euro has two decimals).

    Returns:
        (amount, None), or (None, why) when it cannot be read.

    Raises:
        ValueError: an unknown currency or locale.
    """
    digits = minor_digits(currency)
    body = _swiss_zero(number)
    value = _in_locale(body, locale_of(locale), digits)
    if value is None:
        value = _by_shape(body, digits)
    if value is None:
        return None, f"{number!r} is no amount of {currency}"
    return value, None


def find_money(text: str, shop_currency: str, locale: str) -> list[MoneyText]:
    """Every amount with a currency sign, ISO code or name in ``text``, in order (see
    :class:`MoneyText`). A three-letter word counts as a code only when it is an ISO
    4217 code (``EUR``, not ``USB``); ``$`` is the shop's currency when its locale
    writes it so (a Canadian shop), else USD.

    Raises:
        ValueError: an unknown shop currency or locale.
    """
    signs, words = _vocabulary(shop_currency, locale)
    codes = _codes()
    out: list[MoneyText] = []
    for m in _pattern(shop_currency, locale).finditer(text):
        code = m.group("code") or m.group("code2")
        if code is not None and code.upper() not in codes:
            continue
        if code is not None and code != code.upper():
            continue  # "eur 5" read case-blind by the pattern: codes are capitals
        if m.group("code") and text[m.end("code") : m.end("code") + 1] in "-−":
            continue  # "TOP-001" is a product id, not -1 Tongan paʻanga
        number = m.group("num") or m.group("num2")
        mark = m.group("sign") or m.group("sign2") or code or m.group("word") or ""
        currency = (signs.get(mark) or signs.get(mark.upper())
                    or (mark if mark in codes else None) or words.get(mark.lower())
                    or shop_currency)  # fmt: skip
        cents = bool(m.group("word")) and m.group("word").lower() in ("cents", "cent", "ct")
        if cents:
            if not number.isdigit():
                continue
            amount: Decimal | None = Decimal(number).scaleb(-minor_digits(currency))
            why = None
        else:
            amount, why = read_in_text(number, currency, locale)
        negative = bool(m.group("neg") or m.group("neg2"))
        out.append(MoneyText(m.start(), m.end(), m.group(0), number, amount, currency,
                             negative, cents, why))  # fmt: skip
    return out
