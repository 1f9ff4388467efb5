"""Audit item 8: the answers state only what the shop's own sources say.

See :mod:`chainrun.audit.items` for what every item returns. The figures are those of
:mod:`chainrun.analysis.grounding`: per sample, the answers the shopper received that
hold a fact judged false (checked again against each turn's logged products, the run's
policy, currency and locale), and the share of answers the model wrote with one (the
answer step's grounding records, where its check ran), each with n and a 95% Wilson
interval, and beside them how many claims were judged and how many could not be."""

from __future__ import annotations

from chainrun.analysis.grounding import grounding_rate, groundings_of
from chainrun.audit.items.common import REPLAY_CMD
from chainrun.audit.report import Item, Table, Verdict
from chainrun.audit.scope import Scope

TITLE_8 = "Answers state only the products, prices, stock and policy facts the shop's sources hold"

#: answered turns a sample needs before the item judges it
MIN_ANSWERS = 10


def check_grounding(scope: Scope) -> Item:
    """Fail: an answer the shopper received stated a fact judged false. Warn: none did,
    but no claim of the answers could be judged ("0 ungrounded" of nothing judged), or
    the grounding check did not run on every answer (nothing kept the shopper from
    one). Pass: none did, claims were judged, and the check ran on every answer. Not
    enough data: fewer than :data:`MIN_ANSWERS` answered turns."""
    figures: dict[str, dict[str, object]] = {}
    rows = []
    verdicts: list[Verdict] = []
    notes = []
    for sample in scope.samples:
        turns = groundings_of(sample.turns, sample.steps,
                              configs={r.id: r.config for r in sample.runs})  # fmt: skip
        shown, model = grounding_rate(turns), grounding_rate(turns, shown=False)
        n = int(shown["n"] or 0)
        grounded = n - int(shown["ungrounded"] or 0)
        share = {"grounded": grounded, "n": n,
                 "share": round(grounded / n, 4) if n else None,
                 "ci95": _flip(shown["ci95"])}  # fmt: skip
        share["claims_judged"] = shown["claims_judged"]
        share["claims_unjudged"] = shown["claims_unjudged"]
        share["answers_judged"] = shown["answers_judged"]
        figures[sample.name] = {"grounded_shown": share, "ungrounded_model": model}
        rows.append([sample.name, n, f"{grounded}/{n}" if n else "–", share["ci95"],
                     f"{shown['claims_judged']} / {shown['claims_unjudged']}",
                     f"{model['ungrounded']}/{model['n']}" if model["n"] else "no check",
                     model["ci95"]])  # fmt: skip
        if n < MIN_ANSWERS:
            verdicts.append("not_enough_data")
        elif grounded < n:
            verdicts.append("fail")
            bad = [t for t in turns if t.shown_ungrounded]
            notes += [f"{sample.name}, turn {t.turn_id}: "
                      + "; ".join(f"{c.kind} {c.text!r}: {c.why}"
                                  for c in t.shown_ungrounded[:2])
                      for t in bad[:3]]  # fmt: skip
        elif not shown["answers_judged"]:
            verdicts.append("warn")
            notes.append(f"{sample.name}: no claim of its {n} answers could be judged "
                         f"({shown['claims_unjudged']} could not be)")  # fmt: skip
        elif model["n"] < n:
            verdicts.append("warn")
        else:
            verdicts.append("pass")
    order = {"fail": 3, "warn": 2, "pass": 1, "not_enough_data": 0}
    verdict: Verdict = max(verdicts, key=lambda v: order[v]) if verdicts else "not_enough_data"
    if verdict == "not_enough_data" and any(v != "not_enough_data" for v in verdicts):
        verdict = "pass"
    evidence = {
        "fail": "Some answers the shopper received state a product, price, stock or policy "
                "fact the shop's sources do not hold.",
        "warn": "No answer stated a fact judged false, but either none of their claims could "
                "be judged or the grounding check did not run on every answer: nothing shows "
                "the shopper was kept from one.",
        "pass": "Every answer the shopper received states only what the shop's sources hold "
                "(its claims judged), and the grounding check ran on each.",
        "not_enough_data": f"Fewer than {MIN_ANSWERS} answered turns to judge.",
    }[verdict]  # fmt: skip
    missing = [] if verdict != "not_enough_data" else [
        f"at least {MIN_ANSWERS} answered turns: {REPLAY_CMD}"]  # fmt: skip
    columns = ["sample", "answers", "grounded as received", "95% CI",
               "claims judged / not judged", "ungrounded as written", "95% CI"]  # fmt: skip
    table = Table("Grounded answers", columns, rows)
    return Item(8, TITLE_8, verdict, evidence, figures, notes, missing, [table])


def _flip(ci: list[float] | None) -> list[float] | None:
    """The interval of the grounded share from that of the ungrounded one."""
    return None if ci is None else [round(1 - ci[1], 4), round(1 - ci[0], 4)]
