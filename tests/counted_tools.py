"""A tool that counts its own runs, for the tests that check how often chainrun ran it
(the tool config names it by module path: ``counted_tools:order_status``)."""

from __future__ import annotations

from typing import Any

#: the order ids the tool was run with, in order (tests clear it)
RUNS: list[int] = []


def order_status(order_id: int) -> dict[str, Any]:
    """Look an order up: records the run and answers "shipped"."""
    RUNS.append(order_id)
    return {"order_id": order_id, "status": "shipped"}


ORDER = {"description": "Look an order up", "function": f"{__name__}:order_status",
         "parameters": {"type": "object", "required": ["order_id"],
                        "properties": {"order_id": {"type": "integer"}}}}  # fmt: skip


#: the skus the cart tool added, in order (tests clear it)
CART_RUNS: list[str] = []


def add_to_cart(sku: str, qty: int) -> dict[str, Any]:
    """A tool with side effects: records the run (the count the tests check)."""
    CART_RUNS.append(sku)
    return {"added": sku, "qty": qty}


CART = {"description": "Add a product to the cart", "function": f"{__name__}:add_to_cart",
        "side_effects": True,
        "parameters": {"type": "object", "required": ["sku", "qty"],
                       "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}}}
