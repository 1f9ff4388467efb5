"""Per-run summaries read back from the log: latency per turn and step, and hedging economics.

Every percentile is reported with its n (with 12 values a "p90" is in
effect the second-slowest value). All times in ms.

**The one rule of every summary** (replay's table, ``show``, ``compare``,
``hedge-stats``, the audit): latency percentiles are over *completed* turns only
(status ``ok``) and over the steps and calls of those turns; cancelled, refused and
errored turns are counted beside them, never mixed in. A cancelled turn's partial
duration is not a latency (Ctrl-C after 104 ms says nothing about the chain), and a
refusal or an error ends the turn early on another path. :func:`completed_turns`
applies the rule; nothing else decides it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from chainrun.events import TurnFinished
from chainrun.hedging.advisor import logged_changes
from chainrun.hedging.stats import HedgeStats, extra_calls_per_turn, unsent_reason
from chainrun.log.rows import SENT_OUTCOMES, WINNER_OUTCOMES, CallRow, TurnRow
from chainrun.log.store import Store
from chainrun.pricing import (
    PriceBook,
    cost_summary,
    price_book,
    shipped_prices,
    sum_costs,
    turn_costs,
)
from chainrun.statistics.intervals import percentile, quantile_ci, wilson_interval

_R = TypeVar("_R")

#: a call counts as warm when at least this share of its prompt tokens was cached
WARM_CALL_SHARE = 0.5
#: two cached shares this far apart (absolute) can explain a TTFT difference: compare warns
CACHE_SHARE_DIFFERS = 0.2


def cache_state(calls: Iterable[CallRow]) -> dict[str, Any]:
    """The prompt cache's part in ``calls``: cached prompt tokens over all prompt tokens
    of the calls that reported both (``calls.cached_input_tokens`` over
    ``calls.input_tokens``; the first is a subset of the second, OpenAI API reference).

    Returns ``{"share", "n_calls", "n_unknown", "cached_tokens", "input_tokens"}``:
    ``share`` in [0, 1] (None when no call reported both counts), ``n_calls`` the calls
    it is over, ``n_unknown`` the calls left out (a count not reported is unknown, never
    0).
    """
    known = list(calls)
    ok = [c for c in known if c.input_tokens is not None and c.cached_input_tokens is not None]
    prompt = sum(int(c.input_tokens or 0) for c in ok)
    cached = sum(int(c.cached_input_tokens or 0) for c in ok)
    return {
        "share": round(cached / prompt, 4) if prompt else None,
        "n_calls": len(ok),
        "n_unknown": len(known) - len(ok),
        "cached_tokens": cached,
        "input_tokens": prompt,
    }


def warm_call(call: CallRow) -> bool | None:
    """Whether the server had at least half of this call's prompt cached (None: unknown)."""
    if not call.input_tokens or call.cached_input_tokens is None:
        return None
    return call.cached_input_tokens / call.input_tokens >= WARM_CALL_SHARE


def cached_text(state: Mapping[str, Any] | None) -> str:
    """``"99% cached"`` for a :func:`cache_state` (``"cache ?"`` when unknown)."""
    share = None if state is None else state.get("share")
    return "cache ?" if share is None else f"{share * 100:.0f}% cached"


def prompt_cache_mode(config_snapshot: str | None) -> str:
    """What a run asked of the servers' prompt caches, from its config snapshot: ``"off"``
    when every Chat Completions provider it names sent ``cache_prompt = false``
    (llama-server's switch; ``chainrun replay --prompt-cache off``), else ``"server"``
    (the server decides; the cached share says what it did)."""
    try:
        cfg = json.loads(config_snapshot or "")
    except ValueError:
        return "server"
    providers = cfg.get("providers") if isinstance(cfg, dict) else None
    chat = [p for p in (providers or {}).values()
            if isinstance(p, dict) and p.get("api", "chat_completions") == "chat_completions"]
    return "off" if chat and all(p.get("cache_prompt") is False for p in chat) else "server"



