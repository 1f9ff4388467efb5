"""Tables that fit the terminal without cutting a number (wrap, or leave columns out in
a stated order): applied by the CLI's console to every table it prints."""

from __future__ import annotations

import weakref
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

#: per table, the columns to leave out first when the terminal is too narrow
_DROP_ORDER: weakref.WeakKeyDictionary[Table, tuple[str, ...]] = weakref.WeakKeyDictionary()


def drop_first(table: Table, *headers: str) -> Table:
    """State which columns of ``table`` :func:`fit_table` leaves out first, in order."""
    _DROP_ORDER[table] = headers
    return table


def _header(column: Any) -> str:
    return str(column.header)


def fit_table(table: Table, console: Console, width: int | None = None) -> Table:
    """``table`` made to fit ``width`` columns (default: the console's) without cutting a
    number or a word.

    Every cell wraps at spaces and never ends in an ellipsis (rich's default cuts a long
    cell to ``227…``). When even the narrowest rendering (each column as wide as its
    longest word) is wider than ``width``, columns are left out until it fits: first
    those named by :func:`drop_first`, in that order, then from the right (never the
    first column); the caption names what was left out (``--json`` has every field).
    """
    width = width or console.width
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    options = console.options.update_width(width)
    order = [*_DROP_ORDER.get(table, ())]
    order += [_header(c) for c in reversed(table.columns[1:]) if _header(c) not in order]
    dropped: list[str] = []
    while Measurement.get(console, options, table).minimum > width and len(table.columns) > 1:
        names = [_header(c) for c in table.columns]
        name = next((n for n in order if n in names[1:]), None)
        if name is None:
            break
        del table.columns[names.index(name)]
        dropped.append(name.strip() or "(bar)")
    if dropped:
        note = f"left out at {width} columns: {', '.join(dropped)} (a wider terminal or --json)"
        table.caption = note if table.caption is None else f"{table.caption}\n{note}"
    return table
