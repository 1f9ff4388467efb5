"""Keyword rules first, nearest examples when the rules are not sure.

A message on which exactly one label's rules fire takes that label (a rule such as
"refund" or "FS-12345" is precise); otherwise (no rule, or rules of several labels) the
nearest examples decide. Neither step calls a model.

**Out of scope.** A rule's word is precise inside the shop's domain, not outside it:
"return" fires on "how long does the irs take to issue a tax return", "wear" on "what
should i wear to hike". So a rule's shop label is checked against the examples: when
the message resembles no example of a shop label (the examples' ``out_of_scope``,
:data:`~chainrun.classify.examples.OUT_OF_SCOPE_BELOW`), the label is
:data:`~chainrun.classify.base.FALLBACK_LABEL`, unsure, with the rule's label as the
runner-up. That check costs the message a MiniLM forward pass (about 5-25 ms on 2 cores;
the vector search embeds the same message right after and reuses it); with
``out_of_scope_below = 0`` a rule's decision costs microseconds again.

Confidence per label: a rules' decision is sure (confidence 1 for its label); otherwise
the examples' vote shares (:class:`NearestExamples`). Cross-validated, giving a rules'
decision half its weight and the examples the rest did not route measurably better
(benchmarks/README.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from chainrun.classify.base import FALLBACK_LABEL, Classification
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
        if ruled is not None and not self._checks(ruled):
            return ruled
        return self.decide(message, await self.examples.classify(message))

    def _checks(self, ruled: Classification) -> bool:
        """Whether a rules' decision is checked against the examples (out of scope)."""
        return ruled.label != FALLBACK_LABEL and self.examples.out_of_scope_below > 0

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
        the rules' label when exactly one label's rules fire and the examples do not find
        the message out of scope, else the examples'."""
        ruled = self.by_rules(message)
        hits = self.rules.hits(message)
        if ruled is not None:
            if not (self._checks(ruled) and found.detail.get("out_of_scope")):
                return ruled
            detail = {"decided_by": "out_of_scope", "hits": hits,
                      "shop_similarity": found.detail.get("shop_similarity")}
            return Classification(FALLBACK_LABEL, self.method, found.score, detail,
                                  {FALLBACK_LABEL: 0.5, ruled.label: 0.5})  # fmt: skip
        return Classification(found.label, self.method, found.score,
                              {"decided_by": "examples", "hits": hits, **found.detail},
                              found.confidences)  # fmt: skip
