"""Audit item 6: retrieval.

See :mod:`chainrun.audit.items` for what every item returns."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from chainrun.audit.items.common import (
    MAX_RECALL_COST,
    REPLAY_CMD,
    pct_text,
    round_or_none,
    share_of,
    step_config,
)
from chainrun.audit.report import Item, Table, Verdict, worst
from chainrun.audit.scope import Scope
from chainrun.statistics.intervals import (
    summarize,
)

TITLE_6 = (
    "Retrieval stops when it has enough, with the search order and the threshold covered by tests"
)


def _retrieval_settings(config: Mapping[str, Any] | None, step: str) -> dict[str, Any]:
    from chainrun.retrieval.settings import RetrievalSettings

    given = step_config(config, step).get("retrieval") or {}
    try:
        return RetrievalSettings.model_validate(given).model_dump()
    except ValueError:
        return RetrievalSettings().model_dump()


def _simulated_early(detail: Mapping[str, Any], min_results: int, k: int) -> list[str]:
    """The ids the stage would have returned had it stopped at ``min_results`` (from the
    logged per-search ids of a turn where every search ran)."""
    found: list[str] = []
    for search in detail.get("searches") or []:
        for i in search.get("ids") or []:
            if i not in found:
                found.append(i)
        if len(found) >= min_results:
            break
    return found[:k]


def _recall(retrieved: Sequence[str], expected: Sequence[str], k: int) -> float:
    # the R-capped recall@k of chainrun.retrieval.evaluate.recall_at_k
    from chainrun.retrieval.evaluate import recall_at_k

    return recall_at_k(list(retrieved), list(expected), k)


def check_retrieval(scope: Scope) -> Item:
    """Item 6: early-exit rate, which search answered, per-search latency; eval cases
    that would notice a change of order or ``min_results``; recall cost of stopping early
    on labelled queries when the log holds turns where every search ran."""
    retr = [
        s
        for s in scope.done_steps
        if s.status != "skipped" and "searches" in (s.detail or {})
    ]
    if not retr:
        return Item(
            6,
            TITLE_6,
            "not_enough_data",
            "No retrieve step with logged searches in scope.",
            {},
            missing=[f"a run whose chain has a retrieve step: `{REPLAY_CMD}`"],
        )
    name = retr[0].step
    settings = _retrieval_settings(scope.current_config(), name)
    stopped = Counter(
        str(s.detail.get("stopped_after") or "every search ran")
        for s in retr
        if s.detail is not None
    )
    early = sum(n for k, n in stopped.items() if k != "every search ran")
    per_search: dict[str, list[float]] = defaultdict(list)
    for s in retr:
        for search in (s.detail or {}).get("searches") or []:
            if search.get("ms") is not None:
                per_search[str(search.get("name"))].append(float(search["ms"]))
    # coverage by the eval set: catalog-ids verdicts on turns whose retrieval stopped early
    eval_steps = {
        (s.turn_id): s
        for e in scope.evals
        for s in e.steps
        if "searches" in (s.detail or {})
    }
    covered: dict[str, str] = {}
    for r in scope.results:
        st = eval_steps.get(r.turn_id)
        if r.type == "catalog-ids" and st is not None and st.detail:
            stop = st.detail.get("stopped_after")
            if stop:
                covered[r.case_id] = str(stop)
    threshold_covered = bool(covered)
    order_covered = len(set(covered.values())) >= 2
    # recall cost of stopping early, from turns where every search ran
    k, min_results = int(settings["k"]), int(settings["min_results"])
    turns = {t.id: t for t in scope.turns + [t for e in scope.evals for t in e.turns]}
    costs: list[float] = []
    for s in retr + list(eval_steps.values()):
        d = s.detail or {}
        t = turns.get(s.turn_id)
        if t is None or d.get("stopped_after") or len(d.get("searches") or []) < 2:
            continue
        expected = scope.queries.get(t.input.strip().lower())
        if not expected:
            continue
        full = [str(x.get("id")) for x in d.get("results") or []][:k]
        costs.append(
            _recall(full, expected, k) - _recall(_simulated_early(d, min_results, k), expected, k)
        )
    cost = statistics.fmean(costs) if costs else None
    figures = {
        "step": name,
        "n": len(retr),
        "early_exit_rate": share_of(early, len(retr)),
        "n_stopped_early": early,
        "stopped_after": dict(stopped),
        "settings": {
            "searches": settings["searches"],
            "min_results": min_results,
            "k": k,
            "early_exit": settings["early_exit"],
        },
        "search_ms": {n: summarize(v) for n, v in per_search.items()},
        "eval_cases_covering_early_exit": covered,
        "threshold_covered": threshold_covered,
        "order_covered": order_covered,
        "recall_cost": {"mean": round_or_none(cost, 4), "n": len(costs), "k": k},
    }
    notes: list[str] = []
    missing: list[str] = []
    verdicts: list[Verdict] = []
    if cost is not None and cost >= MAX_RECALL_COST:
        verdicts.append("fail")
        notes.append(
            f"Stopping at {min_results} results loses {cost:.2f} recall@{k} on "
            f"{len(costs)} labelled queries: raise min_results or reorder."
        )
    if not early:
        verdicts.append("warn")
        notes.append(
            f"The stage never stopped early in {len(retr)} executions "
            f"(early_exit = {settings['early_exit']}): every search ran every time."
        )
    if not threshold_covered:
        verdicts.append("warn")
        missing.append(
            "an eval case with a catalog-ids assertion whose retrieval stops early "
            "(`chainrun eval evals/regression.jsonl`): without it a change of "
            "min_results passes the tests unnoticed"
        )
    elif not order_covered:
        verdicts.append("warn")
        missing.append(
            "eval cases with catalog-ids assertions that stop at different searches: "
            f"all covered cases stop after {next(iter(covered.values()))}, so a "
            "change of the search order goes unnoticed"
        )
    if cost is None:
        missing.append(
            "recall cost of stopping early: a run with [steps.retrieve.retrieval] "
            "early_exit = false over the labelled queries "
            "(evals/retrieval_queries.jsonl), or benchmarks/retrieval_early_exit.py"
        )
    verdict = worst(verdicts, empty="pass")
    evidence = (
        f"The {name} step stopped early in {early} of {len(retr)} executions "
        f"({pct_text(share_of(early, len(retr)))}), after: "
        + ", ".join(f"{k2} {n}" for k2, n in stopped.most_common())
        + ". "
        + (
            f"{len(covered)} eval case(s) with catalog-ids assertions stop early"
            + (" at different searches." if order_covered else ".")
            if covered
            else "No eval case checks the products of a turn that stops early."
        )
    )
    if cost is not None:
        evidence += f" Recall@{k} cost of stopping early: {cost:.3f} (n = {len(costs)})."
    rows = [
        [
            n,
            *(summarize(v)[key] for key in ("n", "p50_ms", "p90_ms")),
            sum(
                1
                for s in retr
                for x in (s.detail or {}).get("searches") or []
                if x.get("name") == n and x.get("error")
            ),
        ]
        for n, v in per_search.items()
    ]
    tables = [
        Table(
            "Searches of the retrieve stage (ms)",
            ["search", "n", "p50 ms", "p90 ms", "errors"],
            rows,
        ),
        Table(
            "Where the stage stopped",
            ["stopped after", "n"],
            [[k2, n] for k2, n in stopped.most_common()],
        ),
    ]
    return Item(6, TITLE_6, verdict, evidence, figures, notes, missing, tables)
