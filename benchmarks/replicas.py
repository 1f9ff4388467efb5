"""Conversations on R replicas of the embedded model: affinity against round-robin and random.

Starts, for each policy (``affinity``, ``round_robin``, ``random``), R replicas of the
embedded local model (:mod:`chainrun.runtime.local_replicas`: own ports, own prompt
caches; the install's shared llama-server is not touched) and a ``chainrun serve
--workers W`` whose ``[providers.local]`` is those replicas under that policy
(``prompt_cache = "slot"``: a slot table per replica), each with a SQLite log of its
own. Every policy gets replicas of its own, so that no policy finds prompts another
policy cached.

Then replays ``replays/conversations.jsonl`` (10 conversations, 28 turns) through the
three serves, **interleaved**: the set is cut into its conversations, and each
conversation's turns run through every policy before the next conversation starts, the
policies' order rotating from one conversation to the next (a drift in the shared
machine's load falls on every policy alike). Turns run one at a time (``POST /chat``,
the stream read to its ``turn`` event); a conversation's id is new per policy and
round.

The answer step (``compose``) is hedged with a fixed delay (``--hedge-delay-ms``, 2
attempts, ``max_extra_load`` 1.0 so that the budget refuses no copy), the same for
every policy; under ``affinity`` a copy goes to the next replica of the conversation's
ranking, under the others to the replica the policy picks next.

Reported per policy, from its log:

- turns ≥ 2: compose's cached share (``cached_input_tokens`` over ``input_tokens`` of
  each turn's winning compose call, pooled) and the answer TTFT p50 (``turns.
  answer_ttft_ms``) with its 95% order-statistic interval, beside turn 1's, and the
  ratio of the two medians;
- compose calls by target: a call's replica (``calls.server_address``) is **warm** when
  an earlier turn of the same conversation had a compose call on it (its prompt cache
  may hold the conversation), else **cold**; per class, the calls, the cached share and
  the call TTFT p50;
- the hedge copies by target: copies sent to a warm and to a cold replica, and how many
  of each won (``calls.outcome = 'duplicate'``);
- the replicas' share of compose calls, and turns not ``ok``.

Run from the checkout (the two cores are shared: under the timing lock, and only on a
quiet machine)::

    PYTHONPATH=. flock /tmp/chainrun-timing.lock python benchmarks/replicas.py --replicas 2

``--replicas 2,4`` runs R = 2 and then R = 4 (three policies x R llama-servers at once).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
from _common import add_common_options, finish, new_document, r
from pg_fleet import Serve

from chainrun.runtime import local_replicas
from chainrun.statistics.intervals import summarize

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("affinity", "round_robin", "random")


def _load_set(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The replay set's turns by conversation, in turn order."""
    convs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            convs[row["conversation_id"]].append(row)
    return {c: sorted(t, key=lambda x: x["turn"]) for c, t in convs.items()}


def _config(path: Path, urls: list[str], policy: str, args: argparse.Namespace) -> None:
    path.write_text(
        "[providers.local]\n"
        f"replicas = {json.dumps(urls)}\n"
        f'replica_policy = "{policy}"\n'
        'prompt_cache = "slot"\n'
        "sampling_fields = true\n\n"
        "[steps.compose.hedge]\n"
        f"delay_ms = {args.hedge_delay_ms}\n"
        "max_attempts = 2\n"
        "max_extra_load = 1.0\n",
        encoding="utf-8",
    )


