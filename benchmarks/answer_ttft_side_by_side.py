"""The main job's answer TTFT on the embedded model, two checkouts side by side in one
run: is a change's answer no slower to start than before it?

For ``--rounds`` rounds, in turn: ``chainrun replay replays/commerce-12.jsonl`` (the
README's first command, the default chain) run by the ``--old`` checkout and by the
``--new`` one (which goes first alternates by round), each with its own log and its own
llama-server of the embedded model (a checkout starts its own). Each round is cold, as a
fresh clone's first run is: the checkout's server is stopped (``chainrun local down``)
before its replay, which starts it again with an empty prompt cache (``--warm``: left
running between rounds: later rounds find the twelve prompts cached, and the pooled
figures mix two kinds of turn). Both servers are stopped at the end (a server of this
install left running is one the local-model tests would meet). Each turn's
``turns.answer_ttft_ms`` (the answer's first token at arrival) is read back; per arm:
n, the p50 with its distribution-free 95% interval
(:func:`chainrun.statistics.intervals.quantile_ci`); new − old of the p50 with the
conservative interval of :func:`chainrun.statistics.intervals.quantile_diff`; and
the paired differences (the same case in the same round, new − old): their median with
the distribution-free interval of the median (the sign test's), the comparison with the
least noise between runs.

Run (a timing run: alone, under the lock)::

    flock /tmp/chainrun-timing.lock python benchmarks/answer_ttft_side_by_side.py \\
        --old /path/to/old/checkout --new . --rounds 3 \\
        --out benchmarks/results/answer_ttft_side_by_side.json
"""

from __future__ import annotations

import argparse
import contextlib
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


def stop_server(checkout: Path) -> None:
    """Stop ``checkout``'s own embedded model server (``chainrun local down``: other
    checkouts' servers are left alone); none running is fine."""
    subprocess.run([sys.executable, "-m", "chainrun", "local", "down"], cwd=checkout,
                   capture_output=True, text=True, check=False)  # fmt: skip


#: a turn's answer TTFT in parts (ms): before the answer step started (classify,
#: retrieve, the policy's lines), the answer call's own TTFT (the model server: its
#: prompt computed, the first token), and the rest (the answer step's own work before
#: its call, such as the lead, and the checks' hold after its first token)
PARTS = ("before_answer_step", "answer_call_ttft", "rest_of_answer_step")


def replay_ttfts(checkout: Path, db: Path) -> dict[str, dict[str, float]]:
    """Run the main job from ``checkout`` into ``db``; its turns' answer TTFTs (ms) by
    request id: ``{"answer_ttft": ms, **PARTS}`` (a part not known: left out).

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
        rows = con.execute(
            "SELECT t.request_id, t.answer_ttft_ms, s.started_offset_ms, "
            "(SELECT min(c.ttft_ms) FROM calls c WHERE c.turn_id = t.id AND c.step = s.step) "
            "FROM turns t JOIN steps s ON s.turn_id = t.id AND s.step = 'compose' "
            "WHERE t.status = 'ok' AND t.answer_ttft_ms IS NOT NULL").fetchall()
    out: dict[str, dict[str, float]] = {}
    for request_id, ttft, step_at, call_ttft in rows:
        turn = {"answer_ttft": float(ttft)}
        if step_at is not None and call_ttft is not None:
            turn |= {"before_answer_step": float(step_at), "answer_call_ttft": float(call_ttft),
                     "rest_of_answer_step": float(ttft) - float(step_at) - float(call_ttft)}
        out[str(request_id)] = turn
    return out


def summary(values: list[float]) -> dict[str, object]:
    """n, p50 and its 95% interval (ms)."""
    return {"n": len(values), "p50": percentile(values, 50) if values else None,
            "p50_ci": quantile_ci(values, 50) if values else None}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the checkout before")
    parser.add_argument("--new", type=Path, required=True, help="the checkout after")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", action="store_true",
                        help="leave each checkout's server running between rounds")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    arms: dict[str, list[float]] = {"old": [], "new": []}
    paired: dict[str, list[float]] = {k: [] for k in ("answer_ttft", *PARTS)}
    result: dict[str, object] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_start": os.getloadavg()[0], "old": str(args.old.resolve()),
        "new": str(args.new.resolve()), "rounds": args.rounds, "cold": not args.warm,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        for arm in ("old", "new"):  # each checkout's own server stopped at the end
            servers.callback(stop_server, getattr(args, arm).resolve())
        for r in range(args.rounds):
            by_arm: dict[str, dict[str, dict[str, float]]] = {}
            for arm in ("old", "new") if r % 2 == 0 else ("new", "old"):  # either first
                checkout = getattr(args, arm).resolve()
                if not args.warm:
                    stop_server(checkout)
                by_arm[arm] = replay_ttfts(checkout, Path(tmp) / f"{arm}{r}.db")
                values = [t["answer_ttft"] for t in by_arm[arm].values()]
                arms[arm].extend(values)
                print(f"round {r + 1} {arm}: n={len(values)} "
                      f"p50={percentile(values, 50):.0f} ms", flush=True)  # fmt: skip
            for k in sorted(by_arm["new"].keys() & by_arm["old"].keys()):
                new_turn, old_turn = by_arm["new"][k], by_arm["old"][k]
                for part, diffs in paired.items():
                    if part in new_turn and part in old_turn:
                        diffs.append(new_turn[part] - old_turn[part])
    for arm, values in arms.items():
        result[arm + "_answer_ttft_ms"] = summary(values)
    diff = quantile_diff(arms["old"], arms["new"], 50)
    result["new_minus_old_p50_ms"] = {"estimate": diff.estimate, "ci": diff.ci}
    # the same case in the same round: the answer TTFT's difference, and its parts'
    result["paired_new_minus_old_ms"] = {
        part: {**summary(diffs), "new_faster": sum(d < 0 for d in diffs)}
        for part, diffs in paired.items()
    }
    result["load_end"] = os.getloadavg()[0]
    result["ended"] = datetime.now(UTC).isoformat(timespec="seconds")
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
