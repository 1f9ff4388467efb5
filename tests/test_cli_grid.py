"""The CLI's plain-table drawing (:func:`chainrun.cli.grid.fitted`) prints exactly what
rich prints after :func:`chainrun.cli.fit.fit_table`, on random tables: at every width,
on a terminal (styles) and not, with columns left out, wide characters, markup and cells
that must wrap (those go to rich)."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from chainrun.cli.fit import drop_first, fit_table
from chainrun.cli.grid import _plan, fitted

_PLAIN = ["ok", "failed_open", "compose", "12", "1234", "", "$0.000000", "not_fired", "a b c",
          "long words here and there", "日本語", "█████", "   ███", "ünïcödé", "12:30",
          "2026-12-02T10:00:00", "x" * 30, "—", ":smile:", r"\[x]", "a  b"]  # fmt: skip
_ODD = ["[bold]x[/]", "x\ny", "tab\there", "\x1b[31m", " lead", "trail ", "\u00a0nb"]


def _spec(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 14)
    names = ["step", "ms", "", "duration_ms", "x", "attempt", "a long header", "in"]
    cols = [(rng.choice(names) + str(i) * rng.randint(0, 1), rng.choice(["left", "right"]),
             rng.random() < 0.2) for i in range(n)]  # fmt: skip

    def cell() -> str:
        return rng.choice(_ODD) if rng.random() < 0.02 else rng.choice(_PLAIN)

    return {
        "cols": cols,
        "rows": [[cell() for _ in range(n)] for _ in range(rng.randint(0, 6))],
        "drop": rng.sample([c[0] for c in cols], k=rng.randint(0, n)),
        "edge": rng.random() < 0.5,
        "caption": rng.choice([None, None, "a caption"]),
        "width": rng.randint(15, 200),
        "terminal": rng.random() < 0.5,
    }


def _table(spec: dict[str, Any]) -> Table:
    t = Table(show_edge=spec["edge"], caption=spec["caption"])
    for name, justify, no_wrap in spec["cols"]:
        t.add_column(name, justify=justify, no_wrap=no_wrap)
    for row in spec["rows"]:
        t.add_row(*row)
    return drop_first(t, *spec["drop"])


def _console(spec: dict[str, Any]) -> Console:
    return Console(file=io.StringIO(), width=spec["width"], force_terminal=spec["terminal"],
                   color_system="standard" if spec["terminal"] else None, highlight=False,
                   soft_wrap=True)  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_plain_tables_print_as_rich_prints_them(seed: int) -> None:
    rng = random.Random(seed)
    drawn = 0
    for _ in range(400):
        spec = _spec(rng)
        before, after = _console(spec), _console(spec)
        before.print(fit_table(_table(spec), before))
        after.print(fitted(_table(spec)))
        assert after.file.getvalue() == before.file.getvalue(), spec  # type: ignore[attr-defined]
        drawn += _plan(_table(spec), after, after.options) is not None
    assert 40 < drawn < 360  # both ways were taken: the fast one and rich's


def test_a_cell_that_would_wrap_goes_to_rich() -> None:
    t = Table(show_edge=False)
    t.add_column("a")
    t.add_column("b")
    t.add_row("word " * 30, "x")
    console = Console(file=io.StringIO(), width=40)
    assert _plan(t, console, console.options) is None
    t2 = Table(show_edge=False)
    t2.add_column("a")
    t2.add_column("b")
    t2.add_row("word", "x")
    assert _plan(t2, console, console.options) is not None