def _turn(client: httpx.Client, url: str, message: str, cid: str) -> dict[str, Any]:
    """One turn through ``/chat``; the client's answer TTFT and the turn's status."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"client_ttft_ms": None, "status": None}
    with client.stream("POST", f"{url}/chat",
                       json={"message": message, "conversation_id": cid}) as resp:  # fmt: skip
        if resp.status_code != 200:
            out["status"] = f"http_{resp.status_code}"
            return out
        event = None
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                if event == "token" and out["client_ttft_ms"] is None:
                    out["client_ttft_ms"] = (time.perf_counter() - t0) * 1000.0
                elif event == "turn":
                    out["status"] = json.loads(line[5:])["status"]
    return out


def _rows(db: Path, sql: str) -> list[dict[str, Any]]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(x) for x in con.execute(sql).fetchall()]
    finally:
        con.close()


def _p50(values: list[float | None]) -> dict[str, Any]:
    """n, p50 and its 95% order-statistic interval (ms)."""
    s = summarize([v for v in values if v is not None])
    return {"n": s["n"], "p50": r(s["p50_ms"]), "ci95": s["p50_ci"]}


def analyse(db: Path) -> dict[str, Any]:
    """The figures of one policy's log (see the module text)."""
    turns = _rows(db, "select id, conversation_id, turn_index, status, answer_ttft_ms "
                      "from turns order by id")  # fmt: skip
    calls = _rows(db, "select c.turn_id, c.attempt, c.outcome, c.server_address, c.ttft_ms, "
                      "c.input_tokens, c.cached_input_tokens, c.round, c.started_offset_ms "
                      "from calls c where c.step = 'compose' order by c.id")  # fmt: skip
    seen: dict[str, set[str]] = defaultdict(set)  # conversation -> replicas with its compose
    cls: dict[str, dict[str, list[Any]]] = {"warm": defaultdict(list), "cold": defaultdict(list)}
    copies: dict[str, Counter[str]] = {"warm": Counter(), "cold": Counter()}
    share_later = [0, 0]
    replicas: Counter[str] = Counter()
    per_turn: list[dict[str, Any]] = []
    # calls in turn order: a replica is warm for a call when an earlier turn used it
    for turn in sorted(turns, key=lambda t: (t["conversation_id"], t["turn_index"] or 0)):
        mine = [c for c in calls if c["turn_id"] == turn["id"]]
        cid = turn["conversation_id"]
        for c in mine:
            if c["started_offset_ms"] is None or c["server_address"] is None:
                continue  # refused, never sent
            warmth = "warm" if c["server_address"] in seen[cid] else "cold"
            replicas[c["server_address"]] += 1
            cls[warmth]["ttft"].append(c["ttft_ms"])
            cls[warmth]["tokens"].append((c["input_tokens"] or 0, c["cached_input_tokens"] or 0))
            if c["attempt"] >= 2 and (c["round"] or 1) == 1:
                copies[warmth]["sent"] += 1
                copies[warmth]["won"] += c["outcome"] == "duplicate"
            won = c["outcome"] in ("not_fired", "primary", "duplicate")
            if won and (c["round"] or 1) == 1:
                per_turn.append({"conversation": cid, "turn": turn["turn_index"],
                                 "answer_ttft_ms": turn["answer_ttft_ms"],
                                 "server": c["server_address"], "target": warmth,
                                 "attempt": c["attempt"], "call_ttft_ms": c["ttft_ms"],
                                 "input_tokens": c["input_tokens"],
                                 "cached_input_tokens": c["cached_input_tokens"]})  # fmt: skip
            if won and (turn["turn_index"] or 0) >= 2 and (c["round"] or 1) == 1:
                share_later[0] += c["input_tokens"] or 0
                share_later[1] += c["cached_input_tokens"] or 0
        for c in mine:
            if c["server_address"] and c["ttft_ms"] is not None:
                seen[cid].add(c["server_address"])
    first = [t["answer_ttft_ms"] for t in turns if t["turn_index"] == 1]
    later = [t["answer_ttft_ms"] for t in turns if (t["turn_index"] or 0) >= 2]
    p1, p2 = _p50(first), _p50(later)

    def share(pairs: list[tuple[int, int]]) -> float | None:
        total = sum(a for a, _ in pairs)
        return r(sum(b for _, b in pairs) / total, 3) if total else None

    return {
        "turns": len(turns),
        "not_ok": dict(Counter(t["status"] for t in turns if t["status"] != "ok")),
        "turn_1_answer_ttft_ms": p1,
        "later_answer_ttft_ms": p2,
        "later_cached_share": r(share_later[1] / share_later[0], 3) if share_later[0] else None,
        "ttft_ratio_later_to_first": (r(p2["p50"] / p1["p50"], 3)
                                      if p1["p50"] and p2["p50"] else None),
        "compose_calls_by_target": {
            k: {"calls": len(v["ttft"]), "cached_share": share(v["tokens"]),
                "call_ttft_ms": _p50(v["ttft"])}
            for k, v in cls.items()
        },
        "hedge_copies_by_target": {
            k: {"sent": v["sent"], "won": v["won"],
                "win_rate": r(v["won"] / v["sent"], 3) if v["sent"] else None}
            for k, v in copies.items()
        },
        "compose_calls_by_replica": dict(replicas),
        "turns_detail": per_turn,
    }