@dataclass(frozen=True)
class CompletedTurns:
    """Which turns a latency summary may use, and the counts shown beside it.

    ``ids``: ids of the completed turns (status ``ok``); ``n_cut``, ``n_cancelled``,
    ``n_refused``, ``n_replaced``, ``n_errored``: the other turns, by status.
    """

    ids: frozenset[int]
    n_cancelled: int = 0
    n_cut: int = 0
    n_refused: int = 0
    n_errored: int = 0
    n_replaced: int = 0

    @property
    def n_completed(self) -> int:
        return len(self.ids)

    def counts(self) -> dict[str, int]:
        """``{"n_completed", "n_cut", "n_cancelled", "n_refused", "n_replaced",
        "n_errored"}`` (turns)."""
        return {"n_completed": self.n_completed, "n_cut": self.n_cut,
                "n_cancelled": self.n_cancelled,
                "n_refused": self.n_refused, "n_replaced": self.n_replaced,
                "n_errored": self.n_errored}  # fmt: skip

    def of(self, rows: Iterable[_R]) -> list[_R]:
        """The rows (turns, steps or calls: anything with ``turn_id`` or a turn's ``id``)
        that belong to a completed turn."""
        out = []
        for r in rows:
            tid = getattr(r, "turn_id", None)
            if tid is None and isinstance(r, TurnRow):
                tid = r.id
            if tid in self.ids:
                out.append(r)
        return out


def left_out(counts: Mapping[str, int] | None) -> str:
    """The turns a summary left out, from :meth:`CompletedTurns.counts`: ``"2 cancelled,
    1 refused"`` (``""`` when none), said beside every percentile."""
    words = (("n_cut", "cut"), ("n_cancelled", "cancelled"), ("n_refused", "refused"),
             ("n_replaced", "replaced"), ("n_errored", "errored"))  # fmt: skip
    given = counts or {}
    return ", ".join(f"{given[k]} {w}" for k, w in words if given.get(k))


def completed_turns(turns: Iterable[TurnRow]) -> CompletedTurns:
    """The one rule of every latency summary: percentiles over completed turns only.

    A turn is *completed* when its status is ``ok``; cut, cancelled, refused, replaced
    and errored turns are counted (see :class:`CompletedTurns`), never part of a percentile.
    """
    by_status: Counter[str] = Counter()
    ids = set()
    for t in turns:
        by_status[t.status] += 1
        if t.status == "ok" and t.id is not None:
            ids.add(t.id)
    return CompletedTurns(frozenset(ids), n_cut=by_status["cut"],
                          n_cancelled=by_status["cancelled"],
                          n_refused=by_status["refused"], n_errored=by_status["error"],
                          n_replaced=by_status["replaced"])  # fmt: skip


def _pct(values: list[float], p: float) -> float | None:
    return round(percentile(values, p), 1) if values else None


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def _ci(values: list[float], p: float) -> list[float] | None:
    """The distribution-free 95% interval of the p-th percentile (:func:`quantile_ci`),
    rounded to 0.1 ms; None when ``len(values)`` cannot bound it."""
    ci = quantile_ci(values, p)
    return None if ci is None else [round(ci[0], 1), round(ci[1], 1)]


def _p50_p90(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50_ms": _pct(values, 50), "p90_ms": _pct(values, 90),
            "p50_ci": _ci(values, 50), "p90_ci": _ci(values, 90)}  # fmt: skip


def answered_summary(
    run_id: int, kind: str, status: str, finished: Sequence[TurnFinished]
) -> dict[str, Any]:
    """What a run answered, from its turns as they finished (``TurnFinished``, in
    memory), for when its log cannot be read (a database gone): :func:`latency_summary`'s
    ``run_id, kind, status, n_turns, turns, answer_ttft, answer_done`` (the same rule:
    percentiles over the ``ok`` turns, ms, n and 95% intervals), ``steps`` empty."""
    by_status = Counter(t.status for t in finished)
    ok = [t for t in finished if t.status == "ok"]
    counts = CompletedTurns(frozenset(range(len(ok))), n_cut=by_status["cut"],
                            n_cancelled=by_status["cancelled"],
                            n_refused=by_status["refused"], n_errored=by_status["error"],
                            n_replaced=by_status["replaced"]).counts()  # fmt: skip
    return {
        "run_id": run_id, "kind": kind, "label": None, "status": status,
        "n_turns": len(finished), "turns": counts,
        "turn": _p50_p90([t.duration_ms for t in ok]),
        "answer_ttft": {**_p50_p90([t.answer_ttft_ms for t in ok
                                    if t.answer_ttft_ms is not None]), "cached_share": None},
        "answer_done": _p50_p90([t.answer_done_ms for t in ok if t.answer_done_ms is not None]),
        "steps": {},
    }  # fmt: skip


