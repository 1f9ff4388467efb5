"""The broken-prompt mutation on the embedded model: is hiding the catalogue and the
policy from the model a regression that ``chainrun compare --fail-on-regression evals``
detects on the regression suite, while the baseline against itself is not?

Three ``chainrun eval evals/regression.jsonl`` runs into one log, with validate and
critique cut at 1 s (``benchmarks/configs/quick_checks.toml``: they only flag an
answer; the eval's own sampling: temperature 0 unless a case asks otherwise), in order:
baseline, mutation (``benchmarks/configs/hidden_catalogue.toml``), baseline again;
then ``compare BASELINE MUTATION`` and ``compare BASELINE AGAIN``, each with
``--fail-on-regression evals`` (the paired per-case comparison, exact McNemar). Prints
and writes (``--out``) each run's pass rate and each comparison's exit code (1: a
regression). The same on the stand-in model that reads its prompt is
``tests/test_quality_mutations.py``.

Run::

    python benchmarks/quality_mutations.py --db /tmp/mutations.db \\
        --out benchmarks/results/quality_mutations.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "benchmarks" / "configs"
RUNS = (("baseline", "quick_checks.toml"), ("hidden", "hidden_catalogue.toml"),
        ("baseline_again", "quick_checks.toml"))  # fmt: skip


def _chainrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chainrun", *args], cwd=REPO,
                          capture_output=True, text=True, check=False)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="a new SQLite log")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict[str, object] = {"started": datetime.now(UTC).isoformat(timespec="seconds"),
                                 "load_start": os.getloadavg()[0], "runs": {}}  # fmt: skip
    runs: dict[str, dict[str, object]] = {}
    retries: list[str] = []
    for name, config in RUNS:
        for _ in range(3):
            done = _chainrun("eval", "evals/regression.jsonl", "--config",
                             str(CONFIGS / config), "--db", str(args.db), "--label", name,
                             "--json")  # fmt: skip
            # the embedded server still busy with the last run's cancelled calls can miss
            # the eval's preflight: wait and ask again (counted in the result)
            if done.returncode != 2 or "cannot reach provider" not in done.stderr:
                break
            retries.append(name)
            time.sleep(15)
        if done.returncode not in (0, 1):
            raise SystemExit(f"eval {name} failed ({done.returncode}): {done.stderr[-2000:]}")
        doc = json.loads(done.stdout)
        runs[name] = {"run_id": doc["run_id"], "pass_rate": doc["cases"]["pass_rate"],
                      "pass_rate_ci": doc["cases"]["pass_rate_ci"], "n": doc["cases"]["n"]}
        print(name, runs[name], flush=True)
    compared = {}
    for other in ("hidden", "baseline_again"):
        done = _chainrun("compare", str(runs["baseline"]["run_id"]), str(runs[other]["run_id"]),
                         "--db", str(args.db), "--fail-on-regression", "evals")  # fmt: skip
        compared[other] = {"exit_code": done.returncode, "regression": done.returncode == 1}
        print(f"compare baseline {other}: exit {done.returncode}", flush=True)
    result.update(runs=runs, compare=compared, preflight_retries=retries,
                  load_end=os.getloadavg()[0],
                  ended=datetime.now(UTC).isoformat(timespec="seconds"))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
