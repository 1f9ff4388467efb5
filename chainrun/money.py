"""Money as shops write it: amounts formatted and parsed in a locale and a currency.

Formatting and the locale's number symbols come from Babel (the Unicode CLDR data:
``babel.numbers.format_currency``, ``parse_decimal``, ``get_currency_precision``);
nothing here hand-writes a locale's format. ``format_money(1299, "EUR", "de_DE")`` is
``1.299,00 €`` (with a no-break space before the sign), ``"de_CH"`` and ``CHF`` give
``CHF 1'299.00``, ``"fr_FR"`` gives ``1 299,00 €`` with a narrow no-break space
(U+202F) as the thousands separator.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from babel.core import Locale, UnknownLocaleError
from babel.numbers import format_currency, get_currency_precision, is_currency

__all__ = ["DEFAULT_LOCALE", "format_money", "locale_of", "minor_digits"]

#: the locale a shop gets when it names none (English, Ireland: ``€1,299.00``)
DEFAULT_LOCALE = "en_IE"


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


def minor_digits(currency: str) -> int:
    """Digits after the decimal separator in ``currency`` (ISO 4217 code): 2 for EUR and
    CHF, 0 for JPY (CLDR's currency data).

    Raises:
        ValueError: an unknown currency.
    """
    return int(get_currency_precision(_currency(currency)))


def format_money(amount: Decimal | float | int | str, currency: str, locale: str) -> str:
    """``amount`` of ``currency`` (ISO 4217) as a shop in ``locale`` writes it (CLDR's
    currency pattern, with the currency's own number of decimals): ``1.299,00 €`` for
    ``(1299, "EUR", "de_DE")``, ``€49.95`` for ``(49.95, "EUR", "en_IE")``.

    A float is read through its shortest repr (``49.95`` is ``Decimal("49.95")``), then
    rounded half-even to the currency's decimals.

    Raises:
        ValueError: an unknown currency or locale, or an amount that is no number.
    """
    try:
        value = amount if isinstance(amount, Decimal) else Decimal(str(amount))
    except InvalidOperation:
        raise ValueError(f"not an amount: {amount!r}") from None
    if not value.is_finite():
        raise ValueError(f"not an amount: {amount!r}")
    return str(format_currency(value, _currency(currency), locale=locale_of(locale)))