def latest_per_request(turns: Sequence[TurnRow]) -> list[TurnRow]:
    """``turns`` (in log order) with, per request id, only its latest turn: a request a
    resumed replay ran again counts once, as it ended (a turn without a request id is
    kept). Shape: the same rows, in the same order."""
    latest: dict[str, int | None] = {t.request_id: t.id for t in turns if t.request_id}
    return [t for t in turns if not t.request_id or latest[t.request_id] == t.id]


def latency_summary(store: Store, run_id: int) -> dict[str, Any]:
    """p50/p90 with n per turn and per step, plus TTFT and tokens per LLM step, over
    completed turns only (:func:`completed_turns`), with the other turns counted.

    ``answer_ttft`` is the shopper's wait for the first answer token, ``answer_done``
    until the answer is complete; ``turn`` is all steps done (post-answer checks too).

    Returns ``{run_id, kind, label, status, n_turns, turns: {n_completed, n_cut,
    n_cancelled, n_refused, n_replaced, n_errored}, turn: {n, p50_ms, p90_ms, p50_ci,
    p90_ci}, answer_ttft: {...},
    answer_done: {...}, steps: {NAME: {n, p50_ms, p90_ms, p50_ci, p90_ci, model,
    reasoning_effort, ttft_n, ttft_p50_ms, ttft_p50_ci, ttft_cached_share,
    output_tokens_mean, n_ran, n_failed, failures, cost}}, prompt_cache, cost}``
    (``cost``: :func:`run_cost`; a step's: its calls' cost in completed turns);
    A request a resumed replay ran again counts once, by its latest turn
    (:func:`latest_per_request`): ``n_turns`` counts requests, not log rows.
    ``n_ran`` is the turns the step ran in (every turn but cancelled ones and the turns
    that skipped it), ``n_failed`` how many of those it failed in (failed open or closed,
    whatever the turn's status: a step that failed closed refused its turn, which no
    percentile includes) and ``failures`` those by error type, most frequent first;
    beside every TTFT its cached share (:func:`cache_state` of the calls it is over:
    ``ttft_cached_share`` per step, ``answer_ttft.cached_share`` over every answering
    call of the completed turns; None when unknown) and the run's ``prompt_cache``
    (:func:`prompt_cache_mode`): the server's prompt cache can change TTFT twentyfold;
    every ``*_ci`` is the distribution-free 95% order-statistic interval
    (:func:`chainrun.statistics.intervals.quantile_ci`), ``[lo, hi]`` in ms, or None when n cannot
    bound it (fewer than 36 values for a p90).

    Raises:
        UserInputError: no such run.
    """
    run = store.get_run(run_id)
    all_turns = latest_per_request(store.turns(run_id))
    kept = {t.id for t in all_turns}
    done = completed_turns(all_turns)
    turns = done.of(all_turns)
    durations = [t.duration_ms for t in turns if t.duration_ms is not None]
    answer_ttft = [t.answer_ttft_ms for t in turns if t.answer_ttft_ms is not None]
    answer_done = [t.answer_done_ms for t in turns if t.answer_done_ms is not None]
    by_step: dict[str, list[float]] = defaultdict(list)
    ran: Counter[str] = Counter()
    failures: dict[str, Counter[str]] = defaultdict(Counter)
    cancelled = {t.id for t in all_turns if t.status == "cancelled"}
    # each step's place in a turn (a turn's steps are in display order; a routed step is
    # skipped in some turns, so the first turn alone may not show every step in place)
    place: dict[str, int] = {}
    index, last_turn = 0, None
    for s in store.steps(run_id):
        index = 0 if s.turn_id != last_turn else index + 1
        last_turn = s.turn_id
        place[s.step] = min(place.get(s.step, index), index)
        if s.status == "skipped" or s.turn_id in cancelled or s.turn_id not in kept:
            continue
        # failures over every turn the step ran in: a step that failed closed ended its
        # turn refused or errored, so counting completed turns only would show none
        ran[s.step] += 1
        if s.status not in ("ok", "cancelled"):
            failures[s.step][s.error_type or s.status] += 1
        if s.turn_id in done.ids and s.status != "cancelled":  # a cut check's time is not its own
            by_step[s.step].append(s.duration_ms)
    ttft: dict[str, list[float]] = defaultdict(list)
    winners: dict[str, list[CallRow]] = defaultdict(list)
    tokens: dict[str, list[float]] = defaultdict(list)
    meta: dict[str, tuple[str | None, str | None]] = {}
    book = price_book(run.config)
    run_calls = store.calls(run_id)
    step_costs: dict[str, list[float | None]] = defaultdict(list)
    for c in done.of(run_calls):
        meta.setdefault(c.step, (c.model, c.reasoning_effort))
        step_costs[c.step].append(book.cost(c))  # every attempt: copies cost tokens too
        if c.outcome not in WINNER_OUTCOMES:
            continue
        winners[c.step].append(c)
        if c.ttft_ms is not None:
            ttft[c.step].append(c.ttft_ms)
        if c.output_tokens is not None:
            tokens[c.step].append(c.output_tokens)
    answer_cache = cache_state(c for w in winners.values() for c in w)
    steps = {}
    for name in sorted(ran, key=lambda n: place[n]):
        values = by_step[name]
        model, effort = meta.get(name, (None, None))
        steps[name] = {
            **_p50_p90(values),
            "model": model,
            "reasoning_effort": effort,
            "ttft_n": len(ttft[name]),
            "ttft_p50_ms": _pct(ttft[name], 50),
            "ttft_p50_ci": _ci(ttft[name], 50),
            "ttft_cached_share": cache_state(winners[name])["share"],
            "output_tokens_mean": _mean(tokens[name]),
            "n_ran": ran[name],
            "n_failed": sum(failures[name].values()),
            "failures": dict(failures[name].most_common()),
            "cost": sum_costs(step_costs[name]).as_json(),
        }
    return {
        "run_id": run_id,
        "kind": run.kind,
        "label": run.label,
        "status": run.status,
        "n_turns": len(all_turns),
        "turns": done.counts(),
        "turn": _p50_p90(durations),
        "answer_ttft": {**_p50_p90(answer_ttft), "cached_share": answer_cache["share"]},
        "prompt_cache": prompt_cache_mode(run.config),
        "answer_done": _p50_p90(answer_done),
        "steps": steps,
        "cost": run_cost(book, run_calls, done.of(run_calls)),
    }


