"""Grounding read back from a run's log: which answers stated an ungrounded fact.

Two readings per completed turn with an answer:

- **shown**: the answer as the shopper received it (the turn's ``output``) checked
  again, by :func:`chainrun.checks.grounding.check_text`, against the turn's logged
  sources: the products its search handed on (the step row's ``updates["products"]``,
  else the retrieve detail's ``results``), the turn's tool results and the shop's policy
  text. Works on any run, the check on or off.
- **model**: the answer step's own grounding record (``detail["grounding"]``), what
  the model wrote before the check acted; None when the check did not run.

A *product fact* is a ``product_id``, ``title``, ``price`` or ``stock`` claim; policy
figures are counted apart. Shares come with n and a 95% Wilson interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chainrun.checks.grounding import Claim, GroundingSources, ProductRow, check_text

__all__ = [
    "PRODUCT_KINDS", "TurnGrounding", "grounding_rate", "groundings_of", "turn_groundings",
]

#: the claim kinds that state a product fact
PRODUCT_KINDS = frozenset({"product_id", "title", "price", "stock"})


@dataclass(frozen=True)
class TurnGrounding:
    """One answered turn's grounding, as read from the log.

    Attributes:
        turn_id: the turn.
        answer: what the shopper received.
        shown: the claims of ``answer`` against the turn's logged sources.
        model: the answer step's grounding record (None: the check did not run).
    """

    turn_id: int | None
    answer: str
    shown: tuple[Claim, ...]
    model: Mapping[str, Any] | None

    @property
    def shown_ungrounded_product(self) -> list[Claim]:
        """The ungrounded product facts the shopper received."""
        return [c for c in self.shown if not c.grounded and c.kind in PRODUCT_KINDS]

    @property
    def model_ungrounded_product(self) -> list[Mapping[str, Any]] | None:
        """The ungrounded product facts the model wrote (None: no record)."""
        if self.model is None:
            return None
        return [u for u in self.model.get("ungrounded") or [] if u.get("kind") in PRODUCT_KINDS]


def _rows(items: list[Any]) -> list[ProductRow]:
    out = []
    for p in items:
        if isinstance(p, dict):
            try:
                out.append(ProductRow.of(p))
            except (KeyError, AttributeError, TypeError, ValueError):
                continue  # a logged row without id, title or price: not a source
    return out


def _products(steps: Sequence[Any]) -> list[ProductRow]:
    for s in steps:
        shown = (getattr(s, "updates", None) or {}).get("products")
        if isinstance(shown, list):
            return _rows(shown)
    for s in steps:
        results = (s.detail or {}).get("results") if s.kind == "retrieve" else None
        if isinstance(results, list):
            return _rows(results)
    return []


def turn_groundings(
    store: Any, run_id: int, *, policy: str | None = None,
    catalogue: Mapping[str, ProductRow] | None = None,
) -> list[TurnGrounding]:
    """Every answered turn of ``run_id`` in ``store`` (a :class:`~chainrun.log.store.Store`),
    in turn order (see :func:`groundings_of`)."""
    return groundings_of(store.turns(run_id), store.steps(run_id), policy=policy,
                         catalogue=catalogue)  # fmt: skip


def groundings_of(
    turns: Sequence[Any], steps: Sequence[Any], *, policy: str | None = None,
    catalogue: Mapping[str, ProductRow] | None = None,
) -> list[TurnGrounding]:
    """The answered turns among ``turns`` (turn rows; ``steps``: their step rows), in
    order. ``policy``: the shop's policy text (None: the sample shop's); ``catalogue``:
    every product, to recognise other products' titles (None: only the turn's)."""
    if policy is None:
        from chainrun.shop_policy import load_policy

        policy = "\n".join(s.text for s in load_policy().values())
    steps_by_turn: dict[int | None, list[Any]] = {}
    for s in steps:
        steps_by_turn.setdefault(s.turn_id, []).append(s)
    out = []
    for turn in turns:
        if not turn.output or turn.status not in ("ok", "cut", "replaced"):
            continue
        mine = steps_by_turn.get(turn.id, [])
        results = [str(v) for s in mine for k, v in (getattr(s, "updates", None) or {}).items()
                   if k == "tool_results" or k.endswith("_results")]  # fmt: skip
        turn_policy = next((str(u["policy"]) for s in mine
                            if isinstance(u := getattr(s, "updates", None) or {}, dict)
                            and isinstance(u.get("policy"), str)), "")  # fmt: skip
        src = GroundingSources(_products(mine), policy=f"{policy}\n{turn_policy}",
                               tool_results=results, catalogue=catalogue)  # fmt: skip
        model = next((g for s in mine if isinstance(g := (s.detail or {}).get("grounding"),
                                                    dict)), None)  # fmt: skip
        out.append(TurnGrounding(turn.id, turn.output, tuple(check_text(src, turn.output)),
                                 model))  # fmt: skip
    return out


def grounding_rate(turns: Sequence[TurnGrounding], *, shown: bool = True) -> dict[str, Any]:
    """The share of answers with an ungrounded product fact: in what the shopper received
    (``shown``) or in what the model wrote (turns without a record left out), with n and
    a 95% Wilson interval (None at n = 0)."""
    from chainrun.statistics.intervals import wilson_interval

    if shown:
        flags = [bool(t.shown_ungrounded_product) for t in turns]
    else:
        flags = [bool(m) for t in turns if (m := t.model_ungrounded_product) is not None]
    k, n = sum(flags), len(flags)
    ci = wilson_interval(k, n) if n else None
    return {"ungrounded": k, "n": n, "rate": round(k / n, 4) if n else None,
            "ci95": [round(ci[0], 4), round(ci[1], 4)] if ci else None}  # fmt: skip
