"""A rich table printed without rich's layout engine, where that gives the same output.

rich lays a table out cell by cell (markup, measurement, wrapping, padding: about
0.1 ms a cell), twice when :func:`chainrun.cli.fit.fit_table` has measured it first.
``chainrun show`` prints two or three small tables a turn, and on a log of 300 turns
that layout was most of its 5 s (``benchmarks/README.md``, "``chainrun show`` and
``runs`` start-up"). Most of those tables are plain: one line per cell, no styles, every
column at its natural width. :func:`fitted` renders such a table itself, writing the
segments rich would write (the same characters and, on a terminal, the same styles), and
hands any other table to :func:`~chainrun.cli.fit.fit_table` and rich as before: a cell
that would wrap, markup that styles a cell, a title, edge settings it does not know.
``tests/test_cli_grid.py`` checks the two against each other on random tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from chainrun.cli.fit import drop_order, fit_table, left_out_note


def fitted(table: Table) -> Any:
    """A renderable that prints ``table`` as ``fit_table(table, console)`` would print it
    on the console that prints it.

    ``table`` is not changed when the fast path renders it; otherwise it is passed to
    :func:`~chainrun.cli.fit.fit_table` (which leaves columns out and fixes widths in
    place) when the table is printed.
    """
    return _Fitted(table)


class _Fitted:
    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        plan = _plan(self.table, console, options)
        if plan is None:
            yield from console.render(fit_table(self.table, console), options)
            return
        yield from _render(self.table, console, options, *plan)


def _plain_table(table: Table) -> bool:
    """Whether ``table`` uses only what :func:`_render` draws as rich does."""
    return (
        table.box is not None
        and bool(table.rows)  # a table of headers alone, or of one column: rich's own way
        and len(table.columns) > 1
        and table.show_header
        and not table.show_footer
        and not table.show_lines
        and not table.leading
        and not table.row_styles
        and table.style in ("", "none")
        and not table.border_style
        and table.title is None
        and table.width is None
        and table.min_width is None
        and not table.expand
        and tuple(table.padding) == (0, 1, 0, 1)
        and table.pad_edge
        and not table.collapse_padding
        and all(r.style is None and not r.end_section for r in table.rows)
        and all(
            c.justify in ("left", "right")
            and not c.style
            and not c.header_style
            and not c.footer
            and c.width is None
            and c.min_width is None
            and c.max_width is None
            and c.ratio is None
            for c in table.columns
        )
    )


def _cell_text(cell: Any, console: Console, markup: bool) -> str | None:
    """The plain text rich would draw for ``cell``, or None when rich would style it,
    wrap it or split it over lines."""
    if isinstance(cell, Text):
        if cell.spans or cell.style or cell.justify or cell.overflow or cell.no_wrap:
            return None
        text = cell.plain
    elif isinstance(cell, str):
        text = cell
        if "[" in text or ":" in text:  # markup or an emoji code: as rich reads it
            rendered = console.render_str(text, markup=markup, highlight=False)
            if rendered.spans or rendered.style:
                return None
            text = rendered.plain
    else:
        return None
    # control characters, line breaks and tabs (rich splits or expands them), and the
    # other characters Python calls unprintable (no-break spaces among them): rich's way
    return text if text.isprintable() else None


def _plan(
    table: Table, console: Console, options: ConsoleOptions
) -> tuple[list[int], list[list[str]], list[str]] | None:
    """(kept column indices, their cells as text, columns left out), or None when rich
    must lay the table out (a cell that would wrap or is styled, a table too wide)."""
    width = console.width
    if options.max_width != width or not _plain_table(table):
        return None
    markup = bool(options.markup) if options.markup is not None else console._markup
    columns: list[list[str]] = []
    wide: list[int] = []  # natural width of each column (its widest line)
    narrow: list[int] = []  # fit_table's min_width: the longest word, or whole if no_wrap
    for column in table.columns:
        texts = []
        for cell in [column.header, *column.cells]:
            text = _cell_text(cell, console, markup)
            if text is None or (text != text.strip() and not column.no_wrap):
                return None  # rich would strip or reflow the spaces
            if column.justify == "right" and text != text.rstrip():
                return None
            texts.append(text)
        sizes = [cell_len(t) for t in texts]
        wide.append(max(sizes))
        if column.no_wrap:
            narrow.append(wide[-1])
        else:
            words = [max((cell_len(w) for w in t.split()), default=0) for t in texts]
            narrow.append(max(words))
        columns.append(texts)
    headers = [str(c.header) for c in table.columns]
    kept = list(range(len(table.columns)))
    order = drop_order(table)
    lines = len(table.columns) - 1 + (2 if table.show_edge else 0)
    dropped: list[str] = []
    while sum(narrow[i] + 2 for i in kept) + lines > width and len(kept) > 1:
        names = [headers[i] for i in kept]
        name = next((n for n in order if n in names[1:]), None)
        if name is None:
            break
        kept.pop(names.index(name))
        lines -= 1
        dropped.append(name.strip() or "bars")
    if sum(wide[i] + 2 for i in kept) + lines > width or len(kept) == 1:
        return None  # a cell would wrap: rich's layout, as fit_table leaves it
    return kept, [columns[i] for i in kept], dropped


def _render(
    table: Table,
    console: Console,
    options: ConsoleOptions,
    kept: list[int],
    cells: list[list[str]],
    dropped: list[str],
) -> Iterator[Segment]:
    """The segments of rich's ``Table._render`` for a plain table at natural widths."""
    widths = [max(cell_len(t) for t in col) + 2 for col in cells]
    border = console.get_style(table.style or "") + console.get_style(table.border_style or "")
    assert table.box is not None
    box = table.box.substitute(options, safe=table.safe_box if table.safe_box is not None
                               else console.safe_box)  # fmt: skip
    header_style = console.get_style(table.header_style or "")
    justify = [table.columns[i].justify for i in kept]
    new_line = Segment.line()
    edge = table.show_edge
    if edge:
        yield Segment(box.get_top(widths), border)
        yield new_line
    n_rows = len(cells[0])
    for row in range(n_rows):
        first, last = row == 0, row == n_rows - 1
        style = header_style if first else None
        left, right, divider = (
            (box.head_left, box.head_right, box.head_vertical) if first
            else (box.foot_left, box.foot_right, box.foot_vertical) if last
            else (box.mid_left, box.mid_right, box.mid_vertical)
        )  # fmt: skip
        if edge:
            yield Segment(left, border)
        for i, col in enumerate(cells):
            if widths[i] == 2:  # an empty column: rich draws its padding as one segment
                yield Segment("  ", style)
            else:
                text = col[row]
                pad = " " * (widths[i] - 2 - cell_len(text))
                yield Segment(" ", style)
                yield Segment(text + pad if justify[i] == "left" else pad + text, style)
                yield Segment(" ", style)
            if i < len(cells) - 1:
                yield Segment(divider, border)
        if edge:
            yield Segment(right, border)
        yield new_line
        if first:
            yield Segment(box.get_row(widths, "head", edge=edge), border)
            yield new_line
    if edge:
        yield Segment(box.get_bottom(widths), border)
        yield new_line
    caption = table.caption
    if dropped:
        note = left_out_note(console.width, dropped)
        caption = note if caption is None else f"{caption}\n{note}"
    if caption:
        render_options = options.update(
            width=sum(widths) + len(widths) - 1 + (2 if edge else 0),
            highlight=table.highlight, height=None,
        )  # fmt: skip
        drawn = (
            console.render_str(caption, highlight=False,
                               style=Style.pick_first(table.caption_style, "table.caption"))
            if isinstance(caption, str) else caption
        )  # fmt: skip
        yield from console.render(drawn, render_options.update(justify=table.caption_justify))
