"""``chainrun hedge-stats``: whether hedging pays, per step of a run."""

from __future__ import annotations

from typing import Annotated

import typer

from chainrun.cli import DEFAULT_DB_PATH, DbOpt, JsonOpt, app, handle_errors, out, print_json
from chainrun.cli.tables import hedge_table
from chainrun.errors import UserInputError
from chainrun.report import hedge_stats
from chainrun.store import Store


@app.command("hedge-stats")
@handle_errors
def hedge_stats_command(
    run_id: Annotated[int | None, typer.Argument(help="Run id (default: the latest run).")] = None,
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
) -> None:
    """Fire rate, win rate, time saved per win and extra calls per turn, per step."""
    with Store.open(db, create=False) as store:
        rid = run_id if run_id is not None else store.latest_run_id()
        if rid is None:
            raise UserInputError(f"{db}: no runs in this log yet")
        stats = hedge_stats(store, rid)
    if as_json:
        print_json(stats)
    else:
        out.print(hedge_table(stats))
