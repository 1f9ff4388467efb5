"""Count a run's answers that state an ungrounded product fact, from its log.

Reads one run (``--db``, ``--run``; default the latest) and, for every answered turn,
checks the answer the shopper received against the turn's logged sources (the products
its search handed on, its tool results, the shop's policy: :mod:`chainrun.analysis.grounding`):
a product id the turn was not handed, a product given another's title, a price no
product of the turn has (or another product's), a size out of stock. It prints per
turn the ungrounded product facts and why, and the count k of n with a 95% Wilson
interval; beside it, when the answer step's grounding check ran, what the model wrote
before the check acted (its ``detail["grounding"]``). The catalogue of the log file is
read for titles, so a product the turn was not handed is caught by its title too. No
timing.

Run: ``python benchmarks/grounding_count.py --db chainrun.db [--run N] [--json]``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import _common as c
import sqlite_utils

from chainrun.analysis.grounding import grounding_rate, turn_groundings
from chainrun.checks.grounding import ProductRow
from chainrun.log.store import Store
from chainrun.retrieval.catalog import all_products


def run(db_path: str, run_id: int | None) -> dict[str, Any]:
    catalogue = {p["id"]: ProductRow.of(p)
                 for p in all_products(sqlite_utils.Database(db_path))}  # fmt: skip
    with Store.open(db_path) as store:
        rid = run_id or store.latest_run_id()
        if rid is None:
            raise SystemExit(f"{db_path}: no run in the log")
        turns = turn_groundings(store, rid, catalogue=catalogue)
    rows = []
    for t in turns:
        model = t.model_ungrounded_product
        rows.append({
            "turn_id": t.turn_id, "answer": t.answer,
            "shown_ungrounded": [x.as_json() for x in t.shown_ungrounded_product],
            "model_ungrounded": model,
            "model_claims": None if t.model is None else t.model.get("claims"),
            "done": None if t.model is None else t.model.get("done"),
        })  # fmt: skip
    return {"db": db_path, "run_id": rid, "shown": grounding_rate(turns),
            "model": grounding_rate(turns, shown=False), "turns": rows}  # fmt: skip


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = []
    for t in res["turns"]:
        mark = "✗" if t["shown_ungrounded"] else "✓"
        lines.append(f"{mark} turn {t['turn_id']}: {t['answer'][:110]!r}")
        for u in t["shown_ungrounded"]:
            lines.append(f"    shown: {u['kind']} {u['text']!r}: {u['why']}")
        for u in t["model_ungrounded"] or []:
            lines.append(f"    model wrote: {u['kind']} {u['text']!r}: {u['why']}")
    s, m = res["shown"], res["model"]
    lines.append(f"run {res['run_id']}: answers with an ungrounded product fact as the shopper "
                 f"received them: {s['ungrounded']} of {s['n']} {s['ci95']}")
    if m["n"]:
        lines.append(f"as the model wrote them (the grounding check's record): "
                     f"{m['ungrounded']} of {m['n']} {m['ci95']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="the run log (SQLite file)")
    parser.add_argument("--run", type=int, help="the run id (default: the latest)")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = c.new_document("grounding_count", argv or [], vars(args))
    doc["results"] = run(args.db, args.run)
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
