"""The ``review_judgements`` rows (:class:`~chainrun.log.rows.ReviewJudgementRow`): a
person's judgements of two runs' answers, one row per (runs, request, reviewer) kept
(a judgement given again replaces the earlier one)."""

from __future__ import annotations

from chainrun.log.backend import LogDb
from chainrun.log.rows import ReviewJudgementRow

__all__ = ["ReviewJudgements"]


class ReviewJudgements:
    """Review judgements in the log (a base of :class:`chainrun.log.store.Store`)."""

    log: LogDb

    def save_review_judgement(self, row: ReviewJudgementRow) -> int:
        """Keep ``row``, replacing the same reviewer's earlier judgement of the same
        request for the same runs (one transaction); returns its id."""
        with self.log.transaction():
            self.log.execute(
                "delete from review_judgements where run_a = ? and run_b = ? and "
                "request_id = ? and reviewer = ?",
                [row.run_a, row.run_b, row.request_id, row.reviewer],
            )
            return self.log.insert_returning_id("review_judgements", row.to_db())

    def review_judgements(self, run_a: int, run_b: int) -> list[ReviewJudgementRow]:
        """Every reviewer's judgements of runs ``run_a`` against ``run_b``, in log order."""
        rows = self.log.query(
            "select * from review_judgements where run_a = ? and run_b = ? order by id",
            [run_a, run_b],
        )
        return [ReviewJudgementRow.from_db(r) for r in rows]
