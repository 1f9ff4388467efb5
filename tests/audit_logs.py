"""Small synthetic run logs for the audit tests (no model): builders of turns, steps and
calls written through the real Store."""

from __future__ import annotations

import json
from typing import Any

from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow
from chainrun.log.store import Store


def add_run(
    store: Store,
    kind: str,
    turns: list[TurnLog],
    *,
    config: dict[str, Any] | None = None,
    source: str | None = None,
    label: str | None = None,
) -> int:
    """A finished run of ``kind`` holding ``turns``; returns its id."""
    rid = store.create_run(kind, json.dumps(config or {}), label=label, source=source)  # type: ignore[arg-type]
    for t in turns:
        store.log_turn(rid, t)
    store.finish_run(rid, "complete")
    return rid


def llm(
    step: str,
    ttft: float | None = 50.0,
    dur: float | None = 200.0,
    tokens: int | None = 20,
    **kw: Any,
) -> CallRow:
    """One finished, unhedged LLM call."""
    kw.setdefault("output", "an answer")
    kw.setdefault("n_chunks", 5)
    kw.setdefault("chunk_gaps_ms", [10.0, 12.0, 11.0, 9.0])
    kw.setdefault("provider", "local")
    return CallRow(step=step, ttft_ms=ttft, duration_ms=dur, output_tokens=tokens, **kw)


def turn(
    calls: list[CallRow],
    *,
    message: str = "a rain jacket?",
    answer: str = "Try the Storm Shell.",
    steps: list[StepRow] | None = None,
    extra_steps: list[StepRow] | None = None,
    started_at: str | None = None,
    request_id: str | None = None,
) -> TurnLog:
    """A turn whose steps follow one another, one step per distinct call step (its
    duration the winning call's), unless ``steps`` is given."""
    if steps is None:
        steps, offset = [], 0.0
        for name in dict.fromkeys(c.step for c in calls):
            mine = [c for c in calls if c.step == name]
            ms = max(((c.started_offset_ms or 0.0) + (c.duration_ms or 0.0)) for c in mine)
            steps.append(
                StepRow(step=name, started_offset_ms=offset, duration_ms=ms, n_attempts=len(mine))
            )
            offset += ms
    steps = steps + (extra_steps or [])
    total = sum(s.duration_ms for s in steps)
    return TurnLog(
        TurnRow(input=message, output=answer, duration_ms=total, started_at=started_at,
                request_id=request_id),
        steps=steps,
        calls=calls,
    )  # fmt: skip


def hedged(
    step: str,
    *,
    delay: float | None,
    settle: float,
    fired: bool = False,
    won: bool = False,
    tokens: int = 20,
    saved: float | None = None,
    provider: str = "local",
) -> tuple[StepRow, list[CallRow]]:
    """A hedged step execution (non-streamed: settle time = duration)."""
    if not fired:
        calls = [llm(step, 20.0, settle, tokens, outcome="not_fired", provider=provider)]
        ms = settle
    else:
        assert delay is not None
        copy_ms = settle * 0.5
        first = llm(
            step,
            20.0,
            settle if not won else None,
            tokens if not won else None,
            outcome="primary" if not won else "cancelled",
            provider=provider,
        )
        second = llm(
            step,
            20.0,
            copy_ms if won else None,
            tokens if won else None,
            attempt=2,
            started_offset_ms=delay,
            outcome="duplicate" if won else "cancelled",
            provider=provider,
        )
        calls = [first, second]
        ms = delay + copy_ms if won else settle
    rec = StepRow(
        step=step,
        duration_ms=ms,
        n_attempts=len(calls),
        hedge_delay_ms=delay,
        hedge_fired=fired,
        hedge_won=won,
        time_saved_ms=saved if won else None,
    )
    return rec, calls


def hedged_turn(step: str, **kw: Any) -> TurnLog:
    rec, calls = hedged(step, **kw)
    return turn(calls, steps=[rec])


def hedge_config(step: str = "guard", delay: str = "p95", base_url: str = "http://a/v1") -> dict:
    return {
        "providers": {"lab": {"base_url": base_url}},
        "steps": {
            step: {"kind": "llm", "provider": "lab", "model": "m", "hedge": {"delay": delay}}
        },
    }


def retrieve_step(
    stopped_after: str | None, searches: list[tuple[str, float, list[str]]], results: list[str]
) -> StepRow:
    detail = {
        "query": "q",
        "filters": {},
        "results": [{"id": i} for i in results],
        "searches": [
            {
                "name": n,
                "ms": ms,
                "n": len(ids),
                "new": len(ids),
                "error": None,
                "hedged": None,
                "ids": ids,
            }
            for n, ms, ids in searches
        ],
        "stopped_after": stopped_after,
        "ms": sum(ms for _, ms, _ in searches),
    }
    return StepRow(
        step="retrieve",
        kind="retrieve",
        duration_ms=detail["ms"],
        output=json.dumps(results),
        detail=detail,
    )


def add_eval_results(store: Store, run_id: int, rows: list[dict[str, Any]]) -> None:
    """Verdict rows (case_id, type, passed, turn_id, optional step/repeat) for ``run_id``."""
    store.db.table("eval_results").insert_all(
        [
            {
                "run_id": run_id,
                "repeat": 0,
                "step": None,
                "detail": "",
                "grader": None,
                "scored_at": "2026-01-01T00:00:00",
                **r,
            }
            for r in rows
        ]
    )
