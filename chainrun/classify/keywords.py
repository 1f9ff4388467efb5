"""Keyword rules: regular expressions per label, no model, microseconds per message.

Each label has a few patterns (:data:`DEFAULT_RULES`, written for a fashion shop's
messages in English); a message gets the label whose patterns match most often, ties
broken by the order of :data:`DEFAULT_RULES` (returns and orders before sizing, sizing
before styling and product search: "can I exchange it for a smaller size" is a return).
No match gives :data:`~chainrun.classify.base.FALLBACK_LABEL` with confidence 0; a
label's confidence is its share of the rules that matched. A shop adds or replaces
rules by label (``rules`` of the ``classify`` step).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from chainrun.classify.base import FALLBACK_LABEL, Classification, shares

#: label → patterns (case-insensitive), in tie-break order. "care" questions (washing,
#: stains) are matched to ``other`` before sizing, so "shrink in the wash" is not sizing;
#: so are small talk, payment, discount codes and contact questions (the policy's
#: general section answers them). Returns take "send it back", "swap ... for a size up".
DEFAULT_RULES: dict[str, list[str]] = {
    "returns": [
        r"\breturn(s|ed|ing)?\b",
        r"\brefund",
        r"\bexchange",
        r"\bswap\b",
        r"\bmoney back\b",
        r"\b(broken|broke|damaged|faulty|ripped|torn)\b",
        r"\bhole\b",
        r"\breplacement\b",
        r"\b(send|sending|sent|post|posting|give|bring|take)( \w+){0,3} back\b",
        r"\b(change|trade|trade in) (it|them|this|these|the \w+)( \w+)? for\b",
        r"\bfor (a|one) size (up|down|bigger|smaller)\b",
        r"\bchanged my mind\b",
    ],
    "order_status": [
        r"\b(my|the|an?) (order|parcel|package)\b",
        r"\border (number|no)\b",
        r"\bFS-\d+",
        r"\btrack(ing)?\b",
        r"\bdeliver(y|ed|ies)?\b",
        r"\bship(ped|ping|s)?\b",
        r"\bdispatch",
        r"\bcourier\b",
        r"\barrive\b",
        r"\bcancel\b",
        r"\bexpress\b",
        r"\bpick up my\b",
        r"\bcharged\b",
    ],
    "other": [
        r"\bwash",
        r"\bclean\b",
        r"\biron(ing)?\b",
        r"\bstain",
        r"\btumble dry\b",
        r"\bdry clean",
        r"\bwashing machine\b",
        r"\bignore (all|the|your|previous)\b",
        r"\b(system prompt|instructions)\b",
        r"\bweather\b",
        r"\brecipe\b",
        r"\bvote\b",
        r"^\W*(hi|hello|hey|good (morning|afternoon|evening))\b",
        r"\b(thanks|thank you|cheers|that's all|that is all|bye)\b",
        r"\b(paypal|apple pay|google pay|klarna|instal?ments?|payment methods?)\b",
        r"\bpay (by|with|in)\b",
        r"\b(promo|discount|voucher|coupon)( codes?)?\b",
        r"\bgift cards?\b",
        r"\b(contact|customer service|phone number|opening hours|e-?mail address)\b",
    ],
    "sizing": [
        r"\bsize (up|down)\b",
        r"\b(what|which) size\b",
        r"\btrue to size\b",
        r"\b(run|runs|come|comes|came) (up )?(small|large|big|narrow)\b",
        r"\bsizes\b",
        r"\bsize chart\b",
        r"\bfit(s|ting)?\b",
        r"\b(petite|tall) sizes?\b",
        r"\bwaist\b",
        r"\bmeasurements?\b",
        r"\bshrink\b",
        r"\bbetween (a |an )?\w+ and (a |an )?\w+\b",
        r"\btaille\b",
        r"\bgröße\b",
        r"\b(uk|eu|us) \d{1,2}\b",
    ],
    "styling": [
        r"\bwear\b",
        r"\boutfit",
        r"\bstyl(e|ing)\b",
        r"\bgo(es)? with\b",
        r"\bmatch",
        r"\bpack(ing)?\b",
        r"\bdress for\b",
        r"\bsuit me\b",
        r"\blook\b",
        r"\bcapsule\b",
        r"\bwardrobe\b",
    ],
    "product_search": [
        r"\bdo you (have|sell|stock|do)\b",
        r"\blooking for\b",
        r"\bshow me\b",
        r"\bhave you got\b",
        r"\bcheapest\b",
        r"\bi (need|want) (a|an|some)\b",
        r"\b(under|below|less than) \d+",
        r"\bin stock\b",
        r"\bgift\b",
        r"\bpresent\b",
        r"\bbudget\b",
        r"\bany\b .+\?",
        r"\bwhat .+ do you have\b",
    ],
}


class KeywordRules:
    """The keyword-rules classifier (see the module docstring).

    Args:
        labels: the label set; rules of other labels are ignored.
        rules: label → patterns, replacing :data:`DEFAULT_RULES` for the labels given
            (None: the defaults).

    Raises:
        ValueError: a pattern is not a valid regular expression (named).
    """

    method = "keywords"

    def __init__(
        self, labels: Sequence[str], rules: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        self._labels = list(labels)
        merged = {**DEFAULT_RULES, **{k: list(v) for k, v in (rules or {}).items()}}
        order = [lab for lab in merged if lab in self._labels]
        self._rules: list[tuple[str, list[re.Pattern[str]]]] = []
        for label in order:
            compiled = []
            for pattern in merged[label]:
                try:
                    compiled.append(re.compile(pattern, re.I))
                except re.error as e:
                    raise ValueError(f"rules.{label}: bad pattern {pattern!r} ({e})") from None
            self._rules.append((label, compiled))

    @property
    def labels(self) -> Sequence[str]:
        return self._labels

    def hits(self, message: str) -> dict[str, int]:
        """Matches per label (labels with none left out), in tie-break order."""
        out: dict[str, int] = {}
        for label, patterns in self._rules:
            n = sum(1 for p in patterns if p.search(message))
            if n:
                out[label] = n
        return out

    def classify_now(self, message: str) -> Classification:
        """The label of ``message`` (no I/O; see :meth:`classify`)."""
        hits = self.hits(message)
        if not hits:
            fallback = FALLBACK_LABEL if FALLBACK_LABEL in self._labels else self._labels[-1]
            return Classification(fallback, self.method, 0.0, {"hits": {}}, {fallback: 0.0})
        best = max(hits.values())
        label = next(lab for lab, n in hits.items() if n == best)  # first in tie-break order
        conf = shares({lab: float(n) for lab, n in hits.items()})
        return Classification(label, self.method, float(best), {"hits": hits}, conf)

    async def classify(self, message: str) -> Classification:
        return self.classify_now(message)