def run_cost(book: PriceBook, calls: Sequence[CallRow], completed: Iterable[CallRow]
             ) -> dict[str, Any]:  # fmt: skip
    """A run's cost in money (:mod:`chainrun.pricing`): ``{"run": COST over every call,
    "per_turn": {n, mean_usd, p50_usd, p50_ci, n_unknown} over the completed turns whose
    every call's cost is known (``n_unknown`` the others), "prices": the shipped table's
    source}``, COST = :meth:`chainrun.pricing.Cost.as_json`."""
    per_turn = turn_costs(completed, lambda _run: book)
    known = [c.usd for c in per_turn.values() if c.known]
    return {
        "run": book.total(calls).as_json(),
        "per_turn": {**cost_summary(known),
                     "n_unknown": sum(not c.known for c in per_turn.values())},
        "prices": shipped_prices()[1],
    }


def hedge_stats(store: Store, run_id: int, *, include_failed: bool = False) -> dict[str, Any]:
    """Whether hedging pays, per step of a run.

    Per step: ``n`` (model calls: step executions, each round of a call with tools
    counted as one, since each round is its own race), ``n_armed`` (calls with a hedge
    delay in force), ``n_fired``, ``n_won``, ``fire_rate``, ``copies_sent`` and
    ``copies_sent_per_call`` (attempts beyond a round's first actually sent, per call),
    ``n_fired_no_copy_sent`` (fires after which no copy went out), ``unsent`` (due copies
    not sent: ``{budget_exhausted, circuit_open, loop_lag}``), ``win_rate``,
    ``time_saved_per_win_ms`` (``n_saved_measured`` says over how many wins),
    ``fire_rate_ci95`` and ``win_rate_ci95`` (95% Wilson score intervals, ``[lo, hi]``,
    None where the rate is),
    ``extra_calls_per_turn``, ``budget_exhausted`` (copies refused by the load budget, also
    in ``unsent``), ``mean_delay_ms``, ``n_probe_calls`` (calls hedged as probes while the
    step was backed off), ``n_seeded_delay`` and ``seeded_delay_turns`` (the calls whose
    hedge delay came from a latency window seeded from the log's recent calls when the
    process started, and their turn ids) and ``changes``: every decision of the step's
    hedge controller (``delay = "auto"`` advice, back-off, resume;
    :mod:`chainrun.hedging.advisor`), oldest first, as ``{at, kind, old, new, why,
    prediction}`` (``at`` ISO 8601 UTC). The rates
    are defined once, in :mod:`chainrun.hedging.stats` (fire rate = fires per armed
    execution: the hedge timer went off, whether a copy was sent or not; copies sent per
    call says what went out);
    None where their denominator is 0. Source of the numbers: Dean & Barroso,
    "The Tail at Scale" (CACM 2013); Finagle's backup-request counters. Over completed
    turns only (``n_turns``), the others counted in ``turns`` (:func:`completed_turns`).

    ``include_failed``: count every turn the step ran in except cancelled ones (refused,
    replaced and errored turns too; ``n_turns`` says how many). A step that fails closed
    refuses its turn exactly when every attempt lost the race to its deadline, so over
    completed turns only its fire rate is biased down and its win rate up (1.0 on the
    bimodal guard of benchmarks/guard_advise.py); ``chainrun advise`` validates its
    predictions over every turn for that reason.

    Raises:
        UserInputError: no such run.
    """
    calls = store.calls(run_id)
    # steps that call models: their kind's config model says so, or they made calls
    model_steps = _model_steps(store.get_run(run_id).config) | {c.step for c in calls}
    all_turns = store.turns(run_id)
    done = completed_turns(all_turns)
    counted = done
    if include_failed:
        ran = (t.id for t in all_turns if t.id is not None and t.status != "cancelled")
        counted = CompletedTurns(frozenset(ran))
    n_turns = counted.n_completed
    agg: dict[str, HedgeStats] = defaultdict(HedgeStats)
    delays: dict[str, list[float]] = defaultdict(list)
    details: dict[str, list[Mapping[str, Any] | None]] = defaultdict(list)
    probes: Counter[str] = Counter()
    seeded: dict[str, list[int]] = defaultdict(list)
    fired_steps = []
    for s in store.steps(run_id):  # a change applies to its step whatever became of the turn
        if s.detail and ("hedge_changes" in s.detail or "hedge_probe" in s.detail):
            details[s.step].append(s.detail)
    for s in counted.of(store.steps(run_id)):
        if s.step not in model_steps or s.status == "skipped":
            continue
        st = agg[s.step]
        probes[s.step] += bool((s.detail or {}).get("hedge_probe"))
        armed = s.hedge_delay_ms is not None
        for r in s.hedge_rounds():  # each round of a call with tools is a call of its own
            st.add_call(armed=armed, fired=r.fired, won_by_copy=r.won)
            if r.fired:
                fired_steps.append((s.step, s.turn_id, r.round))
            if r.fired and r.won and r.time_saved_ms is not None:
                st.record_time_saved(r.time_saved_ms)
        if armed:
            assert s.hedge_delay_ms is not None
            delays[s.step].append(s.hedge_delay_ms)
            if (s.detail or {}).get("hedge_delay_seeded") and s.turn_id is not None:
                seeded[s.step].append(s.turn_id)
    sent_in: dict[tuple[str, int | None, int], int] = defaultdict(int)
    book = price_book(store.get_run(run_id).config)
    copy_costs: dict[str, list[float | None]] = defaultdict(list)
    for c in counted.of(calls):
        if c.step not in agg:
            continue
        st = agg[c.step]
        if c.attempt == 1:
            continue  # a round's primary is no copy (sent or not)
        if c.outcome in SENT_OUTCOMES:
            st.copies_sent += 1
            sent_in[(c.step, c.turn_id, c.round)] += 1
            copy_costs[c.step].append(book.cost(c))  # a cancelled stream's: unknown
        else:
            st.add_unsent(unsent_reason(c.outcome, c.error_type))
    for step, turn_id, round_ in fired_steps:
        agg[step].fires_unsent += sent_in[(step, turn_id, round_)] == 0
    steps = {}
    for name, st in agg.items():
        steps[name] = {
            "n": st.calls,
            "n_armed": st.armed,
            "n_fired": st.fires,
            "n_won": st.copy_wins,
            "fire_rate": _round(st.fire_rate, 4),
            "fire_rate_ci95": _wilson(st.fires, st.armed),
            "copies_sent": st.copies_sent,
            "copies_sent_per_call": _round(st.copies_sent_per_call, 4),
            "n_fired_no_copy_sent": st.fires_unsent,
            "unsent": dict(st.unsent),
            "win_rate": _round(st.win_rate, 4),
            "win_rate_ci95": _wilson(st.copy_wins, st.fires),
            "time_saved_per_win_ms": _round(st.time_saved_per_win_ms, 1),
            "n_saved_measured": len(st.time_saved_ms),
            "extra_calls_per_turn": _round(extra_calls_per_turn(st.copies_sent, n_turns), 4),
            "budget_exhausted": st.budget_exhausted,
            "mean_delay_ms": _mean(delays[name]),
            "n_probe_calls": probes[name],
            "changes": logged_changes(details[name]),
            "n_seeded_delay": len(seeded[name]),
            "seeded_delay_turns": seeded[name],
            **hedge_cost(copy_costs[name], st.time_saved_ms),
        }
    return {"run_id": run_id, "n_turns": n_turns, "turns": done.counts(), "steps": steps}


