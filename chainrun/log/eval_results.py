"""The ``eval_results`` rows of eval runs: written whole per run, read for reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chainrun.log.backend import LogDb

__all__ = ["EvalResults"]


class EvalResults:
    """An eval run's results in the log (a base of :class:`chainrun.log.store.Store`)."""

    log: LogDb

    def replace_eval_results(self, run_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """Replace run ``run_id``'s ``eval_results`` rows with ``rows`` (one transaction)."""
        with self.log.transaction():
            self.log.execute("delete from eval_results where run_id = ?", [run_id])
            if rows:
                self.log.table("eval_results").insert_all(rows)

    def eval_results(self, run_ids: Sequence[int]) -> list[dict[str, Any]]:
        """The ``eval_results`` rows of some runs, in log order."""
        ids = list(run_ids)
        if not ids:
            return []
        marks = ",".join("?" for _ in ids)
        return self.log.query(
            f"select * from eval_results where run_id in ({marks}) order by id", ids
        )
