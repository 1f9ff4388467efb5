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


@dataclass(frozen=True)
class Classification:
    """One message's label.

    Attributes:
        label: one of the classifier's labels.
        method: the method that decided (``keywords``, ``examples``, ...).
        score: the method's confidence on its own scale (keywords: rules matched;
            examples: cosine similarity of the nearest example, -1..1); None: none.
        detail: what the method saw (rule hits per label, nearest examples).
    """

    label: str
    method: str
    score: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


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