def hedge_cost(copy_costs: Sequence[float | None], saved_ms: Sequence[float]) -> dict[str, Any]:
    """What a step's hedging cost against the time it saved: ``copies_cost`` (the
    :class:`~chainrun.pricing.Cost` of the copies sent, as JSON: a copy cancelled before
    its usage arrived is unknown, never 0), ``saved_s`` (the measured wins' time saved,
    s) and ``usd_per_s_saved`` (the copies' known cost over it; None when nothing was
    measured saved or no copy's cost is known)."""
    cost = sum_costs(copy_costs)
    saved_s = sum(saved_ms) / 1000.0
    per_s = cost.usd / saved_s if saved_s > 0 and cost.unknown < cost.calls else None
    return {"copies_cost": cost.as_json(), "saved_s": round(saved_s, 3),
            "usd_per_s_saved": None if per_s is None else round(per_s, 9)}  # fmt: skip


def _model_steps(snapshot: str | None) -> frozenset[str]:
    """The steps of a run's stored config that call a model (none without a config)."""
    try:
        data = json.loads(snapshot or "{}")
    except ValueError:
        return frozenset()
    # the config's step kinds are the whole chain's import (providers, steps, openai):
    # loaded only for the hedging figures, not for every command that reads a summary
    from chainrun.config import steps_calling_models

    return steps_calling_models(data.get("steps") if isinstance(data, dict) else None)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _wilson(k: int, n: int) -> list[float] | None:
    """95% Wilson score interval of the rate k/n, rounded to 4 digits; None when n = 0."""
    ci = wilson_interval(k, n)
    return None if ci is None else [round(ci[0], 4), round(ci[1], 4)]


