"""The regression suite's expectations on the answers of a checkout's default chain,
before and after a change, on the embedded model.

``chainrun eval`` runs a case set with the code that reads it; an older checkout cannot
read the assertion types added since. So the answers are made by each checkout's own
``chainrun replay`` of the suite's messages, and judged by today's scorer:

1. ``python benchmarks/regression_answers.py make-set --out /tmp/reg.jsonl``: the cases
   of ``evals/regression.jsonl`` that a replay can ask (those without ``context``:
   their message, conversation, turn and fixed history) as a replay set;
2. in each checkout: ``python -m chainrun replay /tmp/reg.jsonl --config
   benchmarks/configs/answer_path.toml --db /tmp/reg-NAME.db`` (the answer's path:
   classify, retrieve, policy, compose; validate and critique flag, they do not change
   the answer);
3. ``python benchmarks/regression_answers.py score /tmp/reg-NAME.db``: the share of
   cases whose every assertion passes (assertions on validate and critique left out),
   with its 95% Wilson interval, and each failing case's failed assertion types.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from chainrun.evals import load_cases
from chainrun.evals.scoring import score_turn
from chainrun.log.store import Store
from chainrun.statistics.intervals import wilson_interval

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "evals" / "regression.jsonl"
CATALOGUE = REPO / "chainrun" / "data" / "catalog.jsonl"
NOT_ON_THE_PATH = ("validate", "critique")


def make_set(out: Path) -> int:
    """Write the askable cases as a replay set; returns how many."""
    rows = []
    for case in load_cases(CASES):
        if case.context:
            continue
        row: dict[str, object] = {"id": case.id, "message": case.message}
        if case.conversation_id:
            row["conversation_id"] = case.conversation_id
        if case.turn:
            row["turn"] = case.turn
        if case.history:
            row["history"] = [h.model_dump() if hasattr(h, "model_dump") else h
                              for h in case.history]  # fmt: skip
        rows.append(json.dumps(row))
    out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return len(rows)


async def score(db: Path) -> dict[str, object]:
    """Judge the last run of ``db`` against the cases (see the module text)."""
    cases = {c.id: c for c in load_cases(CASES) if not c.context}
    catalogue = {json.loads(line)["id"] for line in
                 CATALOGUE.read_text(encoding="utf-8").splitlines() if line.strip()}
    with Store.open(db) as store:
        run = store.latest_run_id()
        if run is None:
            raise SystemExit(f"{db}: no run in this log")
        turns, steps, calls = store.turns(run), store.steps(run), store.calls(run)
        passed = n = 0
        failed: list[tuple[str, list[str]]] = []
        for turn in turns:
            case = cases.get(turn.request_id or "")
            if case is None:
                continue
            verdicts = [v for v in await score_turn(turn, steps, calls, case,
                                                     catalog_ids=catalogue)
                        if v.step not in NOT_ON_THE_PATH]  # fmt: skip
            n += 1
            if all(v.passed is not False for v in verdicts):
                passed += 1
            else:
                failed.append((case.id, [v.type for v in verdicts if v.passed is False]))
    interval = wilson_interval(passed, n)
    return {"db": str(db), "run": run, "n": n, "passed": passed,
            "rate": passed / n if n else None, "rate_ci": interval, "failed": failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("make-set")
    made.add_argument("--out", type=Path, required=True)
    scored = sub.add_parser("score")
    scored.add_argument("db", type=Path)
    args = parser.parse_args()
    if args.command == "make-set":
        print(f"{make_set(args.out)} cases written to {args.out}")
        return
    result = asyncio.run(score(args.db))
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
