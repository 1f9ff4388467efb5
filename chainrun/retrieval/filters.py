"""Structured filters parsed from the shopper's message (and the classify label).

"a rain jacket under 100 in size M" → price ≤ 100 EUR, size M in stock, category in
(jackets, coats, sportswear) in the sample catalogue (categories come from the catalogue
searched: :mod:`chainrun.retrieval.categories`), and the query text left for the searches is
"a rain jacket". Every search applies the same filters (as SQL), so a ranked list is
never cut down after the fact; :class:`FilterSearch` browses by filters alone, for a
message that is nothing but constraints ("anything under 30 in XL?").

The parser is a few regular expressions, not a model: cheap enough for the critical
path and predictable enough to test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import sqlite_utils

from chainrun.retrieval.categories import BUILTIN_VOCABULARY, CategoryVocabulary
from chainrun.retrieval.hits import Hit
from chainrun.retrieval.reader import CatalogReader, reader_for

_SIZE_WORDS = {
    "extra small": "XS",
    "extra-small": "XS",
    "small": "S",
    "medium": "M",
    "large": "L",
    "extra large": "XL",
    "extra-large": "XL",
    "one size": "ONE SIZE",
}
#: an amount: thousands grouped by comma, dot, apostrophe or a thin/no-break space
#: ("1,299.50", "1.299,50", "1'299", "1\u202f299"), or plain digits; a decimal comma or
#: dot with 1-2 digits; an optional "k" (thousands) suffix. Read by :func:`parse_price`.
_NUM = (
    r"((?:\d{1,3}(?:[,.'’\u2009\u202f\u00a0]\d{3})+(?:[.,]\d{1,2})?|\d+(?:[.,]\d{1,2})?)"
    r"(?:\s?k\b)?)"
)
_CUR = r"(?:\s*(?:€|eur(?:o|os)?\b))?"
_PRE = r"(?:(?:€|eur\b)\s*)?"
_MAX_PRICE = [
    re.compile(
        r"\b(?:under|below|less than|cheaper than|up to|max(?:imum)?|no more than|not more than"
        r"|at most|within|budget(?: is| of)?|for less than)\s*" + _PRE + _NUM + _CUR,
        re.I,
    ),
    re.compile(r"<\s*" + _PRE + _NUM + _CUR, re.I),
    re.compile(
        _PRE + _NUM + _CUR + r"\s*(?:or less|or under|or below|max(?:imum)?\b|tops\b)", re.I
    ),
]
_MIN_PRICE = [
    re.compile(r"\b(?:over|above|more than|at least|pricier than)\s*" + _PRE + _NUM + _CUR, re.I),
]
_BETWEEN = re.compile(
    r"\bbetween\s*" + _PRE + _NUM + _CUR + r"\s*(?:and|to|-)\s*" + _PRE + _NUM + _CUR, re.I
)
_SIZE_TOKEN = r"(?:xxxl|xxl|xxs|xs|xl|s|m|l|\d{2}|extra[ -]small|extra[ -]large|small|medium|large)"
_SIZE_LIST = re.compile(
    r"\b(?:in\s+)?(?:a\s+)?(?:eu\s+)?sizes?\s+(?:eu\s+)?("
    + _SIZE_TOKEN
    + r"(?:\s*(?:,|/|or|and)\s*"
    + _SIZE_TOKEN
    + r")*)\b",
    re.I,
)
_SIZE_ALONE = [
    re.compile(r"\b(xxxl|xxl|xxs|xs|xl)\b", re.I),  # unambiguous letters
    re.compile(r"\b(?:in|an?)\s+(S|M|L)\b"),  # "in M", "an L": capitals only
    re.compile(r"\bin\s+(?:a\s+)?(extra[ -]small|extra[ -]large|small|medium|large)\b", re.I),
    re.compile(r"\beu\s*(\d{2})\b", re.I),
    re.compile(r"\bw(\d{2})\b", re.I),  # jeans waist W32
]


_GROUPING = re.compile(r"[\s'’\u2009\u202f\u00a0]")


def parse_price(amount: str) -> float:
    """An amount as matched in a message, in the message's currency units.

    Thousands separators (comma, dot, apostrophe, thin or no-break space) are dropped; of a
    comma and a dot together the last is the decimal mark ("1,299.50" and "1.299,50" are
    1299.5); a lone comma or dot is a decimal mark before 1-2 digits ("99,90" is 99.9) and
    a thousands separator before 3 ("1,299" is 1299); a "k" suffix multiplies by 1000.

    Raises:
        ValueError: ``amount`` is not such an amount.
    """
    s = amount.strip().lower()
    scale = 1.0
    if s.endswith("k"):
        s, scale = s[:-1].rstrip(), 1000.0
    s = _GROUPING.sub("", s)
    if "," in s and "." in s:
        decimal = "," if s.rfind(",") > s.rfind(".") else "."
        s = s.replace("." if decimal == "," else ",", "").replace(",", ".")
    elif "," in s or "." in s:
        sep = "," if "," in s else "."
        head, _, tail = s.rpartition(sep)
        if s.count(sep) > 1 or len(tail) == 3:
            s = s.replace(sep, "")  # thousands
        else:
            s = f"{head}.{tail}"
    return round(float(s) * scale, 2)


def _norm_size(s: str) -> str:
    s = re.sub(r"\s+", " ", s.strip().lower())
    return _SIZE_WORDS.get(s, s.upper())


@dataclass(frozen=True)
class Filters:
    """Constraints every search applies. Prices in EUR, inclusive.

    ``sizes``: any of these sizes must be in stock (upper-case labels: "M", "38");
    ``categories``: the product's category must be one of these; ``in_stock``: the
    product must have stock (sold-out items are not recommended).
    """

    max_price: float | None = None
    min_price: float | None = None
    sizes: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    in_stock: bool = True

    @property
    def constrains(self) -> bool:
        """Whether any filter beyond ``in_stock`` is set (a message with constraints)."""
        return bool(
            self.max_price is not None or self.min_price is not None or self.sizes
            or self.categories
        )  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        return {
            "max_price": self.max_price,
            "min_price": self.min_price,
            "sizes": list(self.sizes),
            "categories": list(self.categories),
            "in_stock": self.in_stock,
        }

    def sql(self, alias: str = "p") -> tuple[str, list[Any]]:
        """A WHERE fragment over ``products`` aliased ``alias`` and its parameters.

        Returns ``("1", [])`` when nothing is filtered.
        """
        clauses: list[str] = []
        params: list[Any] = []
        if self.max_price is not None:
            clauses.append(f"{alias}.price <= ?")
            params.append(self.max_price)
        if self.min_price is not None:
            clauses.append(f"{alias}.price >= ?")
            params.append(self.min_price)
        if self.categories:
            clauses.append(f"{alias}.category in ({','.join('?' * len(self.categories))})")
            params.extend(self.categories)
        if self.sizes:
            clauses.append(
                f"exists (select 1 from product_sizes ps where ps.product_id = {alias}.id "
                f"and upper(ps.size) in ({','.join('?' * len(self.sizes))}) and ps.stock > 0)"
            )
            params.extend(self.sizes)
        elif self.in_stock:
            clauses.append(f"{alias}.stock > 0")
        return (" and ".join(clauses) or "1"), params

    def matches(self, product: dict[str, Any]) -> bool:
        """The same test as :meth:`sql`, on a product dict (see ``catalog.get_products``)."""
        price = float(product["price"])
        if self.max_price is not None and price > self.max_price:
            return False
        if self.min_price is not None and price < self.min_price:
            return False
        if self.categories and product["category"] not in self.categories:
            return False
        sizes = {str(s).upper(): n for s, n in (product.get("sizes") or {}).items()}
        if self.sizes:
            return any(sizes.get(s, 0) > 0 for s in self.sizes)
        return not self.in_stock or int(product.get("stock") or 0) > 0


@dataclass(frozen=True)
class ParsedQuery:
    """A message split into the text for the searches and the structured filters."""

    text: str
    filters: Filters = field(default_factory=Filters)


def parse_query(
    message: str,
    label: str | None = None,
    *,
    in_stock: bool = True,
    vocabulary: CategoryVocabulary | None = None,
) -> ParsedQuery:
    """Split ``message`` into search text and :class:`Filters`.

    Price: "under 100", "below €80", "less than 50 euros", "up to 120", "< 60",
    "100 or less", "max 90" (ceiling); "over 50", "at least 40" (floor);
    "between 50 and 100" (both). Size: "size M", "sizes M or L", "size 38", "in a
    medium", "XL", "in M" (capital), "EU 42", "W32". Category: the catalogue's category
    names, the shop's synonyms and garment words ("jacket", "boots", "jumper", ...)
    through ``vocabulary`` (:meth:`CategoryVocabulary.for_catalogue`; None: the built-in
    garment words, :data:`~chainrun.retrieval.categories.BUILTIN_VOCABULARY`), and the
    classify ``label`` when it names a category or such a word. Price and size phrases
    are cut from the text; garment words stay (they are good search terms).
    """
    text = message
    max_price: float | None = None
    min_price: float | None = None
    m = _BETWEEN.search(text)
    if m:
        lo, hi = sorted((parse_price(m.group(1)), parse_price(m.group(2))))
        min_price, max_price = lo, hi
        text = text[: m.start()] + " " + text[m.end() :]
    for pattern in _MAX_PRICE:
        for m in pattern.finditer(text):
            value = parse_price(m.group(1))
            max_price = value if max_price is None else min(max_price, value)
        text = pattern.sub(" ", text)
    for pattern in _MIN_PRICE:
        for m in pattern.finditer(text):
            value = parse_price(m.group(1))
            min_price = value if min_price is None else max(min_price, value)
        text = pattern.sub(" ", text)
    sizes: list[str] = []
    for m in _SIZE_LIST.finditer(text):
        sizes.extend(_norm_size(s) for s in re.split(r"\s*(?:,|/|\bor\b|\band\b)\s*", m.group(1)))
    text = _SIZE_LIST.sub(" ", text)
    for pattern in _SIZE_ALONE:
        sizes.extend(_norm_size(m.group(1)) for m in pattern.finditer(text))
        text = pattern.sub(" ", text)
    filters = Filters(
        max_price=max_price,
        min_price=min_price,
        sizes=tuple(dict.fromkeys(s for s in sizes if s)),
        categories=(vocabulary or BUILTIN_VOCABULARY).find(text, label),
        in_stock=in_stock,
    )
    return ParsedQuery(re.sub(r"\s+", " ", text).strip(" ,.?!;:"), filters)


def parse_filters(message: str, label: str | None = None) -> Filters:
    """The :class:`Filters` of ``message`` (see :func:`parse_query`)."""
    return parse_query(message, label).filters


class FilterSearch:
    """Browse by filters alone: products passing them, cheapest first.

    Answers [] when the message set no constraint (browsing the whole catalogue answers
    nothing). It is the last resort of the default order: "anything under 30 in XL?"
    has no search terms but clear constraints.
    """

    name = "filter"

    def __init__(self, db: sqlite_utils.Database, *, reader: CatalogReader | None = None) -> None:
        self.db = db
        self.reader = reader or reader_for(db)

    async def search(self, query: str, k: int, *, filters: Filters | None = None) -> list[Hit]:
        if filters is None or not filters.constrains:
            return []
        where, params = filters.sql("p")
        sql = f"select p.id from products p where {where} order by p.price, p.id limit ?"
        args = [*params, k]
        rows = await self.reader.run(lambda db: db.execute(sql, args).fetchall())
        n = len(rows)
        # a browse has no relevance: score by position so that higher is better
        return [Hit(r[0], float(n - i), self.name) for i, r in enumerate(rows)]
