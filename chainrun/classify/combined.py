"""Keyword rules first, nearest examples when the rules are not sure.

A message on which exactly one label's rules fire takes that label (a rule such as
"refund" or "FS-12345" is precise); otherwise (no rule, or rules of several labels) the
nearest examples decide. Neither step calls a model.

Confidence per label: a rules' decision is sure (confidence 1 for its label: a precise
rule, and no embedding, so it costs microseconds); otherwise the examples' vote shares
(:class:`NearestExamples`). Cross-validated, giving a rules' decision half its weight and
the examples the rest did not route measurably better (benchmarks/README.md) and cost
every message a MiniLM forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from chainrun.classify.base import Classification
from chainrun.classify.examples import NearestExamples
from chainrun.classify.keywords import KeywordRules


class RulesThenExamples:
    """The combined classifier (see the module docstring)."""

    method = "combined"

    def __init__(self, rules: KeywordRules, examples: NearestExamples) -> None:
        self.rules = rules
        self.examples = examples

    @property
    def labels(self) -> Sequence[str]:
        return self.rules.labels

    async def warm(self) -> None:
        await self.examples.warm()

    async def classify(self, message: str) -> Classification:
        ruled = self.by_rules(message)
        if ruled is not None:
            return ruled
        return self.decide(message, await self.examples.classify(message))

    def by_rules(self, message: str) -> Classification | None:
        """The rules' decision (exactly one label's rules fire; sure), or None."""
        hits = self.rules.hits(message)
        if len(hits) != 1:
            return None
        ((label, n),) = hits.items()
        return Classification(label, self.method, float(n),
                              {"decided_by": "keywords", "hits": hits}, {label: 1.0})  # fmt: skip

    def decide(self, message: str, found: Classification) -> Classification:
        """The label of ``message`` given the examples' classification of it (``found``):
        the rules' label when exactly one label's rules fire, else the examples'."""
        ruled = self.by_rules(message)
        if ruled is not None:
            return ruled
        hits = self.rules.hits(message)
        return Classification(found.label, self.method, found.score,
                              {"decided_by": "examples", "hits": hits, **found.detail},
                              found.confidences)  # fmt: skip
