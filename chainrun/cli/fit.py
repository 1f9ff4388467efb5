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


def drop_order(table: Table) -> list[str]:
    """The headers :func:`fit_table` leaves out, in order, when ``table`` is too wide:
    those named by :func:`drop_first`, then the rest from the right (never the first)."""
    order = [*_DROP_ORDER.get(table, ())]
    order += [_header(c) for c in reversed(table.columns[1:]) if _header(c) not in order]
    return order


def left_out_note(width: int, dropped: list[str]) -> str:
    """The caption line naming the columns left out at ``width`` columns."""
    return f"left out at {width} columns: {', '.join(dropped)} (a wider terminal or --json)"


def _lines(table: Table) -> int:
    """Characters a table spends on lines: between columns and, with ``show_edge``, the
    two outer ones."""
    if table.box is None:
        return 0
    return len(table.columns) - 1 + (2 if table.show_edge else 0)


def _narrowest(table: Table) -> int:
    """The table's width with every column at its ``min_width``, padding and lines in."""
    _, right, _, left = table.padding
    return sum((c.min_width or 0) + left + right for c in table.columns) + _lines(table)


def _share_width(table: Table, console: Console, options: Any, width: int) -> None:
    """Fix each column's width when the table is wider than ``width``: every column gets
    its ``min_width`` and the rest is shared in proportion to what each would take beyond
    it. (rich's own narrowing takes no account of a column's ``min_width`` and can run a
    table a character over the width.)"""
    _, right, _, left = table.padding
    wants = [
        max(Measurement.get(console, options, w).maximum for w in [c.header, *c.cells])
        for c in table.columns
    ]
    mins = [c.min_width or 0 for c in table.columns]
    room = width - _lines(table) - (left + right) * len(table.columns)
    if sum(wants) <= room:
        return
    spare = max(0, room - sum(mins))
    over = [w - m for w, m in zip(wants, mins, strict=True)]
    total = sum(over) or 1
    shares = [spare * o // total for o in over]
    for i in sorted(range(len(over)), key=lambda i: -over[i])[: spare - sum(shares)]:
        shares[i] += 1  # the rounding remainder, to the columns that want most
    for column, m, extra in zip(table.columns, mins, shares, strict=True):
        column.width = m + extra


def fit_table(table: Table, console: Console, width: int | None = None) -> Table:
    """``table`` made to fit ``width`` columns (default: the console's) without cutting a
    number or a word.

    Every cell wraps at spaces and never ends in an ellipsis (rich's default cuts a
    long cell to ``227…``); a column made ``no_wrap`` (a waterfall's bars) keeps its
    width. When even the narrowest rendering (each column as wide as its
    longest word) is wider than ``width``, columns are left out until it fits: first
    those named by :func:`drop_first`, in that order, then from the right (never the
    first column); the caption names what was left out (``--json`` has every field).
    """
    width = width or console.width
    # measured on an unbounded width: rich clamps a measurement to the width it is given
    options = console.options.update_width(1 << 16)
    for column in table.columns:
        column.overflow = "fold"
        # no column narrower than its longest word (rich would fold a number in two); a
        # column its table marks no_wrap (a bar) is as wide as its widest cell, or left out
        words = [column.header, *column.cells]
        sizes = [Measurement.get(console, options, w) for w in words]
        column.min_width = max(m.maximum if column.no_wrap else m.minimum for m in sizes)
    order = drop_order(table)
    dropped: list[str] = []
    while _narrowest(table) > width and len(table.columns) > 1:
        names = [_header(c) for c in table.columns]
        name = next((n for n in order if n in names[1:]), None)
        if name is None:
            break
        del table.columns[names.index(name)]
        dropped.append(name.strip() or "bars")
    _share_width(table, console, options, width)
    if dropped:
        note = left_out_note(width, dropped)
        table.caption = note if table.caption is None else f"{table.caption}\n{note}"
    return table
