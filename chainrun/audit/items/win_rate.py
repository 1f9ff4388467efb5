"""Audit item 4: win rate.

See :mod:`chainrun.audit.items` for what every item returns."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from chainrun.analysis.summary import SENT_OUTCOMES, hedge_cost
from chainrun.audit.items.common import (
    MIN_FIRES,
    MIN_WIN_RATE,
    REASON_WORDS,
    median_or_none,
    ms_text,
    pct_text,
    round_or_none,
    rounded,
    share_of,
    step_config,
)
from chainrun.audit.items.hedge_delay import hedged_steps
from chainrun.audit.plots import (
    RatePlot,
    RatePoint,
)
from chainrun.audit.report import Item, Table, Verdict, worst
from chainrun.audit.scope import Sample, Scope
from chainrun.hedging.advisor import logged_changes
from chainrun.hedging.stats import UNSENT_REASONS, copies_sent_per_call, unsent_reason
from chainrun.hedging.stats import fire_rate as hedge_fire_rate
from chainrun.hedging.stats import win_rate as hedge_win_rate
from chainrun.log.rows import HedgeRound, StepRow, TurnRow, round_winners
from chainrun.pricing import PriceBook, hedge_cost_text, price_book

TITLE_4 = "Win rate rechecked after every serving-path change"

WN_EXPLANATION = (
    "A call's time is W + N: W the work the request carries (mostly generated tokens, the "
    "same for both copies) and N serving noise, drawn per copy. The primary answers at "
    "W + N1 and a copy sent at d at d + W + N2, so the copy wins only when N1 − N2 > d "
    '(Dean and Barroso, "The Tail at Scale", 2013): W cancels out.'
)


def _period(sample: Sample, step: StepRow, turns: Mapping[int | None, TurnRow]) -> str:
    if not sample.is_live:
        return f"run {step.run_id}"
    t = turns.get(step.turn_id)
    return ((t.started_at if t else None) or "")[:10] or "unknown day"


def _serving_path(config: Mapping[str, Any] | None, step: str) -> str:
    sc = step_config(config, step)
    providers = (config or {}).get("providers") or {}
    targets = [sc.get("provider"), *((sc.get("hedge") or {}).get("targets") or [])]
    urls = [str((providers.get(t) or {}).get("base_url") or t) for t in targets if t]
    return f"{sc.get('model')} @ {', '.join(dict.fromkeys(urls))}"


def _controller_text(name: str, changes: list[dict[str, Any]], probes: int) -> str | None:
    """What the step's hedge controller did and when (back-off, resume, advised delays),
    in one sentence; None when it changed nothing."""
    if not changes:
        return None
    acts = [c for c in changes if c["kind"] in ("backed_off", "resumed")]
    advised = [c for c in changes if c["kind"] == "advised"]
    parts = [f"{c['at']}: {c['kind'].replace('_', ' ')} ({c['why']})" for c in acts]
    if advised:
        last = advised[-1]
        parts.append(
            f"its delay was advised {len(advised)} times (delay = \"auto\"), last at "
            f"{last['at']}: {last['old']} -> {last['new']}"
        )
    now = "backed off: only probe calls are hedged" if acts and acts[-1]["kind"] == (
        "backed_off"
    ) else None
    tail = f" Now {now} ({probes} probe calls so far)." if now else ""
    return f"{name}: the step's hedge controller acted on its own. " + "; ".join(parts) + "." + tail


def check_win_rate(scope: Scope) -> Item:
    """Item 4: per hedged step fire rate, win rate, time saved per win (shadow losers),
    over time; the W + N diagnosis; fails a win rate under 5% over at least 30 fires;
    says what the step's hedge controller did and when (advised delays, a back-off when
    copies stopped winning, a resume: :mod:`chainrun.hedging.advisor`)."""
    names = hedged_steps(scope)
    if not names:
        return Item(
            4,
            TITLE_4,
            "not_enough_data",
            "No audited step is hedged, so there is no win rate to check.",
            {"hedged_steps": []},
            missing=[
                "a hedged run (see item 3) with enough turns for 30 fires: "
                "about 600 turns at a p95 delay"
            ],
        )
    headlines: list[str] = []
    rows: list[list[Any]] = []
    notes: list[str] = []
    verdicts: list[Verdict] = []
    figs: dict[str, Any] = {}
    missing: list[str] = []
    series: dict[str, list[RatePoint]] = {}
    for name in names:
        # each round of a call with tools is a race of its own: counted as a call
        armed: list[tuple[Sample, StepRow, HedgeRound]] = [
            (sm, s, r)
            for sm in scope.samples
            for s in sm.done_steps
            if s.step == name and s.hedge_delay_ms is not None and s.status != "skipped"
            for r in s.hedge_rounds()
        ]
        fired = [(sm, s, r) for sm, s, r in armed if r.fired]
        won = [(sm, s, r) for sm, s, r in fired if r.won]
        saved = [r.time_saved_ms for _, _, r in won if r.time_saved_ms is not None]
        copy_rows = [c for c in scope.done_calls if c.step == name and c.attempt > 1]
        sent_turns = Counter(
            (c.turn_id, c.round) for c in copy_rows if c.outcome in SENT_OUTCOMES
        )
        copies = sum(sent_turns.values())
        # a due copy refused or held back never ran: its fire cannot win (not a W + N loss)
        unsent = dict.fromkeys(UNSENT_REASONS, 0)
        for c in copy_rows:
            if (reason := unsent_reason(c.outcome, c.error_type)) is not None:
                unsent[reason] += 1
        fired_unsent = sum(1 for _, s, r in fired if not sent_turns[(s.turn_id, r.round)])
        n_turns = len({s.turn_id for s in scope.done_steps if s.step == name})
        # the definitions of chainrun.hedging.stats (fires per armed call, wins per fire)
        fire_rate = rounded(hedge_fire_rate(len(fired), len(armed)))
        win_rate = rounded(hedge_win_rate(len(won), len(fired)))
        # W + N: do fires land on long answers (work) or on slow servers (noise)?
        winners = round_winners(scope.done_calls)
        tokens_all = [
            winners[(s.turn_id or 0, name, r.round)].output_tokens
            for _, s, r in armed
            if (s.turn_id or 0, name, r.round) in winners
        ]
        tok_all = [float(t) for t in tokens_all if t is not None]
        tok_fired = [
            float(t)
            for t in (
                winners[(s.turn_id or 0, name, r.round)].output_tokens
                for _, s, r in fired
                if (s.turn_id or 0, name, r.round) in winners
            )
            if t is not None
        ]
        med_all = median_or_none(tok_all)
        above = sum(t > med_all for t in tok_fired) if med_all is not None else 0
        share_long = share_of(above, len(tok_fired))
        diagnosis = None
        if share_long is not None and len(tok_fired) >= 5:
            diagnosis = "work" if share_long >= 0.75 else "noise" if share_long <= 0.6 else "mixed"
        # over time: per run (replays) or per day (live)
        turns_by_id = {t.id: t for sm in scope.samples for t in sm.turns}
        periods: dict[str, list[HedgeRound]] = defaultdict(list)
        for sm, s, r in armed:
            periods[_period(sm, s, turns_by_id)].append(r)
        points = []
        for label, ss in periods.items():
            f = [r for r in ss if r.fired]
            w = [r for r in f if r.won]
            points.append(
                RatePoint(
                    label,
                    len(ss),
                    rounded(hedge_fire_rate(len(f), len(ss))),
                    len(f),
                    rounded(hedge_win_rate(len(w), len(f))),
                )
            )
        series[name] = points
        # serving path changes between audited runs
        paths: dict[str, list[int]] = defaultdict(list)
        for run in sorted(scope.runs, key=lambda r: r.id):
            if step_config(run.config, name):
                paths[_serving_path(run.config, name)].append(run.id)
        latest_path_runs = set(list(paths.values())[-1]) if paths else set()
        fires_since = sum(1 for _, s, _ in fired if s.run_id in latest_path_runs)
        extra_per_1000 = round_or_none(copies / n_turns * 1000, 0) if n_turns else None
        # what the copies cost (at each run's prices) against the time the wins saved
        books: dict[int | None, PriceBook] = {r.id: price_book(r.config) for r in scope.runs}
        sent_rows = [c for c in copy_rows if c.outcome in SENT_OUTCOMES]
        cost = hedge_cost([books.get(c.run_id, PriceBook()).cost(c) for c in sent_rows], saved)
        v: Verdict
        unsent_text = ", ".join(f"{REASON_WORDS[k]} {n}" for k, n in unsent.items() if n)
        if (
            len(fired) >= MIN_FIRES
            and win_rate is not None
            and win_rate < MIN_WIN_RATE
            and fired_unsent * 2 >= len(fired)
        ):
            v = "fail"
            head = (
                f"{name}: copies won {len(won)} of {len(fired)} fires ({pct_text(win_rate)}, under "
                f"{MIN_WIN_RATE:.0%}), but {fired_unsent} of those fires sent no copy "
                f"({unsent_text}): the copies never ran, so the win rate says nothing of "
                "hedging itself."
            )
            headlines.append(head)
            notes.append(
                f"{head} Make the copy target reachable (an open breaker means its calls "
                "failed) or the load budget larger, then re-measure; the fire rate counts "
                "the hedge timer going off, copies sent per call what went out."
            )
        elif len(fired) >= MIN_FIRES and win_rate is not None and win_rate < MIN_WIN_RATE:
            v = "fail"
            cause = (
                f" The fired calls generated {statistics.median(tok_fired):.0f} tokens at the "
                f"median against {med_all:.0f} for the step ({pct_text(share_long)} of fires "
                "above the step's median): the delay catches long answers (work, which "
                "both copies carry), not slow servers (noise)."
                if diagnosis == "work" and med_all is not None
                else ""
            )
            head = (
                f"{name}: copies won {len(won)} of {len(fired)} fires ({pct_text(win_rate)}, under "
                f"{MIN_WIN_RATE:.0%}) and cost {extra_per_1000:.0f} extra calls per 1,000 turns."
            )
            headlines.append(
                head + (cause.split(":")[0].replace(" The fired", " Fired") + "." if cause else "")
            )
            notes.append(
                f"{head} {WN_EXPLANATION}{cause} Raise the delay, hedge fewer steps, or switch "
                "hedging off for this step and re-measure."
            )
        elif len(fired) < MIN_FIRES:
            v = "not_enough_data"
            more = math.ceil((MIN_FIRES - len(fired)) / fire_rate) if fire_rate else None
            notes.append(
                f"{name}: {len(fired)} fires over {len(armed)} armed calls; a win rate "
                f"needs at least {MIN_FIRES} fires"
                + (f" (about {more} more armed calls at this fire rate)." if more else ".")
            )
            missing.append(f"{name}: {MIN_FIRES - len(fired)} more hedge fires")
        elif len(paths) > 1 and fires_since < MIN_FIRES:
            v = "warn"
            notes.append(
                f"{name}: the serving path changed (now {list(paths)[-1]}) and only "
                f"{fires_since} fires were logged since: the win rate "
                f"({pct_text(win_rate)}) is not rechecked."
            )
        else:
            v = "pass"
            notes.append(
                f"{name}: copies won {len(won)} of {len(fired)} fires "
                f"({pct_text(win_rate)}), saving {ms_text(median_or_none(saved))} per measured win "
                f"(median, n = {len(saved)})."
            )
        if len(headlines) < len(notes):
            headlines.append(notes[-1])
        cost_said = hedge_cost_text(name, cost, len(saved))
        if cost_said is not None:
            notes.append(cost_said + ".")
        step_rows = [s for sm in scope.samples for s in sm.steps if s.step == name]
        changes = logged_changes(s.detail for s in step_rows if s.detail)
        probes = sum(1 for s in step_rows if (s.detail or {}).get("hedge_probe"))
        acted = _controller_text(name, changes, probes)
        if acted is not None:
            notes.append(acted)
            backed = [c for c in changes if c["kind"] == "backed_off"]
            if backed:
                headlines[-1] += f" The step backed off on its own at {backed[-1]['at']}."
        verdicts.append(v)
        figs[name] = {
            "n_armed": len(armed),
            "n_fired": len(fired),
            "n_won": len(won),
            "fire_rate": fire_rate,
            "win_rate": win_rate,
            "time_saved_per_win_ms": {
                "median": round_or_none(median_or_none(saved)),
                "mean": round_or_none(statistics.fmean(saved)) if saved else None,
                "n": len(saved),
            },
            "copies_sent": copies,
            "copies_sent_per_call": rounded(copies_sent_per_call(copies, len(armed))),
            "n_fired_no_copy_sent": fired_unsent,
            "unsent": unsent,
            "n_turns": n_turns,
            "extra_calls_per_1000_turns": extra_per_1000,
            "output_tokens": {
                "median_all": round_or_none(med_all),
                "n_all": len(tok_all),
                "median_fired": round_or_none(median_or_none(tok_fired)),
                "n_fired": len(tok_fired),
                "share_fired_above_median": share_long,
            },
            "diagnosis": diagnosis,
            "cost": cost,
            "over_time": [vars(p) for p in points],
            "serving_paths": {k: v for k, v in paths.items()},
            "controller": {"changes": changes, "n_probe_calls": probes},
            "verdict": v,
        }
        rows.append(
            [
                name,
                len(armed),
                pct_text(fire_rate),
                f"{len(fired)} ({fired_unsent} sent no copy)" if fired_unsent else len(fired),
                pct_text(win_rate),
                f"{ms_text(median_or_none(saved))} (n={len(saved)})",
                extra_per_1000,
                f"{median_or_none(tok_fired) or 0:.0f} vs {med_all or 0:.0f}",
                diagnosis or "–",
                v,
            ]
        )
    verdict = worst(verdicts)
    evidence = " ".join(headlines[:3]) + (
        f" ({len(headlines) - 3} more steps in the notes.)" if len(headlines) > 3 else ""
    )
    table = Table(
        "Hedging per step (fire rate per armed call, win rate per fire)",
        [
            "step",
            "n armed",
            "fire rate",
            "n fired",
            "win rate",
            "saved per win",
            "extra calls / 1,000 turns",
            "tokens fired vs median",
            "W + N diagnosis",
            "verdict",
        ],
        rows,
    )
    return Item(
        4,
        TITLE_4,
        verdict,
        evidence,
        {"steps": figs, "explanation": WN_EXPLANATION},
        notes,
        missing,
        [table],
        [RatePlot("Hedge fire and win rate over time", series)],
    )
