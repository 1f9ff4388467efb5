"""Help that wraps instead of being cut: typer lays out ``--help`` with rich, whose
table columns cut a word longer than their width with "…" (rich's default ``overflow``
of a column, "ellipsis"). At 80 columns an option's help column is some 17 characters,
so an environment variable or a URL in it (``CHAINRUN_SERVE_TOKEN``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``postgresql://USER@HOST/DB``) lost its end. Here such a
word is folded onto the next line instead (rich's ``overflow="fold"``, see
https://rich.readthedocs.io/en/stable/text.html); words still wrap at spaces first.

Imported only when help is printed (typer's help module costs some 80 ms of imports).
"""

from __future__ import annotations

from typing import Any

from rich.columns import Columns
from rich.table import Table
from rich.text import Text
from typer import rich_utils

__all__ = ["install"]


class _FoldingTable(Table):
    """A help panel's table whose columns fold a word too long for them."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*renderables, **kwargs)
        for column in self.columns:
            column.overflow = "fold"


class _FoldingColumns(Columns):
    """An option's help (its text, env var, default), each part folding a word too long
    for the column."""

    def __init__(self, renderables: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(renderables, *args, **kwargs)
        for part in self.renderables:
            if isinstance(part, Text) and part.overflow is None:
                part.overflow = "fold"


def install() -> None:
    """Make typer's help panels fold instead of cut (idempotent)."""
    rich_utils.Table = _FoldingTable  # type: ignore[misc]
    rich_utils.Columns = _FoldingColumns  # type: ignore[misc]