def run(args: argparse.Namespace, n_replicas: int, tmp: Path) -> dict[str, Any]:
    convs = _load_set(ROOT / "replays" / "conversations.jsonl")
    if args.conversations:
        convs = dict(list(convs.items())[: args.conversations])
    started: dict[str, list[local_replicas.Replica]] = {}
    serves: dict[str, Serve] = {}
    loads: list[float] = []
    client_ttft: dict[str, list[float]] = defaultdict(list)
    try:
        for policy in POLICIES:
            started[policy] = local_replicas.start(n_replicas, slots=args.slots,
                                                   threads=args.threads)  # fmt: skip
        for policy in POLICIES:
            cfg = tmp / f"{policy}-{n_replicas}.toml"
            _config(cfg, [x.base_url for x in started[policy]], policy, args)
            serves[policy] = Serve(cfg, str(tmp / f"{policy}-{n_replicas}.db"), args.workers,
                                   tmp / "catalog.db")  # fmt: skip
        t0 = time.time()
        with httpx.Client(timeout=httpx.Timeout(300.0, connect=30.0)) as client:
            k = 0
            for rnd in range(args.rounds):
                for cid, turns in convs.items():
                    order = POLICIES[k % 3:] + POLICIES[: k % 3]
                    k += 1
                    loads.append(os.getloadavg()[0])
                    for policy in order:
                        for t in turns:
                            got = _turn(client, serves[policy].url, t["message"],
                                        f"{cid}-{policy}-r{rnd}")  # fmt: skip
                            if got["client_ttft_ms"] is not None:
                                client_ttft[policy].append(got["client_ttft_ms"])
        wall_s = time.time() - t0
    finally:
        codes = {p: s.stop() for p, s in serves.items()}
        for reps in started.values():
            local_replicas.stop(reps)
    out: dict[str, Any] = {
        "replicas": n_replicas,
        "wall_s": r(wall_s),
        "load_1m_per_conversation": {"min": r(min(loads), 2), "max": r(max(loads), 2)},
        "serve_exit_codes": codes,
        "policies": {},
    }
    for policy in POLICIES:
        res = analyse(tmp / f"{policy}-{n_replicas}.db")
        res["client_answer_ttft_ms"] = _p50(client_ttft[policy])
        moved = [ln for ln in serves[policy].lines if "moved from replica" in ln]
        res["moves_logged"] = len(moved)
        out["policies"][policy] = res
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replicas", default="2", help="R values, comma-separated (default 2)")
    p.add_argument("--workers", type=int, default=2, help="serve worker processes (2)")
    p.add_argument("--slots", type=int, default=4, help="slots (-np) per replica (4)")
    p.add_argument("--threads", type=int, default=None, help="-t per replica (default: its own)")
    p.add_argument("--rounds", type=int, default=1, help="passes over the set (1)")
    p.add_argument("--conversations", type=int, default=0,
                   help="only the set's first N conversations (0: all; a smoke test)")
    p.add_argument("--hedge-delay-ms", type=float, default=600.0,
                   help="compose's fixed hedge delay in ms (600)")  # fmt: skip
    add_common_options(p)
    args = p.parse_args(argv)
    doc = new_document("replicas", argv, {
        "replicas": args.replicas, "workers": args.workers, "slots": args.slots,
        "threads": args.threads, "rounds": args.rounds, "conversations": args.conversations,
        "hedge_delay_ms": args.hedge_delay_ms,
    })  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="chainrun-replicas-") as d:
        for n in (int(x) for x in args.replicas.split(",")):
            doc["results"][f"R{n}"] = run(args, n, Path(d))
    finish(doc, as_json=args.json, summary=_summary, out=args.out)


def _summary(doc: dict[str, Any]) -> str:
    lines = []
    for key, res in doc["results"].items():
        lines.append(f"{key}: {res['wall_s']} s, load {res['load_1m_per_conversation']}")
        for policy, x in res["policies"].items():
            h = x["hedge_copies_by_target"]
            lines.append(
                f"  {policy:<12} turns {x['turns']} not ok {x['not_ok']}; turns>=2 cached "
                f"{x['later_cached_share']}, TTFT p50 {x['later_answer_ttft_ms']['p50']} vs "
                f"turn 1 {x['turn_1_answer_ttft_ms']['p50']} (ratio "
                f"{x['ttft_ratio_later_to_first']}); copies warm {h['warm']['won']}/"
                f"{h['warm']['sent']} cold {h['cold']['won']}/{h['cold']['sent']}; "
                f"moves {x['moves_logged']}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
