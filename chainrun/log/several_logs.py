"""Many backend processes, many logs: read several run logs as one.

Each ``chainrun serve`` process keeps its own SQLite log (and its own hedge windows).
:func:`merge_logs` copies the runs, turns, steps and calls of several logs into one
in-memory log, renumbering ids so they do not collide and tagging every run with the
process it came from (``runs.meta``: ``process``, ``source_db``, ``source_run_id``), so
that a fleet's live window can be compared against a replay without a central database.
A run of one process is named ``RUN@PROCESS`` (e.g. ``3@shop-a``), the process being the
log file's name without its suffix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chainrun.errors import UserInputError
from chainrun.log.store import Store

#: tables copied, parents first; each child's ``run_id``/``turn_id`` follow the renumbering
_TABLES = ("runs", "turns", "steps", "calls")


@dataclass
class MergedLogs:
    """The merged log and how its run ids map back to ``(process, source run id)``."""

    store: Store
    processes: list[str]
    runs: dict[tuple[str, int], int] = field(default_factory=dict)

    def run_id(self, selector: str) -> str:
        """``RUN@PROCESS`` → the merged run id (as text); any other selector unchanged.

        Raises:
            UserInputError: no such process, or no such run in that process's log; or a
                bare run id while several logs are merged (it would name a renumbered
                run of whichever log it fell in).
        """
        run, at, process = selector.strip().partition("@")
        if not at:
            if run.isdigit() and len(self.processes) > 1:
                raise UserInputError(
                    f"{selector!r}: with several --db, name a run as RUN@PROCESS "
                    f"(e.g. {run}@{self.processes[0]}); processes: {self.processes}"
                )
            return selector
        if process not in self.processes:
            raise UserInputError(
                f"{selector!r}: no log named {process!r}; expected one of {self.processes}"
            )
        if not run.isdigit() or (process, int(run)) not in self.runs:
            raise UserInputError(f"{selector!r}: no run {run} in the log of {process!r}")
        return str(self.runs[(process, int(run))])


def process_name(path: Path) -> str:
    """A log's process tag: its file name without the suffix (``logs/shop-a.db`` → ``shop-a``)."""
    return path.stem


def process_names(paths: Sequence[str | Path]) -> list[str]:
    """The process tags of ``paths`` (:func:`process_name`), in order.

    Raises:
        UserInputError: two logs share a process name (``RUN@PROCESS`` would be ambiguous).
    """
    tags = [process_name(Path(p)) for p in paths]
    dupes = sorted({t for t in tags if tags.count(t) > 1})
    if dupes:
        raise UserInputError(f"--db: two logs named {dupes[0]!r}; process names must differ")
    return tags


def merge_logs(paths: Sequence[str | Path]) -> MergedLogs:
    """Copy the logs at ``paths`` into one in-memory log (see the module docstring).

    Raises:
        UserInputError: a path is missing or not a chainrun log, or two logs share a
            process name (their file names without suffix).
    """
    tags = process_names(paths)
    merged = MergedLogs(Store.open(":memory:"), tags)
    db = merged.store.db
    columns = {t: set(db.table(t).columns_dict) for t in _TABLES}
    for path, tag in zip(paths, tags, strict=True):
        with Store.open(path, create=False) as src:  # checks it is a chainrun log
            offsets = {t: int(db.execute(f"select coalesce(max(id), 0) from {t}").fetchone()[0])
                       for t in _TABLES}  # fmt: skip
            for table in _TABLES:
                rows = []
                for row in src.db.table(table).rows_where(order_by="id"):
                    row = {k: v for k, v in row.items() if k in columns[table]}
                    source_id = row["id"]
                    row["id"] += offsets[table]
                    if "run_id" in row:
                        row["run_id"] += offsets["runs"]
                    if "turn_id" in row:
                        row["turn_id"] += offsets["turns"]
                    if table == "runs":
                        meta = json.loads(row.get("meta") or "{}")
                        meta.update(process=tag, source_db=str(path), source_run_id=source_id)
                        row["meta"] = json.dumps(meta)
                        merged.runs[(tag, source_id)] = row["id"]
                    rows.append(row)
                with db.conn:
                    db.table(table).insert_all(rows)
    return merged
