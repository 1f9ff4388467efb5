"""Grounding read back from a run's log: which answers stated an ungrounded fact.

Two readings per completed turn with an answer:

- **shown**: the answer as the shopper received it (the turn's ``output``) checked
  again, by :func:`chainrun.checks.grounding.check_text`, against the turn's logged
  sources: the products its search handed on (the step row's ``updates["products"]``,
  else the retrieve detail's ``results``), the turn's tool results and the shop's policy
  text. Works on any run, the check on or off.
- **model**: the answer step's own grounding record (``detail["grounding"]``), what
  the model wrote before the check acted; None when the check did not run.

Every claim kind counts (a product's id, title, price, stock or colour; a fee, a
discount, a policy figure or a delivery country). A claim is judged true, judged false,
or **not judged** (the sources could not say); the rate counts the answers with a
claim judged false, and beside it how many claims were judged and how many could not
be, and how many answers held a judged claim at all: "0 ungrounded" over answers none
of whose claims could be judged says nothing, and the counts show it. Shares come with
n and a 95% Wilson interval.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from chainrun.checks.grounding import Claim, GroundingSources, ProductRow, check_text
from chainrun.errors import ChainrunError
from chainrun.money import DEFAULT_LOCALE

__all__ = [
    "PRODUCT_KINDS", "ShopSettings", "TurnGrounding", "grounding_rate", "groundings_of",
    "rate_text", "shop_settings", "turn_groundings",
]

#: the claim kinds that state a product fact (the others state the policy's)
PRODUCT_KINDS = frozenset({"product_id", "title", "price", "stock", "colour"})


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
    def shown_ungrounded(self) -> list[Claim]:
        """The facts judged false that the shopper received (any kind)."""
        return [c for c in self.shown if not c.grounded and c.judged]

    @property
    def shown_ungrounded_product(self) -> list[Claim]:
        """The product facts judged false that the shopper received."""
        return [c for c in self.shown_ungrounded if c.kind in PRODUCT_KINDS]

    @property
    def shown_judged(self) -> tuple[int, int]:
        """(claims judged, claims that could not be) in what the shopper received."""
        judged = sum(1 for c in self.shown if c.judged)
        return judged, len(self.shown) - judged

    @property
    def model_ungrounded(self) -> list[Mapping[str, Any]] | None:
        """The facts judged false the model wrote (None: no record)."""
        if self.model is None:
            return None
        return [u for u in self.model.get("ungrounded") or [] if u.get("judged", True)]

    @property
    def model_ungrounded_product(self) -> list[Mapping[str, Any]] | None:
        """The product facts judged false the model wrote (None: no record)."""
        found = self.model_ungrounded
        return None if found is None else [u for u in found if u.get("kind") in PRODUCT_KINDS]

    @property
    def model_judged(self) -> tuple[int, int] | None:
        """(claims judged, claims that could not be) of the model's answer, from the
        grounding record (a record from before these counts: every claim judged)."""
        if self.model is None:
            return None
        claims = int(self.model.get("claims") or 0)
        unjudged = self.model.get("unjudged")
        if unjudged is None:
            unjudged = sum(1 for u in self.model.get("ungrounded") or []
                           if u.get("judged") is False)  # fmt: skip
        return claims - int(unjudged), int(unjudged)


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
    in turn order (see :func:`groundings_of`; the run's config gives the shop's
    currency, locale and policy)."""
    return groundings_of(store.turns(run_id), store.steps(run_id), policy=policy,
                         catalogue=catalogue,
                         configs={run_id: store.get_run(run_id).config})  # fmt: skip


@dataclass(frozen=True)
class ShopSettings:
    """What a run's grounding check judged with: the shop's currency, locale and policy
    text (from the config's answer step ``grounding`` table)."""

    currency: str = "EUR"
    locale: str = DEFAULT_LOCALE
    policy: str = ""


@lru_cache(maxsize=16)
def _policy_text(path: str | None) -> str:
    from chainrun.shop_policy import load_policy

    return "\n".join(s.text for s in load_policy(path).values())


