"""Keyword rules first, nearest examples when the rules are not sure.

A message on which exactly one label's rules fire takes that label (a rule such as
"refund" or "FS-12345" is precise); otherwise (no rule, or rules of several labels) the
nearest examples decide. Neither step calls a model.
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
        hits = self.rules.hits(message)
        if len(hits) == 1:
            ((label, n),) = hits.items()
            return Classification(label, self.method, float(n), {"decided_by": "keywords",
                                                                  "hits": hits})  # fmt: skip
        found = await self.examples.classify(message)
        return Classification(found.label, self.method, found.score,
                              {"decided_by": "examples", "hits": hits, **found.detail})  # fmt: skip
