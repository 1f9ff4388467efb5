"""The main job's answer TTFT on the embedded model, two checkouts side by side in one
run: is a change's answer no slower to start than before it?

For ``--rounds`` rounds, in turn: ``chainrun replay replays/commerce-12.jsonl`` (the
README's first command, the default chain) run by the ``--old`` checkout, then by the
``--new`` one, each with its own log and its own llama-server of the embedded model
(a checkout starts its own; they are left running between rounds, so that only the first
round pays the start). Each turn's ``turns.answer_ttft_ms`` (the answer's first token at
arrival) is read back; per arm: n, the p50 with its distribution-free 95% interval
(:func:`chainrun.statistics.intervals.quantile_ci`), and new − old of the p50 with the
conservative interval of :func:`chainrun.statistics.intervals.quantile_diff`.

Run (a timing run: alone, under the lock)::

    flock /tmp/chainrun-timing.lock python benchmarks/answer_ttft_side_by_side.py \\
        --old /path/to/old/checkout --new . --rounds 2 \\
        --out benchmarks/results/answer_ttft_side_by_side.json
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from chainrun.statistics.intervals import percentile, quantile_ci, quantile_diff

MAIN_JOB = "replays/commerce-12.jsonl"


def replay_ttfts(checkout: Path, db: Path) -> list[float]:
    """Run the main job from ``checkout`` into ``db``; its turns' answer TTFTs (ms).

    Raises:
        SystemExit: the replay failed (its last output lines said why).
    """
    done = subprocess.run([sys.executable, "-m", "chainrun", "replay", MAIN_JOB, "--db",
                           str(db)], cwd=checkout, capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: replay exited {done.returncode}: "
                         f"{done.stderr[-1500:]}")  # fmt: skip
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT answer_ttft_ms FROM turns WHERE status = 'ok' "
                           "AND answer_ttft_ms IS NOT NULL").fetchall()  # fmt: skip
    return [float(r[0]) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the checkout before")
    parser.add_argument("--new", type=Path, required=True, help="the checkout after")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    arms: dict[str, list[float]] = {"old": [], "new": []}
    result: dict[str, object] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_start": os.getloadavg()[0], "old": str(args.old.resolve()),
        "new": str(args.new.resolve()), "rounds": args.rounds,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in ("old", "new"):
                values = replay_ttfts(getattr(args, arm).resolve(), Path(tmp) / f"{arm}{r}.db")
                arms[arm].extend(values)
                print(f"round {r + 1} {arm}: n={len(values)} "
                      f"p50={percentile(values, 50):.0f} ms", flush=True)  # fmt: skip
    for arm, values in arms.items():
        result[arm + "_answer_ttft_ms"] = {"n": len(values), "p50": percentile(values, 50),
                                          "p50_ci": quantile_ci(values, 50)}  # fmt: skip
    diff = quantile_diff(arms["old"], arms["new"], 50)
    result["new_minus_old_p50_ms"] = {"estimate": diff.estimate, "ci": diff.ci}
    result["load_end"] = os.getloadavg()[0]
    result["ended"] = datetime.now(UTC).isoformat(timespec="seconds")
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
