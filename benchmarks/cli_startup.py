"""Start-up time of the CLI: ``chainrun --help``, ``chainrun runs`` and ``chainrun show``,
wall clock.

Each command runs as a user runs it (``python -m chainrun ...`` in a fresh process), with
each checkout given by ``--checkout`` first on ``PYTHONPATH`` (default: this one), and
a bare interpreter (``python -c pass``) in the same rounds: on a shared machine the
ratio to the bare interpreter is the figure to compare, the absolute times move with the
load. Rounds interleave the checkouts and commands so that load changes hit each alike.
Reported per command and checkout: n, median wall time in ms with its 95%
order-statistic interval, and the median ratio to the bare interpreter of the same
round; plus, from one ``python -X importtime`` run, the chainrun modules and libraries
that cost most to import.

Run (timing runs hold the shared lock)::

    flock /tmp/chainrun-bench.lock python benchmarks/cli_startup.py \\
        [--checkout /path/to/other/checkout] [--rounds 15]

``runs`` lists an empty log made for the run (a temporary file), so the figure is the
start-up and not the reading of a large log. ``show`` prints one run of a log made
before the rounds by a replay against the lab (the README's tour chain: keyword classify
and search, compose, validate and critique): ``show-12`` a run of 12 turns, ``show-300``
one of 300 (``--show-turns`` sets the sizes; the lab's replay is not timed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c

from chainrun.statistics import intervals as stats

ROOT = Path(__file__).resolve().parents[1]


def _env(checkout: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    # a user's interpreter keeps compiled bytecode; without it (PYTHONDONTWRITEBYTECODE,
    # set on some machines) every import compiles its source again: ~0.15 s of show
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    env["COLUMNS"] = "120"
    return env


def _wall_ms(args: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ms = (time.perf_counter() - t0) * 1000.0
    if proc.returncode != 0:
        raise RuntimeError(f"{args} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return ms


def importtime(
    args: list[str], env: dict[str, str], cwd: str, top: int = 12
) -> list[dict[str, Any]]:
    """The ``top`` costliest imports (cumulative µs → ms) of one run of ``args``."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args[1:]], env=env, cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cum_us, name = line.replace("import time:", "").split("|")
        rows.append({"module": name.strip(), "cumulative_ms": int(cum_us) / 1000.0})
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:top]


def make_log(db: Path, n_turns: int, tmp: Path) -> None:
    """A log holding one replay of ``n_turns`` turns against the lab (the shipped
    commerce-12 requests over and over), for ``show`` to print."""
    from chainrun.lab import LabServer

    lines = (ROOT / "replays" / "commerce-12.jsonl").read_text().splitlines()
    requests = tmp / f"requests-{n_turns}.jsonl"
    with requests.open("w") as f:
        for i in range(n_turns):
            obj = json.loads(lines[i % len(lines)])
            obj["id"] = f"{obj['id']}-{i}"
            f.write(json.dumps(obj) + "\n")
    with LabServer("fast", n_tokens=24, per_token_ms=1) as lab:
        cfg = tmp / "tour.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n'
                       '[steps.retrieve.retrieval]\nsearches = ["keyword", "filter"]\n'
                       '[steps.classify]\nmethod = "keywords"\n')  # fmt: skip
        subprocess.run([sys.executable, "-m", "chainrun", "replay", str(requests), "--config",
                        str(cfg), "--db", str(db), "--concurrency", "8"], check=True,
                       cwd=tmp, stdout=subprocess.DEVNULL, env=_env(ROOT))  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    checkouts = [Path(p).resolve() for p in (args.checkout or [str(ROOT)])]
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "empty.db"
        # an empty log: runs lists nothing; the figure is the start-up
        subprocess.run([sys.executable, "-c", "import sqlite3, sys; sqlite3.connect(sys.argv[1])"
                        ".close()", str(db)], check=True)  # fmt: skip
        commands = {
            "--help": [sys.executable, "-m", "chainrun", "--help"],
            "runs": [sys.executable, "-m", "chainrun", "runs", "--db", str(db)],
        }
        for n in args.show_turns:
            log = Path(tmp) / f"show-{n}.db"
            print(f"making a log of {n} turns for show", file=sys.stderr, flush=True)
            make_log(log, n, Path(tmp))
            commands[f"show-{n}"] = [sys.executable, "-m", "chainrun", "show", "1", "--db",
                                     str(log)]
        for co in checkouts:  # each checkout's runs import that checkout's chainrun
            probe = [sys.executable, "-c", "import chainrun; print(chainrun.__file__)"]
            where = subprocess.run(probe, env=_env(co), cwd=tmp, capture_output=True, text=True)
            if not where.stdout.strip().startswith(str(co)):
                raise SystemExit(f"{co}: python -m chainrun would import {where.stdout.strip()}")
        bare = [sys.executable, "-c", "pass"]
        times: dict[str, dict[str, list[float]]] = {
            str(co): {name: [] for name in commands} for co in checkouts
        }
        ratios: dict[str, dict[str, list[float]]] = {
            str(co): {name: [] for name in commands} for co in checkouts
        }
        bare_ms: list[float] = []
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
            # every command runs in the temporary directory: ``python -m`` puts the working
            # directory first on sys.path, ahead of PYTHONPATH, so a run from a checkout
            # would import that checkout whatever --checkout says
            base = _wall_ms(bare, _env(None), tmp)
            bare_ms.append(base)
            for co in checkouts:
                for name, cmd in commands.items():
                    ms = _wall_ms(cmd, _env(co), tmp)
                    times[str(co)][name].append(ms)
                    ratios[str(co)][name].append(ms / base)
        out: dict[str, Any] = {"bare_python": _summary(bare_ms), "checkouts": {}}
        for co in checkouts:
            entry: dict[str, Any] = {}
            for name, cmd in commands.items():
                entry[name] = {
                    **_summary(times[str(co)][name]),
                    "ratio_to_bare_median": round(statistics.median(ratios[str(co)][name]), 2),
                    "top_imports": importtime(cmd, _env(co), tmp),
                }
            out["checkouts"][str(co)] = entry
    return out


def _summary(values: list[float]) -> dict[str, Any]:
    ci = stats.quantile_ci(values, 50)
    return {
        "n": len(values),
        "median_ms": round(statistics.median(values), 1),
        "median_ci95_ms": [round(ci[0], 1), round(ci[1], 1)] if ci else None,
    }


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    b = res["bare_python"]
    lines = [f"bare python: median {b['median_ms']} ms {b['median_ci95_ms']} (n={b['n']})"]
    for co, entry in res["checkouts"].items():
        lines.append(co)
        for name, m in entry.items():
            lines.append(f"  chainrun {name:<8} median {m['median_ms']:>7} ms "
                         f"{m['median_ci95_ms']} (n={m['n']}), "
                         f"{m['ratio_to_bare_median']}x bare python")  # fmt: skip
            top = ", ".join(f"{t['module']} {t['cumulative_ms']:.0f}" for t in m["top_imports"][:4])
            lines.append(f"    costliest imports (ms, cumulative): {top}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append",
                        help="a chainrun checkout to measure (repeatable; default: this one)")
    parser.add_argument("--rounds", type=int, default=15, help="runs of each command")
    parser.add_argument("--show-turns", type=lambda v: [int(x) for x in v.split(",") if x],
                        default=[12, 300], help="sizes of the runs show prints (default 12,300)")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = c.new_document("cli_startup", argv or [], vars(args))
    doc["results"] = run(args)
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
