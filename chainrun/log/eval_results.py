"""The ``eval_results`` rows of eval runs (:class:`~chainrun.log.rows.EvalResultRow`):
written whole per run, read for reports."""

from __future__ import annotations

from collections.abc import Sequence

from chainrun.log.backend import LogDb
from chainrun.log.rows import EvalResultRow

__all__ = ["EvalResults"]


class EvalResults:
    """An eval run's results in the log (a base of :class:`chainrun.log.store.Store`)."""

    log: LogDb

    def replace_eval_results(self, run_id: int, rows: Sequence[EvalResultRow]) -> None:
        """Replace run ``run_id``'s ``eval_results`` rows with ``rows`` (one transaction;
        each row's ``run_id`` is set to ``run_id``)."""
        with self.log.transaction():
            self.log.execute("delete from eval_results where run_id = ?", [run_id])
            if rows:
                self.log.table("eval_results").insert_all(
                    [{**r.to_db(), "run_id": run_id} for r in rows]
                )

    def eval_results(self, run_ids: Sequence[int]) -> list[EvalResultRow]:
        """The ``eval_results`` rows of some runs, in log order."""
        ids = list(run_ids)
        if not ids:
            return []
        marks = ",".join("?" for _ in ids)
        rows = self.log.query(
            f"select * from eval_results where run_id in ({marks}) order by id", ids
        )
        return [EvalResultRow.from_db(r) for r in rows]
