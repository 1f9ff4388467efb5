"""Classifying the shopper's message into a fixed label set, several ways.

``keywords`` (:class:`KeywordRules`: regular expressions per label), ``examples``
(:class:`NearestExamples`: k nearest labelled examples on MiniLM embeddings),
``combined`` (:class:`RulesThenExamples`), and the model itself: an ``llm`` step with
``labels`` whose answer is constrained to the label set by :func:`label_schema`. The
``classify`` step kind (:mod:`chainrun.steps.classify`) runs the first three, and in a
conversation a follow-up keeps the label of the turn it follows (:class:`FollowUps`);
``benchmarks/classify_accuracy.py`` measures all four on the labelled eval set.

:mod:`chainrun.classify.replies` reads the shopper's reply to a question chainrun asked
(yes, no, unclear or a new request: the answer to a pending action's question).
"""

from chainrun.classify.base import (
    DEFAULT_LABELS,
    FALLBACK_LABEL,
    Classification,
    Classifier,
    label_schema,
)
from chainrun.classify.combined import RulesThenExamples
from chainrun.classify.conversation import FollowUps
from chainrun.classify.examples import (
    DEFAULT_EXAMPLES,
    DEFAULT_K,
    OUT_OF_SCOPE_BELOW,
    NearestExamples,
    read_examples,
)
from chainrun.classify.keywords import DEFAULT_RULES, KeywordRules

__all__ = [
    "DEFAULT_EXAMPLES",
    "DEFAULT_K",
    "DEFAULT_LABELS",
    "DEFAULT_RULES",
    "FALLBACK_LABEL",
    "OUT_OF_SCOPE_BELOW",
    "Classification",
    "Classifier",
    "FollowUps",
    "KeywordRules",
    "NearestExamples",
    "RulesThenExamples",
    "label_schema",
    "read_examples",
]