def run_detail(store: Store, run_id: int) -> dict[str, Any]:
    """A run with its turns and, per turn, its steps, calls and tool calls (for ``chainrun
    show``).

    Returns the run's row as a dict (``config`` decoded) with ``turns``: each turn's
    row with its ``steps``, ``calls`` and ``tool_calls`` rows, in display order; and
    ``conversations``: the turn ids grouped by conversation, in turn order
    (:func:`conversations`).

    Raises:
        UserInputError: no such run.
    """
    run = store.get_run(run_id).model_dump()
    run["config"] = json.loads(run["config"]) if run.get("config") else None
    steps_by_turn: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
    for s in store.steps(run_id):
        steps_by_turn[s.turn_id].append(s.model_dump())
    calls_by_turn: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
    for c in store.calls(run_id):
        calls_by_turn[c.turn_id].append(c.model_dump())
    tools_by_turn: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
    for tc in store.tool_calls(run_id):
        tools_by_turn[tc.turn_id].append(tc.model_dump())
    turns = []
    rows = store.turns(run_id)
    for t in rows:
        turn = t.model_dump()
        turn["steps"] = steps_by_turn[t.id]
        turn["calls"] = calls_by_turn[t.id]
        turn["tool_calls"] = tools_by_turn[t.id]
        turns.append(turn)
    run["turns"] = turns
    run["conversations"] = conversations(rows)
    return run


def conversations(turns: Sequence[TurnRow]) -> list[dict[str, Any]]:
    """A run's turns grouped by conversation, in order of each conversation's first
    logged turn: ``[{"conversation_id", "turn_ids": [ids by turn index]}]`` (a turn
    with no conversation id is a conversation of its own, id None)."""
    groups: dict[str, list[TurnRow]] = {}
    out: list[tuple[str | None, list[TurnRow]]] = []
    for t in turns:
        if t.conversation_id is None:
            out.append((None, [t]))
            continue
        if t.conversation_id not in groups:
            groups[t.conversation_id] = []
            out.append((t.conversation_id, groups[t.conversation_id]))
        groups[t.conversation_id].append(t)
    return [
        {"conversation_id": cid,
         "turn_ids": [t.id for t in sorted(ts, key=lambda t: (t.turn_index or 0, t.id or 0))]}
        for cid, ts in out
    ]  # fmt: skip
