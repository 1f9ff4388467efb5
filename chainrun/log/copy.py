"""Copy the runs of one log into another: ``chainrun log copy a.db postgresql://...``.

How a shop moves from one SQLite log per process to one shared log (PostgreSQL), and
how several SQLite logs are read as one (:mod:`chainrun.log.several_logs` copies them
into one in-memory log). Every run is copied with its turns, steps, calls and eval
results, under new ids in the target (turn ids from a block reserved there, as a
writing process reserves them, so a copy never collides with live writers), and tagged
in ``runs.meta`` with where it came from: ``process`` (the source's name), ``source_db``
and ``source_run_id``. A run already copied from the same source (same ``source_db``
and ``source_run_id``) is skipped, so running the same copy twice copies nothing new.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from chainrun.log.store import Store
from chainrun.log.turn_ids import reserve

__all__ = ["CopyResult", "copy_runs"]

#: child tables copied with each run: (table, its columns that point at a turn)
_CHILDREN = ("steps", "calls", "eval_results")


@dataclass
class CopyResult:
    """What a copy did: rows copied per table, runs skipped (copied before), and the
    target run id of each source run copied."""

    rows: dict[str, int] = field(default_factory=dict)
    skipped_runs: list[int] = field(default_factory=list)
    run_ids: dict[int, int] = field(default_factory=dict)


def _columns(store: Store, table: str) -> list[str]:
    return list(store.log.table(table).columns_dict)


def copy_runs(src: Store, dst: Store, *, process: str, source: str | None = None) -> CopyResult:
    """Copy every run of ``src`` into ``dst`` (one transaction on ``dst``: all or nothing).

    Args:
        process: the name the copied runs carry as ``runs.meta["process"]``.
        source: the source as recorded in ``runs.meta["source_db"]`` (default: the
            source store's name).

    Returns:
        rows copied per table, the source run ids skipped, source -> target run ids.
    """
    source = source if source is not None else src.name
    result = CopyResult(rows={t: 0 for t in ("runs", "turns", *_CHILDREN)})
    copied = set()
    for raw in dst.log.execute("select meta from runs").fetchall():
        try:
            meta = json.loads(raw[0]) if raw[0] else {}
        except ValueError:
            continue
        if isinstance(meta, dict) and meta.get("source_db") == source:
            copied.add(meta.get("source_run_id"))
    cols = {t: set(_columns(dst, t)) for t in ("runs", "turns", *_CHILDREN)}
    with dst.transaction():
        for run in src.log.query("select * from runs order by id"):
            source_id = int(run["id"])
            if source_id in copied:
                result.skipped_runs.append(source_id)
                continue
            row = {k: v for k, v in run.items() if k in cols["runs"] and k != "id"}
            meta = json.loads(row.get("meta") or "{}")
            meta.update(process=process, source_db=source, source_run_id=source_id)
            row["meta"] = json.dumps(meta)
            new_run = dst.log.insert_returning_id("runs", row)
            result.run_ids[source_id] = new_run
            result.rows["runs"] += 1
            turns = src.log.query("select * from turns where run_id = ? order by id",
                                  [source_id])  # fmt: skip
            turn_map: dict[int, int] = {}
            if turns:
                start, _ = reserve(dst.log, len(turns))
                for i, t in enumerate(turns):
                    turn_map[int(t["id"])] = start + i
                _insert(dst, "turns", [
                    {**{k: v for k, v in t.items() if k in cols["turns"]},
                     "id": turn_map[int(t["id"])], "run_id": new_run}
                    for t in turns
                ])  # fmt: skip
                result.rows["turns"] += len(turns)
            for table in _CHILDREN:
                if table not in cols or not cols[table]:
                    continue
                rows = src.log.query(f"select * from {table} where run_id = ? order by id",
                                     [source_id])  # fmt: skip
                out = []
                for r in rows:
                    new = {k: v for k, v in r.items() if k in cols[table] and k != "id"}
                    new["run_id"] = new_run
                    if r.get("turn_id") is not None:
                        new["turn_id"] = turn_map.get(int(r["turn_id"]))
                    out.append(new)
                _insert(dst, table, out)
                result.rows[table] += len(out)
    return result


def _insert(dst: Store, table: str, rows: list[dict[str, Any]]) -> None:
    if rows:
        dst.log.table(table).insert_all(rows)
