"""Audit item 1: every step timed.

See :mod:`chainrun.audit.items` for what every item returns."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from chainrun.analysis.summary import cache_state, cached_text
from chainrun.audit.items.common import (
    COMPLETED_OUTCOMES,
    MIN_TIMED_SHARE,
    REPLAY_CMD,
    WATERFALL_TURNS,
    pct_text,
    round_or_none,
)
from chainrun.audit.plots import (
    Bar,
    WaterfallPlot,
)
from chainrun.audit.report import Item, Table, Verdict
from chainrun.audit.scope import Sample, Scope
from chainrun.log.rows import SENT_OUTCOMES, WINNER_OUTCOMES, CallRow

TITLE_1 = "Every step timed and its generated tokens logged before anything was changed"


def _waterfall(samples: Sequence[Sample]) -> WaterfallPlot | None:
    turns = [(s, t) for s in samples for t in s.turns if t.duration_ms is not None]
    slowest = sorted(turns, key=lambda st: st[1].duration_ms or 0.0, reverse=True)
    slowest = slowest[:WATERFALL_TURNS]
    if not slowest:
        return None
    out: dict[str, list[Bar]] = {}
    for sample, turn in slowest:
        steps = [s for s in sample.steps if s.turn_id == turn.id and s.status != "skipped"]
        calls = [c for c in sample.calls if c.turn_id == turn.id]
        bars: list[Bar] = []
        for s in steps:
            start = s.started_offset_ms or 0.0
            bars.append(Bar(s.step, start, start + (s.duration_ms or 0.0)))
            attempts = [c for c in calls if c.step == s.step]
            hedged = len(attempts) > 1
            for c in sorted(attempts, key=lambda c: (c.round, c.attempt)):
                c_start = start + (c.started_offset_ms or 0.0)
                first = c.first_event_ms
                ttft = c_start + first if first is not None else None
                if not hedged:
                    bars[-1].ttft = ttft
                    continue
                role = (
                    "winner"
                    if c.outcome in WINNER_OUTCOMES
                    else "refused"
                    if c.outcome in ("budget_exhausted", "suppressed")
                    else "loser"
                )
                end = c_start + (c.duration_ms or 0.0)
                name = f"attempt {c.attempt}"
                if c.round > 1:
                    name = f"round {c.round} {name}"
                bars.append(Bar(f"  {name} ({c.outcome})", c_start, end, ttft, role))
        out[f"turn {turn.id} ({turn.duration_ms:.0f} ms)"] = bars
    return WaterfallPlot(f"The {len(out)} slowest turns, step by step", out)


def check_timed(scope: Scope) -> Item:
    """Item 1: share of LLM calls with their first event (TTFT; for a round that asked for
    tools, its first tool-call piece), duration and output tokens; steps and providers
    with missing or unknown counts; calls whose tokens came back without usage."""
    calls = [
        c
        for c in scope.calls + [c for e in scope.evals for c in e.calls]
        if c.outcome in SENT_OUTCOMES or c.outcome is None
    ]
    # a stream cut short (deadline, server) never delivers its usage: not a logging gap
    cut = [
        c for c in calls if c.outcome in COMPLETED_OUTCOMES and c.error_type is None and c.truncated
    ]
    done = [
        c
        for c in calls
        if c.outcome in COMPLETED_OUTCOMES and c.error_type is None and not c.truncated
    ]
    steps = scope.steps + [s for e in scope.evals for s in e.steps]
    untimed_steps = Counter(
        s.step for s in steps if s.duration_ms is None and s.status not in ("skipped", "cancelled")
    )
    if not done:
        return Item(
            1,
            TITLE_1,
            "not_enough_data",
            "The log holds no completed LLM call in scope, so nothing shows whether steps "
            "are timed and their tokens logged.",
            figures={"n_calls": 0},
            missing=[f"LLM calls: run `{REPLAY_CMD}` (or pass --run RUN of an existing run)"],
        )
    groups: dict[tuple[str, str], list[CallRow]] = defaultdict(list)
    for c in done:
        groups[(c.step, c.provider or c.target or "?")].append(c)
    rows, per_group = [], []
    for (step, provider), cs in sorted(groups.items()):
        g = {
            "step": step,
            "provider": provider,
            "n": len(cs),
            "missing_ttft": sum(c.first_event_ms is None for c in cs),
            "missing_duration": sum(c.duration_ms is None for c in cs),
            "unknown_output_tokens": sum(c.output_tokens is None for c in cs),
            "text_without_usage": sum(
                c.output_tokens is None and bool(c.output or c.n_chunks) for c in cs
            ),
            "zero_tokens_with_text": sum(c.output_tokens == 0 and bool(c.output) for c in cs),
            # the server's prompt cache decides TTFT: its share beside every TTFT figure
            "ttft_cached_share": cache_state(cs)["share"],
        }
        per_group.append(g)
        rows.append(
            [
                step,
                provider,
                g["n"],
                g["missing_ttft"],
                g["missing_duration"],
                g["unknown_output_tokens"],
                g["text_without_usage"],
                g["zero_tokens_with_text"],
                cached_text(cache_state(cs)),
            ]
        )
    full = sum(
        c.first_event_ms is not None and c.duration_ms is not None and c.output_tokens is not None
        for c in done
    )
    share = full / len(done)
    facts = ("step", "provider", "n", "ttft_cached_share")
    gaps = [g for g in per_group if any(g[k] for k in g if k not in facts)]
    never = [g for g in per_group if g["unknown_output_tokens"] == g["n"]]
    figures = {
        "n_calls": len(done),
        "n_fully_logged": full,
        "share_fully_logged": round(share, 4),
        "n_attempts_excluded": len(calls) - len(done),
        "n_streams_cut_short": len(cut),
        "by_step_provider": per_group,
        "untimed_steps": dict(untimed_steps),
    }
    notes = [
        f"{g['step']} on {g['provider']}: {g['unknown_output_tokens']} of {g['n']} calls "
        f"with unknown output tokens ({g['text_without_usage']} returned text but no usage), "
        f"{g['missing_ttft']} without TTFT, {g['missing_duration']} without duration"
        for g in gaps
    ]
    notes += [
        f"step {name}: {n} executions without a duration" for name, n in untimed_steps.items()
    ]
    notes += [
        f"{g['step']} on {g['provider']}: {g['zero_tokens_with_text']} calls returned "
        "text but logged 0 output tokens (unknown must be NULL, not 0)"
        for g in per_group
        if g["zero_tokens_with_text"]
    ]
    verdict: Verdict
    if share < MIN_TIMED_SHARE or never:
        verdict = "fail"
    elif gaps or untimed_steps:
        verdict = "warn"
    else:
        verdict = "pass"
    evidence = (
        f"{full} of {len(done)} completed LLM calls ({pct_text(share)}) have TTFT (or, asking "
        f"for tools, their first tool-call time), duration and "
        f"output tokens; {len(calls) - len(done)} attempts that were cancelled, failed or "
        f"cut short ({len(cut)} streams ended without a finish reason) are not counted."
    )
    if never:
        evidence += (
            " "
            + ", ".join(f"{g['step']} on {g['provider']}" for g in never)
            + (" never logged output tokens: latency there cannot be paired with work.")
        )
    elif gaps:
        evidence += f" {len(gaps)} step/provider pairs have missing or unknown counts."
    missing = []
    if any(g["text_without_usage"] for g in per_group):
        missing.append(
            "usage on streamed answers: the provider must send it (stream_options "
            "include_usage); calls that returned text without usage are listed in the notes"
        )
    wf = _waterfall(scope.samples)
    return Item(
        1,
        TITLE_1,
        verdict,
        evidence,
        figures,
        notes,
        missing,
        tables=[
            Table(
                "Completed LLM calls per step and provider",
                [
                    "step",
                    "provider",
                    "n",
                    "no TTFT",
                    "no duration",
                    "tokens unknown",
                    "text without usage",
                    "0 tokens with text",
                    "prompt cached (TTFT)",
                ],
                rows,
            ),
            _slowest_table(scope.samples),
        ],
        plots=[wf] if wf else [],
    )


def _clip(text: str | None, n: int = 140) -> str | None:
    if text is None:
        return None
    return text if len(text) <= n else text[: n - 1] + "…"


def _slowest_table(samples: Sequence[Sample]) -> Table:
    turns = sorted(
        ((s, t) for s in samples for t in s.turns if t.duration_ms is not None),
        key=lambda st: st[1].duration_ms or 0.0,
        reverse=True,
    )[:WATERFALL_TURNS]
    return Table(
        "The slowest turns (what the shopper asked and was answered)",
        ["sample", "turn", "ms", "status", "message", "answer"],
        [
            [s.name, t.id, round_or_none(t.duration_ms), t.status, _clip(t.input), _clip(t.output)]
            for s, t in turns
        ],
    )
