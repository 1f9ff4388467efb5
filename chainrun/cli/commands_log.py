"""``chainrun log copy``: copy the runs of one log into another (e.g. SQLite logs into
one PostgreSQL log); ``chainrun log export-replay``: logged turns as a replay set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from chainrun.cli import (
    DEFAULT_DB_PATH,
    DbOpt,
    JsonOpt,
    handle_errors,
    log_app,
    out,
    print_json,
)


@log_app.command("copy")
@handle_errors
def copy_command(
    source: Annotated[str, typer.Argument(help="The log to copy from (a SQLite file or a URL).")],
    target: Annotated[
        str, typer.Argument(help="The log to copy into: postgresql://USER@HOST/DB or a file.")
    ],
    process: Annotated[
        str | None,
        typer.Option(help="The name the copied runs carry (default: the source file's name "
                     "without suffix, as compare's RUN@PROCESS)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Copy every run of SOURCE (turns, steps, calls, eval results) into TARGET under new
    ids, each tagged with the process it came from; a run copied before is skipped."""
    from chainrun.log.copy import copy_runs
    from chainrun.log.several_logs import process_name
    from chainrun.log.store import Store

    with Store.open(source, create=False) as src:
        name = process or (src.name if src.url else process_name(Path(source)))
        with Store.open(target) as dst:
            done = copy_runs(src, dst, process=name)
            target_name = dst.name
    doc = {"source": src.name, "target": target_name, "process": name, "copied": done.rows,
           "skipped_runs": done.skipped_runs,
           "run_ids": {str(k): v for k, v in done.run_ids.items()}}  # fmt: skip
    if as_json:
        print_json(doc)
        return
    rows = ", ".join(f"{n} {t}" for t, n in done.rows.items())
    skipped = f"; {len(done.skipped_runs)} runs copied before, skipped" if done.skipped_runs else ""
    out.print(f"copied {rows} from {src.name} into {target_name} as process {name!r}{skipped}",
              markup=False)  # fmt: skip


@log_app.command("export-replay")
@handle_errors
def export_replay_command(
    source: Annotated[
        str,
        typer.Argument(help="The turns: a run id, or live (the live runs' turns, "
                       "narrowed by --since and --until)."),
    ],
    out_file: Annotated[Path, typer.Argument(help="The replay file to write (JSON Lines).")],
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Only turns with this label (repeatable).")
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option("--status", help="Only turns that ended with this status (repeatable: "
                     "ok, cut, refused, replaced, error, cancelled, lost)."),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="With live: turns that started at or after this time "
                                 "(ISO-8601; UTC unless it says otherwise).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="With live: turns that started before this time (a "
                                 "date alone: the whole day).")
    ] = None,
    db: DbOpt = DEFAULT_DB_PATH,
) -> None:
    """Write logged turns as a replay set: each turn's message with its conversation, its
    place in it, the shopper it was for (replayed as that identity) and the live
    duration; `chainrun replay OUT_FILE` then runs them, and `chainrun compare RUN live
    --since ...` compares the replay with the traffic it came from."""
    from chainrun.log.store import Store
    from chainrun.replay.export import replay_lines, write_replay_file

    with Store.open(db, create=False) as store:
        lines = replay_lines(store, source, since=since, until=until, labels=label or (),
                             statuses=status or ())
    write_replay_file(out_file, lines)
    conversations = len({line["conversation_id"] for line in lines if "conversation_id" in line})
    out.print(f"wrote {len(lines)} turns ({conversations} conversations) of {source} to "
              f"{out_file}", markup=False, highlight=False)  # fmt: skip
