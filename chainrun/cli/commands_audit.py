"""``chainrun audit``: the slow-chain checklist from the run log (HTML, Markdown, JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from chainrun.cli import DEFAULT_DB_PATH, DbOpt, JsonOpt, app, fail, handle_errors, out, print_json

DEFAULT_QUERIES = Path("evals/retrieval_queries.jsonl")


@app.command("audit")
@handle_errors
def audit_command(
    run: Annotated[
        list[int] | None,
        typer.Option("--run", help="Run to audit (repeatable; default: the latest replay run)."),
    ] = None,
    live: Annotated[
        str | None,
        typer.Option("--live", help="Live turns in FROM..TO (ISO-8601; default: all live turns)."),
    ] = None,
    eval_run: Annotated[
        list[int] | None,
        typer.Option("--eval-run", help="Eval run (repeatable; default: every eval run)."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="html, md or json.")] = "html",
    out_path: Annotated[
        Path | None,
        typer.Option("--out", help="Report file (default audit-DATE.EXT; '-' for stdout)."),
    ] = None,
    fail_on: Annotated[
        str | None, typer.Option("--fail-on", help="Exit 1 when an item is warn (or fail).")
    ] = None,
    queries: Annotated[
        Path | None,
        typer.Option(
            "--queries",
            help="Labelled retrieval queries for item 6's recall cost "
            f"(default {DEFAULT_QUERIES} when it exists).",
        ),
    ] = None,
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
) -> None:
    """Judge the seven-item slow-chain checklist from the log and write a report."""
    from rich.table import Table

    from chainrun.audit import FORMATS, audit, default_path, fails_on, load_labelled_queries, render
    from chainrun.audit import write_report as write
    from chainrun.log.store import Store

    if fmt not in FORMATS:
        fail(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if fail_on not in (None, "warn", "fail"):
        fail(f"--fail-on: expected warn or fail, got {fail_on!r}")
    if queries is None and DEFAULT_QUERIES.exists():
        queries = DEFAULT_QUERIES
    labelled = load_labelled_queries(queries) if queries is not None else None
    with Store.open(db, create=False) as store:
        report = audit(store, run or [], live, eval_run or [], labelled)
    form: Literal["html", "md", "json"] = "json" if as_json else fmt  # type: ignore[assignment]
    text = render(report, form)
    if as_json:
        print_json(report.as_json())
    elif str(out_path) == "-":
        typer.echo(text, nl=False)
    else:
        path = write(text, out_path or default_path(form))
        table = Table(title=f"chainrun audit → {path}")
        for col in ("#", "item", "verdict"):
            table.add_column(col)
        for item in report.items:
            table.add_row(str(item.id), item.title, item.verdict)
        out.print(table)
    if fail_on is not None and any(fails_on(i.verdict, fail_on) for i in report.items):  # type: ignore[arg-type]
        raise typer.Exit(1)
