"""MkDocs hooks: the pages made at build time.

- ``<!-- generated: configuration -->`` in a page becomes the configuration reference
  (every key of every table, from the pydantic config models: ``chainrun.reference.pages``).
- ``<!-- generated: log -->`` becomes the log's tables, column by column, from the row
  models and the schema after every migration.
- ``<!-- generated: cli -->`` becomes every command of ``chainrun`` with its help, its
  arguments and options (from the typer app itself).
- ``measurements.md`` is ``benchmarks/README.md`` as it is in the repository; a link to
  ``benchmarks/README.md#section`` from any page points at that page, so ``mkdocs build
  --strict`` checks that the section exists.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import typer.main
from mkdocs.structure.files import File, Files

from chainrun.cli import app as cli_app
from chainrun.reference.pages import config_markdown, log_markdown

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = "measurements.md"
_BENCH_LINK = re.compile(r"\]\(((?:\.\./)+)benchmarks/README\.md(#[^)\s]*)?\)")


def commands(group: Any = None, path: tuple[str, ...] = ("chainrun",)) -> list[tuple[str, Any]]:
    """Every command of the CLI as ``("chainrun show", click command)``, in the app's order."""
    group = typer.main.get_command(cli_app) if group is None else group
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


_GENERATED = {
    "<!-- generated: configuration -->": config_markdown,
    "<!-- generated: log -->": log_markdown,
    "<!-- generated: cli -->": cli_markdown,
}


def on_files(files: Files, config: Any) -> Files:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    note = (
        "!!! note\n    This page is `benchmarks/README.md` from the repository: every "
        "measurement with its command, date, machine and load, oldest first. The "
        "[headline figures](benchmarks.md) summarise what holds now.\n\n"
    )
    title, _, rest = text.partition("\n")
    files.append(File.generated(config, MEASUREMENTS, content=f"{title}\n\n{note}{rest}"))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    for marker, render in _GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    here = posixpath.dirname(page.file.src_uri)

    def to_measurements(m: re.Match[str]) -> str:
        target = posixpath.relpath(MEASUREMENTS, here or ".")
        return f"]({target}{m.group(2) or ''})"

    return _BENCH_LINK.sub(to_measurements, markdown)
