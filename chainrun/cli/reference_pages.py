"""The generated parts of the docs' reference pages, written into the committed Markdown.

Four pages hold a part made from the code: ``docs/reference/configuration.md`` (every key
of every table, from the pydantic config models), ``docs/reference/log.md`` (the log's
tables, column by column), ``docs/reference/cli.md`` (every command with its help,
arguments and options, from the typer app itself) and ``docs/reference/lab-scenarios.md``
(every key of a latency-lab scenario file, from its pydantic model). Each part sits
between two markers::

    <!-- generated: cli -->
    ...
    <!-- end generated: cli -->

and is committed, so a reader of the repository reads the same page the docs site shows.
Regenerate after changing a config model, a log row model, a migration or a command::

    python -m chainrun.cli.reference_pages          # rewrite the pages
    python -m chainrun.cli.reference_pages --check  # exit 1 naming the stale pages

``tests/test_reference.py`` fails while a committed page differs from what this writes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer.main

from chainrun.reference.pages import config_markdown, lab_scenario_markdown, log_markdown

#: the repository's docs/reference folder (this file is chainrun/cli/reference_pages.py)
REFERENCE_DIR = Path(__file__).resolve().parents[2] / "docs" / "reference"


def commands(group: Any = None, path: tuple[str, ...] = ("chainrun",)) -> list[tuple[str, Any]]:
    """Every command of the CLI as ``("chainrun show", click command)``, in the app's order."""
    if group is None:
        from chainrun.cli import app

        group = typer.main.get_command(app)
    found: list[tuple[str, Any]] = []
    for name, sub in group.commands.items():
        if hasattr(sub, "commands"):
            found += commands(sub, (*path, name))
        else:
            found.append((" ".join((*path, name)), sub))
    return found


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def cli_markdown() -> str:
    """One section per command: its help, then a table of its arguments and options."""
    out: list[str] = []
    for name, cmd in commands():
        out.append(f"## `{name}`\n")
        out.append((cmd.help or "").strip().replace("\b\n", "") + "\n")
        out.append("| argument or option | default | meaning |")
        out.append("|---|---|---|")
        for param in cmd.params:
            if param.param_type_name == "argument":
                label = f"`{(param.metavar or param.name).upper()}`"
            else:
                label = ", ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
            default = param.default
            shown = "" if default is None or param.required or callable(default) else f"`{default}`"
            if getattr(param, "is_flag", False) and default is False:
                shown = ""
            help_text = getattr(param, "help", None) or ""
            out.append(f"| {label} | {_cell(shown)} | {_cell(help_text)} |")
        out.append("")
    return "\n".join(out)


#: page file name -> (part name, the function that renders the part)
GENERATED: Mapping[str, tuple[str, Callable[[], str]]] = {
    "configuration.md": ("configuration", config_markdown),
    "log.md": ("log", log_markdown),
    "cli.md": ("cli", cli_markdown),
    "lab-scenarios.md": ("lab-scenarios", lab_scenario_markdown),
}


def fill(markdown: str, part: str, content: str, *, page: str = "page") -> str:
    """``markdown`` with the text between ``<!-- generated: PART -->`` and ``<!-- end
    generated: PART -->`` replaced by ``content`` (an opening marker without its end
    marker gets one after the content).

    Raises:
        ValueError: the page has no opening marker for ``part``, or has it twice.
    """
    start = f"<!-- generated: {part} -->"
    end = f"<!-- end generated: {part} -->"
    if markdown.count(start) != 1:
        raise ValueError(f"{page}: expected one line {start!r}, found {markdown.count(start)}")
    head, _, rest = markdown.partition(start)
    _, found_end, tail = rest.partition(end)
    if not found_end:
        tail = rest
    block = f"{start}\n\n{content.strip()}\n\n{end}"
    return head + block + ("\n\n" + tail.lstrip("\n") if tail.strip() else "\n")


def stale_pages(reference_dir: Path = REFERENCE_DIR, *, write: bool = False) -> list[str]:
    """The reference pages whose generated part differs from the code's; with ``write``,
    rewrite them (each file replaced whole: written beside it, then renamed).

    Returns the stale pages' file names (before writing)."""
    stale: list[str] = []
    for name, (part, render) in GENERATED.items():
        path = reference_dir / name
        old = path.read_text(encoding="utf-8")
        new = fill(old, part, render(), page=str(path))
        if new == old:
            continue
        stale.append(name)
        if write:
            tmp = path.with_suffix(".md.tmp")
            tmp.write_text(new, encoding="utf-8")
            tmp.replace(path)
    return stale


_USAGE = "usage: python -m chainrun.cli.reference_pages [--check]"


def main(argv: list[str]) -> int:
    """Rewrite the stale pages (exit 0), or with ``--check`` name them (exit 1 if any)."""
    if argv not in ([], ["--check"]):
        print(_USAGE, file=sys.stderr)
        return 2
    check = argv == ["--check"]
    stale = stale_pages(write=not check)
    for name in stale:
        verb = "stale" if check else "rewritten"
        print(f"docs/reference/{name}: {verb}", file=sys.stderr)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
