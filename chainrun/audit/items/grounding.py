"""Audit item 8: the answers state only what the turn's rows say.

See :mod:`chainrun.audit.items` for what every item returns. The figures are those of
:mod:`chainrun.analysis.grounding`: per sample, the answers the shopper received that
hold an ungrounded product fact (checked again against each turn's logged products),
and the share of answers the model wrote with one (the answer step's grounding records,
where its check ran), each with n and a 95% Wilson interval."""

from __future__ import annotations

from chainrun.analysis.grounding import grounding_rate, groundings_of
from chainrun.audit.items.common import REPLAY_CMD
from chainrun.audit.report import Item, Table, Verdict
from chainrun.audit.scope import Scope

TITLE_8 = "Answers state only the products, prices and stock the turn's own rows hold"

#: answered turns a sample needs before the item judges it
MIN_ANSWERS = 10


def check_grounding(scope: Scope) -> Item:
    """Fail: an answer the shopper received stated an ungrounded product fact. Warn: none
    did, but the grounding check did not run on every answer (nothing kept the shopper
    from one). Pass: none did and the check ran on every answer. Not enough data: fewer
    than :data:`MIN_ANSWERS` answered turns."""
    figures: dict[str, dict[str, object]] = {}
    rows = []
    verdicts: list[Verdict] = []
    notes = []
    for sample in scope.samples:
        turns = groundings_of(sample.turns, sample.steps)
        shown, model = grounding_rate(turns), grounding_rate(turns, shown=False)
        n = int(shown["n"] or 0)
        grounded = n - int(shown["ungrounded"] or 0)
        share = {"grounded": grounded, "n": n,
                 "share": round(grounded / n, 4) if n else None,
                 "ci95": _flip(shown["ci95"])}  # fmt: skip
        figures[sample.name] = {"grounded_shown": share, "ungrounded_model": model}
        rows.append([sample.name, n, f"{grounded}/{n}" if n else "–", share["ci95"],
                     f"{model['ungrounded']}/{model['n']}" if model["n"] else "no check",
                     model["ci95"]])  # fmt: skip
        if n < MIN_ANSWERS:
            verdicts.append("not_enough_data")
        elif grounded < n:
            verdicts.append("fail")
            bad = [t for t in turns if t.shown_ungrounded_product]
            notes += [f"{sample.name}, turn {t.turn_id}: "
                      + "; ".join(f"{c.kind} {c.text!r}: {c.why}"
                                  for c in t.shown_ungrounded_product[:2])
                      for t in bad[:3]]  # fmt: skip
        elif model["n"] < n:
            verdicts.append("warn")
        else:
            verdicts.append("pass")
    order = {"fail": 3, "warn": 2, "pass": 1, "not_enough_data": 0}
    verdict: Verdict = max(verdicts, key=lambda v: order[v]) if verdicts else "not_enough_data"
    if verdict == "not_enough_data" and any(v != "not_enough_data" for v in verdicts):
        verdict = "pass"
    evidence = {
        "fail": "Some answers the shopper received state a product, price or stock the turn's "
                "rows do not hold.",
        "warn": "No answer stated an ungrounded product fact, but the grounding check did not "
                "run on every answer: nothing kept the shopper from one.",
        "pass": "Every answer the shopper received states only what the turn's rows hold, and "
                "the grounding check ran on each.",
        "not_enough_data": f"Fewer than {MIN_ANSWERS} answered turns to judge.",
    }[verdict]  # fmt: skip
    missing = [] if verdict != "not_enough_data" else [
        f"at least {MIN_ANSWERS} answered turns: {REPLAY_CMD}"]  # fmt: skip
    columns = ["sample", "answers", "grounded as received", "95% CI",
               "ungrounded as written", "95% CI"]  # fmt: skip
    table = Table("Grounded answers", columns, rows)
    return Item(8, TITLE_8, verdict, evidence, figures, notes, missing, [table])


def _flip(ci: list[float] | None) -> list[float] | None:
    """The interval of the grounded share from that of the ungrounded one."""
    return None if ci is None else [round(1 - ci[1], 4), round(1 - ci[0], 4)]
