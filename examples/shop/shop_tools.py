"""The example shop's tools: an order lookup (read-only), a cart (side effects) and
placing an order (side effects, run only after the shopper's yes: ``confirm = true``).

Both work on a small SQLite database, ``shop.db`` beside this file (or the file named
by ``SHOP_DB``), created with a few orders on first use. chainrun imports this module
because ``examples/shop/chainrun.toml`` names ``shop_tools:order_status`` and
``shop_tools:add_to_cart`` and ``shop_tools:place_order`` (the config's directory is
searched for it).
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from chainrun.retrieval.catalog import SAMPLE_CATALOG

#: the orders the example starts with: (id, status, carrier, eta, the shopper's user id)
ORDERS = [
    (1042, "shipped", "DHL", "2026-12-03", "u-ann"),
    (1043, "processing", None, "2026-12-05", "u-bob"),
    (1044, "delivered", "UPS", "2026-11-28", "u-ann"),
]


def db_path() -> Path:
    """The shop's database file: ``$SHOP_DB``, else ``shop.db`` beside this module."""
    return Path(os.environ.get("SHOP_DB") or Path(__file__).with_name("shop.db"))


def connect() -> sqlite3.Connection:
    """A connection to the shop's database, creating its tables and orders if needed."""
    conn = sqlite3.connect(db_path())
    with conn:
        conn.execute(
            "create table if not exists orders (id integer primary key, status text not null, "
            "carrier text, eta text, user_id text not null)"
        )
        conn.executemany("insert or ignore into orders values (?, ?, ?, ?, ?)", ORDERS)
        # one row per cart action; the idempotency key makes a repeated action a no-op
        conn.execute(
            "create table if not exists cart (idempotency_key text primary key, sku text not "
            "null, qty integer not null)"
        )
        # one row per order placed, keyed the same way
        conn.execute(
            "create table if not exists placed (idempotency_key text primary key, sku text not "
            "null, qty integer not null)"
        )
    return conn


def order_status(order_id: int, context: Any = None) -> dict[str, Any]:
    """Look an order up (read-only: safe to run again). With the shopper's identity
    (``context.user``, vouched for by the shop: ``chainrun serve --identity-header``) only
    the shopper's own orders are found; without one, any order (a demo without logins)."""
    user = getattr(context, "user", None)
    conn = connect()
    try:
        row = conn.execute(
            "select id, status, carrier, eta, user_id from orders where id = ?", [order_id]
        ).fetchone()
    finally:
        conn.close()
    if row is None or (user is not None and row[4] != user.user_id):
        return {"order_id": order_id, "found": False}
    return {"order_id": row[0], "found": True, "status": row[1], "carrier": row[2],
            "eta": row[3]}


def _record_once(
    table: str, sku: str, qty: int, idempotency_key: str
) -> tuple[bool, tuple[int, int]]:
    """Insert one ``(idempotency_key, sku, qty)`` row into ``table`` unless the key is
    there already; (whether it was inserted, the table's (row count, total qty) after it)."""
    conn = connect()
    try:
        with conn:
            cur = conn.execute(
                f"insert or ignore into {table} (idempotency_key, sku, qty) values (?, ?, ?)",
                [idempotency_key, sku, qty],
            )
        n = conn.execute(f"select count(*), coalesce(sum(qty), 0) from {table}").fetchone()
    finally:
        conn.close()
    return cur.rowcount == 1, n


@functools.cache
def catalogue_skus() -> frozenset[str]:
    """The product ids of the catalogue the chain searches (chainrun's sample catalogue,
    the one ``chainrun.toml`` leaves at its default), read once."""
    with SAMPLE_CATALOG.open(encoding="utf-8") as lines:
        return frozenset(json.loads(line)["id"] for line in lines if line.strip())


def _unknown(sku: str) -> dict[str, Any] | None:
    """The tool's result for a product the catalogue does not hold (nothing is recorded:
    the model may have made the id up), else None."""
    if sku in catalogue_skus():
        return None
    return {"error": f"no product {sku!r} in the catalogue", "sku": sku}


def add_to_cart(sku: str, qty: int, idempotency_key: str) -> dict[str, Any]:
    """Add ``qty`` of ``sku`` to the cart, once per idempotency key (a side effect); a
    product the catalogue does not hold is refused, nothing recorded."""
    if (refused := _unknown(sku)) is not None:
        return refused
    added, (_, items) = _record_once("cart", sku, qty, idempotency_key)
    return {"added": added, "sku": sku, "qty": qty, "items_in_cart": items}


def place_order(sku: str, qty: int, idempotency_key: str) -> dict[str, Any]:
    """Place an order for ``qty`` of ``sku``, once per idempotency key (a side effect;
    chainrun runs it only after the shopper said yes); a product the catalogue does not
    hold is refused, nothing placed."""
    if (refused := _unknown(sku)) is not None:
        return refused
    done, (n, _) = _record_once("placed", sku, qty, idempotency_key)
    return {"placed": done, "sku": sku, "qty": qty, "orders_placed": n}
