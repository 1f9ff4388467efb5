"""Many backend processes, many logs: read several SQLite run logs as one.

When each ``chainrun serve`` process keeps its own SQLite log, :func:`merge_logs` copies
the runs (turns, steps, calls, eval results) of several logs into one in-memory log,
renumbering ids so they do not collide and tagging every run with the process it came
from (``runs.meta``: ``process``, ``source_db``, ``source_run_id``), so that a fleet's
live window can be compared against a replay without a central database. A run of one
process is named ``RUN@PROCESS`` (e.g. ``3@shop-a``), the process being the log file's
name without its suffix. ``compare --db a.db --db b.db`` reads logs this way; a fleet
that shares one PostgreSQL log needs none of it, and ``chainrun log copy`` moves such
SQLite logs into one (:mod:`chainrun.log.copy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from chainrun.errors import UserInputError
from chainrun.log.backend import is_postgres_url
from chainrun.log.copy import copy_runs
from chainrun.log.store import Store


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


def process_name(path: Path | str) -> str:
    """A log's process tag: its file name without the suffix (``logs/shop-a.db`` → ``shop-a``);
    for a PostgreSQL URL, its database name."""
    if is_postgres_url(str(path)):
        return urlsplit(str(path)).path.strip("/") or "postgres"
    return Path(path).stem


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
    """Copy the logs at ``paths`` into one in-memory log (see the module docstring), with
    :func:`chainrun.log.copy.copy_runs` (as ``chainrun log copy`` copies into a shared log).

    Raises:
        UserInputError: a path is missing or not a chainrun log, or two logs share a
            process name (their file names without suffix).
    """
    tags = process_names(paths)
    merged = MergedLogs(Store.open(":memory:"), tags)
    for path, tag in zip(paths, tags, strict=True):
        with Store.open(path, create=False) as src:  # checks it is a chainrun log
            done = copy_runs(src, merged.store, process=tag, source=str(path))
        for source_id, new_id in done.run_ids.items():
            merged.runs[(tag, source_id)] = new_id
    return merged
