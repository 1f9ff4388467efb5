"""Keyword rules first, nearest examples when the rules are not sure.

A message on which exactly one label's rules fire takes that label (a rule such as
"refund" or "FS-12345" is precise); otherwise (no rule, or rules of several labels) the
nearest examples decide. Neither step calls a model.

Confidence per label: the examples' vote shares (:class:`NearestExamples`), and when
the rules decided, :data:`RULE_WEIGHT` of it on the rules' label and the rest on the
vote shares (so a rule the nearest examples disagree with gives an unsure label whose
runner-up is the examples' label). The examples are consulted on every message for
this (one embedding, about 5-25 ms on 2 cores).
"""

from __future__ import annotations

from collections.abc import Sequence

from chainrun.classify.base import Classification, shares
from chainrun.classify.examples import NearestExamples
from chainrun.classify.keywords import KeywordRules

#: the confidence a rules' decision carries on its own (the rest is the examples' vote
#: shares): 0.5, so a rule's label stays first whatever the examples say, and a label
#: whose rules and examples agree is sure at any threshold up to 0.5 + half the share
RULE_WEIGHT = 0.5


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
        return self.decide(message, await self.examples.classify(message))

    def decide(self, message: str, found: Classification) -> Classification:
        """The label of ``message`` given the examples' classification of it (``found``):
        the rules' label when exactly one label's rules fire, else the examples'."""
        hits = self.rules.hits(message)
        if len(hits) == 1:
            ((label, n),) = hits.items()
            mixed = {lab: (1 - RULE_WEIGHT) * v for lab, v in found.confidences.items()}
            mixed[label] = mixed.get(label, 0.0) + RULE_WEIGHT
            return Classification(label, self.method, float(n),
                                  {"decided_by": "keywords", "hits": hits,
                                   "examples_label": found.label},
                                  shares(mixed))  # fmt: skip
        return Classification(found.label, self.method, found.score,
                              {"decided_by": "examples", "hits": hits, **found.detail},
                              found.confidences)  # fmt: skip
