"""Per-run summaries read back from the log: latency per turn and step, and hedging economics.

Every percentile is reported with its n (FIELD.md: with 12 values a "p90" is in
effect the second-slowest value). All times in ms.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from chainrun.stats import percentile
from chainrun.store import Store

#: outcomes of attempts that were really sent to a server
SENT_OUTCOMES = ("not_fired", "primary", "duplicate", "cancelled", "shadow_finished",
                 "rejected", "error")  # fmt: skip
WINNER_OUTCOMES = ("not_fired", "primary", "duplicate")


def _pct(values: list[float], p: float) -> float | None:
    return round(percentile(values, p), 1) if values else None


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def latency_summary(store: Store, run_id: int) -> dict[str, Any]:
    """p50/p90 with n per turn and per step, plus TTFT and tokens per LLM step.

    Returns ``{run_id, kind, label, status, n_turns, turn: {n, p50_ms, p90_ms},
    steps: {NAME: {n, p50_ms, p90_ms, model, reasoning_effort, ttft_p50_ms,
    output_tokens_mean, n_failed}}}``.

    Raises:
        UserInputError: no such run.
    """
    run = store.get_run(run_id)
    turns = store.turns(run_id)
    durations = [t["duration_ms"] for t in turns if t["duration_ms"] is not None]
    by_step: dict[str, list[float]] = defaultdict(list)
    failed: dict[str, int] = defaultdict(int)
    for s in store.steps(run_id):
        if s["status"] == "skipped":
            continue
        by_step[s["step"]].append(s["duration_ms"])
        if s["status"] != "ok":
            failed[s["step"]] += 1
    ttft: dict[str, list[float]] = defaultdict(list)
    tokens: dict[str, list[float]] = defaultdict(list)
    meta: dict[str, tuple[str | None, str | None]] = {}
    for c in store.calls(run_id):
        meta.setdefault(c["step"], (c["model"], c["reasoning_effort"]))
        if c["outcome"] not in WINNER_OUTCOMES:
            continue
        if c["ttft_ms"] is not None:
            ttft[c["step"]].append(c["ttft_ms"])
        if c["output_tokens"] is not None:
            tokens[c["step"]].append(c["output_tokens"])
    steps = {}
    for name, values in by_step.items():
        model, effort = meta.get(name, (None, None))
        steps[name] = {
            "n": len(values),
            "p50_ms": _pct(values, 50),
            "p90_ms": _pct(values, 90),
            "model": model,
            "reasoning_effort": effort,
            "ttft_p50_ms": _pct(ttft[name], 50),
            "output_tokens_mean": _mean(tokens[name]),
            "n_failed": failed[name],
        }
    return {
        "run_id": run_id,
        "kind": run["kind"],
        "label": run["label"],
        "status": run["status"],
        "n_turns": len(turns),
        "turn": {"n": len(durations), "p50_ms": _pct(durations, 50), "p90_ms": _pct(durations, 90)},
        "steps": steps,
    }


def hedge_stats(store: Store, run_id: int) -> dict[str, Any]:
    """Whether hedging pays, per step of a run.

    Per step: ``n`` (step executions), ``n_armed`` (executions with a hedge delay in
    force), ``fire_rate`` (share of armed executions whose primary was still running
    at the delay d), ``win_rate`` (share of fires a copy won), ``time_saved_per_win_ms``
    (mean over wins whose loser was shadow-measured; ``n_saved_measured`` says how
    many), ``extra_calls_per_turn`` (attempts sent beyond one per step, per turn),
    ``budget_exhausted`` (copies refused by the load budget), ``mean_delay_ms``.
    Rates are None where their denominator is 0. Source of the three numbers:
    Dean & Barroso, "The Tail at Scale" (CACM 2013); Finagle's backup-request counters.

    Raises:
        UserInputError: no such run.
    """
    store.get_run(run_id)
    n_turns = len(store.turns(run_id))
    agg: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"n": 0, "n_armed": 0, "fired": 0, "won": 0, "saved": [], "delays": []}
    )
    for s in store.steps(run_id):
        if s["kind"] != "llm" or s["status"] == "skipped":
            continue
        a = agg[s["step"]]
        a["n"] += 1
        if s["hedge_delay_ms"] is not None:
            a["n_armed"] += 1
            a["delays"].append(s["hedge_delay_ms"])
        fired = bool(s["hedge_fired"])
        a["fired"] += fired
        # a win is a copy settling first *after the delay fired*; a copy started at once
        # after a non-fatal error is a retry, not a hedge win (keeps win rate <= 1)
        won = fired and bool(s["hedge_won"])
        a["won"] += won
        if won and s["time_saved_ms"] is not None:
            a["saved"].append(s["time_saved_ms"])
    sent: dict[str, int] = defaultdict(int)
    refused: dict[str, int] = defaultdict(int)
    for c in store.calls(run_id):
        if c["outcome"] in SENT_OUTCOMES:
            sent[c["step"]] += 1
        elif c["outcome"] == "budget_exhausted":
            refused[c["step"]] += 1
    steps = {}
    for name, a in agg.items():
        steps[name] = {
            "n": a["n"],
            "n_armed": a["n_armed"],
            "n_fired": a["fired"],
            "n_won": a["won"],
            "fire_rate": round(a["fired"] / a["n_armed"], 4) if a["n_armed"] else None,
            "win_rate": round(a["won"] / a["fired"], 4) if a["fired"] else None,
            "time_saved_per_win_ms": _mean(a["saved"]),
            "n_saved_measured": len(a["saved"]),
            "extra_calls_per_turn": round((sent[name] - a["n"]) / n_turns, 4) if n_turns else None,
            "budget_exhausted": refused[name],
            "mean_delay_ms": _mean(a["delays"]),
        }
    return {"run_id": run_id, "n_turns": n_turns, "steps": steps}


def run_detail(store: Store, run_id: int) -> dict[str, Any]:
    """A run with its turns and, per turn, its steps and calls (for ``chainrun show``).

    Raises:
        UserInputError: no such run.
    """
    run = dict(store.get_run(run_id))
    run["config"] = json.loads(run["config"]) if run.get("config") else None
    run["meta"] = json.loads(run["meta"]) if run.get("meta") else {}
    steps_by_turn: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in store.steps(run_id):
        s = dict(s)
        s["detail"] = json.loads(s["detail"]) if s.get("detail") else None
        steps_by_turn[s["turn_id"]].append(s)
    calls_by_turn: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for c in store.calls(run_id):
        c = dict(c)
        c["chunk_gaps_ms"] = json.loads(c["chunk_gaps_ms"]) if c.get("chunk_gaps_ms") else []
        c["server_timings"] = json.loads(c["server_timings"]) if c.get("server_timings") else None
        calls_by_turn[c["turn_id"]].append(c)
    turns = []
    for t in store.turns(run_id):
        t = dict(t)
        t["verdicts"] = json.loads(t["verdicts"]) if t.get("verdicts") else {}
        t["steps"] = steps_by_turn[t["id"]]
        t["calls"] = calls_by_turn[t["id"]]
        turns.append(t)
    run["turns"] = turns
    return run
