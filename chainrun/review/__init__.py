"""Reviewing two runs' answers side by side: the shared requests (:mod:`.pairs`), the
keyboard-driven page that records a person's blind judgements in the log (:mod:`.app`,
``chainrun review A B``), and their paired result with intervals (:mod:`.summary`)."""

from chainrun.review.pairs import ReviewAnswer, ReviewPair, shared_pairs
from chainrun.review.summary import TAGS, review_summary

__all__ = ["TAGS", "ReviewAnswer", "ReviewPair", "review_summary", "shared_pairs"]
