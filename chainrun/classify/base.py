"""What every classifier gives back, and the label set's JSON Schema for a model.

A classifier maps the shopper's message to one of a fixed set of labels (the default
set: :data:`DEFAULT_LABELS`). Every method here answers the same
:class:`Classification`, so that a benchmark (``benchmarks/classify_accuracy.py``) and
the ``classify`` step treat them alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

#: the default label set: a fashion shop's message categories (what the default chain's
#: classify step gives and routes on)
DEFAULT_LABELS = ("sizing", "product_search", "order_status", "returns", "styling", "other")
#: the label a classifier gives when nothing points to another one
FALLBACK_LABEL = "other"
#: an unsure turn's route takes a runner-up label whose confidence is at least this
RUNNER_UP_MIN = 0.1
#: an unsure turn's route takes at most this many labels (the label and two runners-up)
MAX_ROUTE_LABELS = 3


@dataclass(frozen=True)
class Classification:
    """One message's label.

    Attributes:
        label: one of the classifier's labels.
        method: the method that decided (``keywords``, ``examples``, ...).
        score: the method's confidence on its own scale (keywords: rules matched;
            examples: cosine similarity of the nearest example, -1..1); None: none.
        detail: what the method saw (rule hits per label, nearest examples).
        confidences: label → the method's confidence in it, 0..1, summing to 1 over the
            labels given (highest first; labels left out: 0); empty: the method gives
            none. :attr:`confidence` is the label's.
    """

    label: str
    method: str
    score: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    confidences: dict[str, float] = field(default_factory=dict)

    @property
    def confidence(self) -> float | None:
        """The confidence in :attr:`label`, 0..1 (None: the method gives none)."""
        if not self.confidences:
            return None
        return self.confidences.get(self.label, 0.0)

    def route_labels(self, threshold: float) -> tuple[str, ...]:
        """The labels whose material a turn gets: ``(label,)`` when the confidence is at
        least ``threshold`` (or unknown); else the label and the runners-up with a
        confidence of at least :data:`RUNNER_UP_MIN`, highest first, at most
        :data:`MAX_ROUTE_LABELS` in all."""
        conf = self.confidence
        if conf is None or conf >= threshold:
            return (self.label,)
        others = [lab for lab, v in self.confidences.items()
                  if v >= RUNNER_UP_MIN and lab != self.label]  # fmt: skip
        return (self.label, *others[: MAX_ROUTE_LABELS - 1])


def shares(weights: dict[str, float]) -> dict[str, float]:
    """``weights`` (label → a non-negative weight) as shares summing to 1, highest first
    (rounded to 4 places; all-zero or empty: ``{}``)."""
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return {}
    ordered = sorted(((lab, w) for lab, w in weights.items() if w > 0), key=lambda x: -x[1])
    return {lab: round(w / total, 4) for lab, w in ordered}


class Classifier(Protocol):
    """``await classify(message)`` → :class:`Classification`; ``labels`` it may give."""

    method: str

    @property
    def labels(self) -> Sequence[str]: ...

    async def classify(self, message: str) -> Classification: ...


def label_schema(labels: Sequence[str]) -> dict[str, Any]:
    """A JSON Schema (Draft 2020-12) whose only valid answers are ``{"label": L}`` for
    L in ``labels``: sent as ``response_format`` (json_schema), it constrains a model to
    the label set (llama.cpp's server turns it into a grammar; OpenAI's structured
    outputs take an ``enum`` of strings the same way)."""
    return {
        "type": "object",
        "properties": {"label": {"type": "string", "enum": list(labels)}},
        "required": ["label"],
        "additionalProperties": False,
    }