def shop_settings(config: Mapping[str, Any] | str | None) -> ShopSettings:
    """The grounding settings of a run's config snapshot (the parsed config or its JSON;
    None or no grounding table: the sample shop's, EUR in ``en_IE``). A policy file that
    cannot be read any more gives the sample shop's policy."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            config = None
    steps = (config or {}).get("steps") if isinstance(config, Mapping) else None
    found: Mapping[str, Any] = {}
    for step in (steps or {}).values():
        g = step.get("grounding") if isinstance(step, Mapping) else None
        if isinstance(g, Mapping) and g.get("enabled", True):
            found = g
            break
    path = found.get("policy_file")
    try:
        policy = _policy_text(str(path) if path else None)
    except ChainrunError:
        policy = _policy_text(None)
    return ShopSettings(str(found.get("currency") or "EUR"),
                        str(found.get("locale") or DEFAULT_LOCALE), policy)  # fmt: skip


def groundings_of(
    turns: Sequence[Any], steps: Sequence[Any], *, policy: str | None = None,
    catalogue: Mapping[str, ProductRow] | None = None,
    configs: Mapping[int, Mapping[str, Any] | str | None] | None = None,
) -> list[TurnGrounding]:
    """The answered turns among ``turns`` (turn rows; ``steps``: their step rows), in
    order. ``configs``: each run's config snapshot by run id (the currency, locale and
    policy its grounding check judged with: :func:`shop_settings`; a run not in it: the
    sample shop's); ``policy``: the shop's policy text, over the configs'; ``catalogue``:
    every product (None: only the turn's are known, and a fact about another is counted
    as not judged)."""
    settings = {rid: shop_settings(c) for rid, c in (configs or {}).items()}
    default = shop_settings(None)
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
        shop = settings.get(getattr(turn, "run_id", None) or -1, default)
        src = GroundingSources(_products(mine),
                               policy=f"{shop.policy if policy is None else policy}\n"
                                      f"{turn_policy}",
                               tool_results=results, catalogue=catalogue,
                               currency=shop.currency, locale=shop.locale)  # fmt: skip
        model = next((g for s in mine if isinstance(g := (s.detail or {}).get("grounding"),
                                                    dict)), None)  # fmt: skip
        out.append(TurnGrounding(turn.id, turn.output, tuple(check_text(src, turn.output)),
                                 model))  # fmt: skip
    return out


def grounding_rate(turns: Sequence[TurnGrounding], *, shown: bool = True) -> dict[str, Any]:
    """The share of answers with a fact judged false: in what the shopper received
    (``shown``) or in what the model wrote (turns without a record left out), with n and
    a 95% Wilson interval (None at n = 0), and the claims behind it.

    Returns:
        ``{"ungrounded", "n", "rate", "ci95", "claims_judged", "claims_unjudged",
        "answers_judged"}``: answers with a fact judged false, answers, their share and
        interval; claims judged and claims that could not be judged over those answers;
        answers with at least one judged claim.
    """
    from chainrun.statistics.intervals import wilson_interval

    if shown:
        rows = [(bool(t.shown_ungrounded), t.shown_judged) for t in turns]
    else:
        rows = [(bool(m), t.model_judged or (0, 0)) for t in turns
                if (m := t.model_ungrounded) is not None]  # fmt: skip
    k, n = sum(bad for bad, _ in rows), len(rows)
    ci = wilson_interval(k, n) if n else None
    return {"ungrounded": k, "n": n, "rate": round(k / n, 4) if n else None,
            "ci95": [round(ci[0], 4), round(ci[1], 4)] if ci else None,
            "claims_judged": sum(j for _, (j, _u) in rows),
            "claims_unjudged": sum(u for _, (_j, u) in rows),
            "answers_judged": sum(1 for _, (j, _u) in rows if j)}  # fmt: skip


def rate_text(r: Mapping[str, Any]) -> str:
    """A rate of :func:`grounding_rate` in a line: ``2/30 = 0.067 [0.018, 0.213];
    claims judged 41, not judged 3; 22 of 30 answers with a judged claim``."""
    if not r["n"]:
        return "n = 0"
    lo, hi = r["ci95"]
    judged = r.get("claims_judged")
    said = "" if judged is None else (
        f"; claims judged {judged}, not judged {r.get('claims_unjudged', 0)}; "
        f"{r.get('answers_judged', 0)} of {r['n']} answers with a judged claim")  # fmt: skip
    return f"{r['ungrounded']}/{r['n']} = {r['rate']:.3f} [{lo:.3f}, {hi:.3f}]{said}"
