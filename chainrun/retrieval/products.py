"""The products a turn was shown, as data: what a search step hands on in the turn state.

A search step (the ``retrieve`` kind) writes the turn-state field ``products`` as a tuple
of :class:`ShownProduct` (in the order found); the compose prompt shows them as text
(:func:`render_products`, the lines of
:func:`chainrun.retrieval.base.format_for_prompt`), and the step's row in the log holds
them as JSON (:meth:`ShownProduct.as_json`, one object per product), so a check of the
answer against the products reads ids, prices and stock, never prompt text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chainrun.retrieval.base import format_for_prompt

#: The catalogue's currency (ISO 4217): every catalogue price is in euros
CATALOGUE_CURRENCY = "EUR"
#: The turn-state field that holds the products a turn was shown (declared by
#: :data:`chainrun.steps.retrieve.PRODUCTS`); its writer's ``steps`` row has it in
#: ``updates``
PRODUCTS_FIELD = "products"


@dataclass(frozen=True)
class ShownProduct:
    """One product a turn's search showed, with what the compose prompt is shown of it.

    Attributes:
        id: the catalogue id (``JKT-005``).
        title: the product's title.
        category: its category (lower case, ``jackets``).
        price: its price, in ``currency`` units.
        currency: ISO 4217 code of ``price`` (``EUR`` for the catalogue).
        colours: its colours, as the catalogue names them.
        sizes: units in stock by size label (``{"S": 3, "M": 0}``); empty: the product has
            no sizes.
        stock: units in stock over all sizes (None: unknown).
        source: the search that found it first (``keyword``, ``vector``...), or None.
        locale: the locale its catalogue writes amounts in (CLDR, ``de_CH``; None: the
            default), the format its price is shown in.
    """

    id: str
    title: str
    category: str
    price: float
    currency: str = CATALOGUE_CURRENCY
    colours: tuple[str, ...] = ()
    sizes: Mapping[str, int] = field(default_factory=dict)
    stock: int | None = None
    source: str | None = None
    locale: str | None = None

    @property
    def sizes_in_stock(self) -> tuple[str, ...]:
        """The size labels with at least one unit in stock, in catalogue order."""
        return tuple(s for s, n in self.sizes.items() if n > 0)

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> ShownProduct:
        """From a retrieval result's item (a product dict: id, title, category, price,
        colours, sizes, stock, source; see :class:`chainrun.retrieval.base.RetrievalResult`)
        or from :meth:`as_json`'s object read back from the log.

        Raises:
            KeyError: ``id``, ``title`` or ``price`` is missing.
        """
        stock = item.get("stock")
        return cls(
            id=str(item["id"]), title=str(item["title"]),
            category=str(item.get("category") or ""), price=float(item["price"]),
            currency=str(item.get("currency") or CATALOGUE_CURRENCY),
            colours=tuple(str(c) for c in item.get("colours") or ()),
            sizes={str(s): int(n) for s, n in (item.get("sizes") or {}).items()},
            stock=None if stock is None else int(stock),
            source=item.get("source"), locale=item.get("locale"),
        )  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        """The product as a JSON object (the keys of the attributes; ``sizes`` an object
        of size label to units, ``colours`` a list)."""
        return {
            "id": self.id, "title": self.title, "category": self.category,
            "price": self.price, "currency": self.currency, "colours": list(self.colours),
            "sizes": dict(self.sizes), "stock": self.stock, "source": self.source,
            "locale": self.locale,
        }  # fmt: skip


def shown_products(items: Iterable[Mapping[str, Any]]) -> tuple[ShownProduct, ...]:
    """The products of a retrieval result's items, in their order."""
    return tuple(ShownProduct.from_item(item) for item in items)


def render_products(products: Sequence[ShownProduct]) -> str:
    """The products as the compose prompt shows them: one line each
    (:func:`~chainrun.retrieval.base.format_for_prompt`), ``(none)`` when there is none."""
    return format_for_prompt([p.as_json() for p in products]) or "(none)"


def render_products_again(products: Sequence[ShownProduct], seen: str) -> str:
    """:func:`render_products`, but the products whose lines ``seen`` (the prompt's
    history) already holds are named by their ids only, each run of them in one line,
    in their order (``- as above: JKT-008, JKT-012, JKT-005``): a follow-up about the
    products the turn before showed adds a few tokens to the prompt, not their lines
    again (with the embedded model's tokenizer, eight such products take 59 tokens as
    one line against 111 as ``- [ID] (as above)`` lines; each id is six or seven)."""
    if not products:
        return "(none)"
    lines: list[str] = []
    again: list[str] = []  # the current run of products named by id
    for p in products:
        line = format_for_prompt([p.as_json()])
        if line in seen:
            again.append(p.id)
            continue
        if again:
            lines.append("- as above: " + ", ".join(again))
            again = []
        lines.append(line)
    if again:
        lines.append("- as above: " + ", ".join(again))
    return "\n".join(lines)


def products_json(products: Sequence[ShownProduct]) -> list[dict[str, Any]]:
    """The products as the log stores them: a list of :meth:`ShownProduct.as_json`."""
    return [p.as_json() for p in products]


def logged_products(updates: Mapping[str, Any] | None) -> tuple[ShownProduct, ...] | None:
    """The products a step's logged ``updates`` (a ``steps`` row's) handed on, whichever
    kind the step is; None when it handed on none (it is not a search, it failed, or the
    row was logged before the log kept updates)."""
    shown = (updates or {}).get(PRODUCTS_FIELD)
    if not isinstance(shown, list):
        return None
    return tuple(ShownProduct.from_item(p) for p in shown if isinstance(p, dict))


__all__ = [
    "CATALOGUE_CURRENCY",
    "PRODUCTS_FIELD",
    "ShownProduct",
    "logged_products",
    "products_json",
    "render_products",
    "shown_products",
]
