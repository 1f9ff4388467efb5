"""``chainrun compare A B``: is B faster, slower, better or worse than A, beyond the noise?

A and B are run ids (``"12"``) or ``live`` / ``live:FROM..TO``: the turns of runs of kind
``live`` that started in ``[FROM, TO)`` (ISO-8601 timestamps, either side optional, UTC
when no offset is given). For the turn and every step the result gives each side's
p50/p90/p99 with n and distribution-free intervals (:mod:`chainrun.statistics.intervals`), the
difference B − A per percentile with an interval, and a verdict that says ``worse`` only
when B is slower beyond that interval. LLM steps also get their latency split into TTFT,
time between tokens (``calls.time_between_tokens_ms``: the mean gap between the chunks
that carried text) and completion tokens, so that a step that got slower because it
generated more tokens is told apart from one that was served slower. Eval pass rates are
compared *paired*, on the same case ids (exact McNemar test); skipped verdicts (no
grader for ``llm-rubric``) are in no pass rate and are counted per side and type, with
the reason (``evals.skipped``).

A practical tolerance (``min_effect``, :class:`MinEffect`: ``5%`` of A's percentile or
``20ms``; default :data:`DEFAULT_MIN_EFFECT`) turns a real but tiny latency difference
into ``same`` (:func:`chainrun.statistics.intervals.practical_verdict`): the intervals cover the
sampling noise within a run, not the drift between two runs of one machine.

Latency follows the one rule of every summary (:func:`chainrun.analysis.summary.completed_turns`):
percentiles over completed turns (and their steps and calls) only; each side's
cancelled, refused and errored turns are counted beside them (``turns`` of each side).

The server's prompt cache can change TTFT twentyfold (a prompt prefix the server has
cached is not computed again), and a replay meets whatever the server saw before it. So
each side's cached share (cached prompt tokens over prompt tokens of its winning calls)
is given beside TTFT; when the two differ by :data:`~chainrun.analysis.summary.
CACHE_SHARE_DIFFERS` or more, ``compare`` says so (``cache.warning``, a step's
``llm.cache_warning``) and compares the step's TTFT like with like where it can
(``llm.like_with_like``: over the calls in the same cache state on both sides).

The result is plain JSON-ready data (see :func:`compare`); the CLI only prints it.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from chainrun.analysis.summary import (
    CACHE_SHARE_DIFFERS,
    CompletedTurns,
    cache_state,
    completed_turns,
    warm_call,
)
from chainrun.errors import UserInputError
from chainrun.evals.scoring import case_outcomes, flip_rate, load_results, skipped_summary
from chainrun.log.rows import CallRow, EvalResultRow, StepRow, TurnRow, winning_calls
from chainrun.log.store import Store
from chainrun.log.time_window import log_time
from chainrun.pricing import Cost, PriceBook, cost_summary, price_book, turn_costs
from chainrun.statistics.intervals import (
    SUMMARY_PERCENTILES,
    LatencyVerdict,
    QuantileDiff,
    paired_compare,
    percentile,
    practical_latency_verdict,
    quantile_diff,
    summarize,
)

LIVE = "live"
#: ``metric`` value selecting the turn and every step
ALL = "all"
#: the metric name of the whole turn's latency (turns.duration_ms)
TURN = "turn"
#: the shopper's wait: first answer token, and answer complete (from the turn's start)
ANSWER_TTFT = "answer_ttft"
ANSWER_DONE = "answer_done"
#: the metric name of the paired eval comparison in :func:`regression`
EVALS = "evals"
#: ``regression`` metric meaning "any metric or the evals"
ANY = "any"

_HEAD = {"worse": "slower", "better": "faster", "same": "within the tolerance",
         "inconclusive": "no clear change"}  # fmt: skip


@dataclass(frozen=True)
class MinEffect:
    """A practical tolerance for latency verdicts: ``value`` percent of A's percentile
    (``unit`` ``"%"``) or ``value`` ms (``unit`` ``"ms"``). A difference shown to lie
    within it is ``same``; ``worse``/``better`` need the estimate beyond it."""

    value: float
    unit: Literal["%", "ms"]

    def tolerance_ms(self, baseline_ms: float | None) -> float:
        """The tolerance in ms for a percentile whose value in A is ``baseline_ms``
        (0 for a percentage of an unknown baseline)."""
        if self.unit == "ms":
            return self.value
        return abs(baseline_ms) * self.value / 100 if baseline_ms is not None else 0.0

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.unit == "%" else f"{self.value:g}ms"

    def as_dict(self) -> dict[str, Any]:
        """``{"text": "5%", "value": 5.0, "unit": "%"}``."""
        return {"text": str(self), "value": self.value, "unit": self.unit}


#: the default tolerance: 5% of A's percentile. Two runs of one chain on one machine
#: drift by a few percent (load, warm caches) beyond what the within-run intervals
#: cover; 5% keeps that drift from reading as a regression while a 10% change still
#: shows (docs/guides/compare-and-audit.md).
DEFAULT_MIN_EFFECT = MinEffect(5.0, "%")

_MIN_EFFECT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|ms)?\s*$")


def parse_min_effect(text: str) -> MinEffect:
    """``"5%"``, ``"20ms"`` / ``"20 ms"`` or ``"0"`` (no tolerance) as a :class:`MinEffect`.

    Raises:
        UserInputError: anything else (a bare number other than 0 is ambiguous).
    """
    m = _MIN_EFFECT.match(text)
    if m is None or (m.group(2) is None and float(m.group(1)) != 0):
        raise UserInputError(
            f"--min-effect {text!r}: expected a share of A's percentile such as 5% or a "
            "time such as 20ms (0 for none)"
        )
    return MinEffect(float(m.group(1)), "ms" if m.group(2) == "ms" else "%")


@dataclass
class Side:
    """The turns one side of a comparison selected, with their steps and calls."""

    selector: str
    kind: str  # "run" | "live"
    run_ids: list[int]
    turns: list[TurnRow]
    steps: list[StepRow] = field(default_factory=list)
    calls: list[CallRow] = field(default_factory=list)
    label: str | None = None
    run_kind: str | None = None
    window: tuple[str | None, str | None] | None = None

    @property
    def turn_ids(self) -> set[int]:
        return {t.id for t in self.turns if t.id is not None}

    @property
    def completed(self) -> CompletedTurns:
        """The one rule: which turns latency may use, and the others' counts."""
        return completed_turns(self.turns)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "selector": self.selector,
            "kind": self.kind,
            "run_ids": self.run_ids,
            "n_turns": len(self.turns),
            "turns": self.completed.counts(),
        }
        if self.kind == "run":
            out["run_kind"] = self.run_kind
            out["label"] = self.label
        else:
            out["window"] = {"from": self.window[0], "to": self.window[1]} if self.window else None
        return out


def _parse_ts(text: str, selector: str) -> datetime:
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        raise UserInputError(
            f"{selector!r}: {text!r} is not an ISO-8601 timestamp (e.g. 2025-05-01T10:00)"
        ) from None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_live_window(selector: str) -> tuple[datetime | None, datetime | None]:
    """``(FROM, TO)`` of ``live`` / ``live:FROM..TO`` (either side may be empty); the
    window is [FROM, TO), and a date-only TO includes that whole day.

    Raises:
        UserInputError: not of that form, or a timestamp that does not parse.
    """
    if selector == LIVE:
        return None, None
    rest = selector[len(LIVE) + 1 :]
    if not selector.startswith(LIVE + ":") or ".." not in rest:
        raise UserInputError(f"{selector!r}: expected live or live:FROM..TO (either side optional)")
    lo, hi = rest.split("..", 1)
    start = _parse_ts(lo, selector) if lo.strip() else None
    end = _parse_ts(hi, selector) if hi.strip() else None
    if end is not None and _DATE_ONLY.match(hi.strip()):
        end += timedelta(days=1)  # a date-only end means the whole of that day
    if start and end and end <= start:
        raise UserInputError(f"{selector!r}: the window ends before it starts")
    return start, end


def select(store: Store, selector: str) -> Side:
    """Resolve one side of a comparison.

    Raises:
        UserInputError: an unknown run id, a malformed selector, or a live window
            holding no turn.
    """
    sel = selector.strip()
    if sel == LIVE or sel.startswith(LIVE + ":"):
        return _select_live(store, sel)
    if not sel.isdigit():
        raise UserInputError(f"{selector!r}: expected a run id or live[:FROM..TO]")
    run = store.get_run(int(sel))
    rid = int(sel)
    return Side(
        selector=sel,
        kind="run",
        run_ids=[rid],
        turns=store.turns(rid),
        steps=store.steps(rid),
        calls=store.calls(rid),
        label=run.label,
        run_kind=run.kind,
    )


def _select_live(store: Store, sel: str) -> Side:
    start, end = parse_live_window(sel)
    # filtered in the database: a shared log holds every serving process's live traffic
    turns = store.turns_between(
        "live", log_time(start) if start else None, log_time(end) if end else None
    )
    window = (start.isoformat() if start else None, end.isoformat() if end else None)
    if not turns:
        raise UserInputError(f"{sel!r}: no turns of live runs in this window")
    ids = {t.id for t in turns}
    run_ids = sorted({t.run_id for t in turns if t.run_id is not None})
    steps = [s for s in store.steps(run_ids) if s.turn_id in ids]
    calls = [c for c in store.calls(run_ids) if c.turn_id in ids]
    return Side(sel, LIVE, run_ids, turns, steps, calls, window=window)


def live_window_selectors(
    a: str, b: str, since: str | None, until: str | None
) -> tuple[str, str]:
    """``a`` and ``b`` with a side ``live`` narrowed to ``live:SINCE..UNTIL`` (the
    ``--since``/``--until`` of ``chainrun compare``).

    Raises:
        UserInputError: neither side is ``live`` (the window selects live traffic), or a
            bound is not ISO-8601.
    """
    for option, text in (("--since", since), ("--until", until)):
        if text is not None:
            _parse_ts(text.strip(), f"{option} {text}")
    window = f"{LIVE}:{(since or '').strip()}..{(until or '').strip()}"
    sides = [window if side.strip() == LIVE else side for side in (a, b)]
    if sides == [a, b]:
        raise UserInputError("--since/--until select a window of live traffic: name one side "
                             f"'live' (e.g. chainrun compare RUN live --since ...), got {a!r} "
                             f"and {b!r}")  # fmt: skip
    return sides[0], sides[1]


# -- latency -----------------------------------------------------------------------------


def _diff_block(
    a: Sequence[float], b: Sequence[float], confidence: float, unit: str = "ms"
) -> tuple[dict[str, Any], list[QuantileDiff]]:
    diffs = [quantile_diff(a, b, p, confidence) for p in SUMMARY_PERCENTILES]
    out: dict[str, Any] = {"n_a": len(a), "n_b": len(b), "confidence": confidence}
    for d in diffs:
        p = int(d.p)
        out[f"p{p}_{unit}"] = round(d.estimate, 3) if d.estimate is not None else None
        out[f"p{p}_ci"] = [round(d.ci[0], 3), round(d.ci[1], 3)] if d.ci else None
    return out, diffs


def _latency_metric(
    a: Sequence[float], b: Sequence[float], confidence: float, min_effect: MinEffect
) -> dict[str, Any]:
    """Both sides' summaries, B − A per percentile with its tolerance (``tolerance_ms``,
    from ``min_effect``), the verdict, and ``decided_by``: the percentile whose difference
    gave the verdict (``"p90"``; None when inconclusive), so a verdict never rests on a
    figure the reader cannot find."""
    diff, diffs = _diff_block(a, b, confidence)
    tolerances = [min_effect.tolerance_ms(percentile(a, d.p) if a else None) for d in diffs]
    diff["tolerance_ms"] = {
        f"p{int(d.p)}": round(t, 3) for d, t in zip(diffs, tolerances, strict=True)
    }
    verdict, decided = practical_latency_verdict(diffs, tolerances)
    return {
        "a": summarize(a, confidence),
        "b": summarize(b, confidence),
        "diff": diff,
        "verdict": verdict,
        "decided_by": f"p{int(diffs[decided].p)}" if decided is not None else None,
    }


def _turn_ms(turns: Sequence[TurnRow], what: str = "duration_ms") -> list[float]:
    """``what`` (duration_ms, answer_ttft_ms or answer_done_ms) of the completed turns
    (:func:`completed_turns`) where it is known."""
    values = (getattr(t, what) for t in completed_turns(turns).of(turns))
    return [float(v) for v in values if v is not None]


def _step_ms(side: Side) -> dict[str, list[float]]:
    """Durations per step over the steps of completed turns (skipped steps left out;
    every step name of the side is a key, even with no value)."""
    done = side.completed
    out: dict[str, list[float]] = {}
    for s in side.steps:
        out.setdefault(s.step, [])
        if s.turn_id in done.ids and s.status not in ("skipped", "cancelled"):
            out[s.step].append(s.duration_ms)
    return out


def _replayed(turns: Sequence[TurnRow], confidence: float) -> dict[str, Any] | None:
    replayed = [t for t in turns if t.original_ms is not None]
    if not replayed:
        return None
    return {
        "n": len(replayed),
        "original_live": {
            "label": "original live latency (recorded when the turn was first served)",
            **summarize([float(t.original_ms or 0.0) for t in replayed], confidence),
        },
        "replay_wall": {
            "label": "this replay's own wall time for the same turns",
            **summarize(_turn_ms(replayed), confidence),
        },
    }


# -- the LLM split: TTFT, time between tokens, completion tokens -------------------------

_COMPONENTS = (
    ("completion_tokens", "completion tokens"),
    ("ttft", "TTFT"),
    ("time_between_tokens", "time between tokens"),
)


def _split_values(side: Side, step: str) -> tuple[dict[str, list[float]], dict[str, int], int]:
    values: dict[str, list[float]] = {k: [] for k, _ in _COMPONENTS}
    unknown = {k: 0 for k, _ in _COMPONENTS}
    calls = side.completed.of(side.calls)
    winners = [c for (_, s), c in winning_calls(calls).items() if s == step]
    for c in winners:
        raw = {
            "ttft": c.ttft_ms,
            # the logged mean gap between the chunks that carried text (NULL: unknown)
            "time_between_tokens": c.time_between_tokens_ms,
            "completion_tokens": c.output_tokens,
        }
        for k, v in raw.items():
            if v is None:
                unknown[k] += 1
            else:
                values[k].append(float(v))
    return values, unknown, len(winners)


def _component_change(a: Sequence[float], b: Sequence[float], confidence: float) -> dict[str, Any]:
    d = quantile_diff(a, b, 50, confidence)
    change: dict[str, Any] = {
        "p50_diff": round(d.estimate, 3) if d.estimate is not None else None,
        "p50_diff_ci": [round(d.ci[0], 3), round(d.ci[1], 3)] if d.ci else None,
    }
    if not a or not b:
        change["status"] = "unknown"
    elif d.ci is None:
        change["status"] = "too_few"
    elif d.verdict == "inconclusive":
        change["status"] = "unchanged"
    else:
        change["status"] = "up" if d.verdict == "worse" else "down"
    med_a = statistics.median(a) if a else None
    change["rel"] = round(d.estimate / med_a, 4) if d.estimate is not None and med_a else None
    return change


def _phrase(name: str, change: Mapping[str, Any]) -> str:
    status = change["status"]
    if status in ("up", "down"):
        rel = change["rel"]
        if rel is not None:
            return f"{rel * 100:+.0f}% {name}"
        return f"{change['p50_diff']:+g} {name}"
    return {"unchanged": f"{name} unchanged", "too_few": f"{name}: too few values",
            "unknown": f"{name} unknown"}[status]  # fmt: skip


def _cause(verdict: LatencyVerdict, changes: Mapping[str, Mapping[str, Any]]) -> str | None:
    if verdict in ("inconclusive", "same"):
        return None
    way = "up" if verdict == "worse" else "down"
    tokens = changes["completion_tokens"]["status"] == way
    serving = way in (changes["ttft"]["status"], changes["time_between_tokens"]["status"])
    if tokens and serving:
        return "both"
    if tokens:
        return "more_tokens" if way == "up" else "fewer_tokens"
    if serving:
        return "served_slower" if way == "up" else "served_faster"
    return "unexplained"


def _step_winners(side: Side, step: str) -> list[CallRow]:
    calls = side.completed.of(side.calls)
    return [c for (_, s), c in winning_calls(calls).items() if s == step]


def _cache_warning(a: Mapping[str, Any], b: Mapping[str, Any], what: str) -> str | None:
    """The warning when two cache states differ enough to explain a TTFT difference."""
    sa, sb = a.get("share"), b.get("share")
    if sa is None or sb is None or abs(sa - sb) < CACHE_SHARE_DIFFERS:
        return None
    return (f"{what}: A had {sa * 100:.0f}% of its prompt tokens cached by the server, B "
            f"{sb * 100:.0f}%: a TTFT difference may be cache state, not code")  # fmt: skip


def _like_with_like(wa: Sequence[CallRow], wb: Sequence[CallRow], confidence: float
                    ) -> dict[str, Any]:  # fmt: skip
    """TTFT B − A over calls in the same cache state on both sides (cold: under half of
    the prompt cached; warm: half or more), the state with the most calls; or
    ``{"status": "no_common_cache_state"}`` when no state has calls on both sides."""
    best: dict[str, Any] | None = None
    for name, warm in (("cold", False), ("warm", True)):
        ta = [c.ttft_ms for c in wa if warm_call(c) is warm and c.ttft_ms is not None]
        tb = [c.ttft_ms for c in wb if warm_call(c) is warm and c.ttft_ms is not None]
        if not ta or not tb:
            continue
        if best is None or len(ta) + len(tb) > best["n_a"] + best["n_b"]:
            best = {"status": "compared", "cache_state": name, "n_a": len(ta), "n_b": len(tb),
                    "ttft": _component_change(ta, tb, confidence)}  # fmt: skip
    return best or {"status": "no_common_cache_state"}


def _llm_split(
    a: Side, b: Side, step: str, verdict: LatencyVerdict, confidence: float
) -> dict[str, Any]:
    va, ua, na = _split_values(a, step)
    vb, ub, nb = _split_values(b, step)
    wa, wb = _step_winners(a, step), _step_winners(b, step)
    cache = {"a": cache_state(wa), "b": cache_state(wb)}
    units = {"completion_tokens": "tokens", "ttft": "ms", "time_between_tokens": "ms"}
    sides: dict[str, Any] = {}
    for name, vals, unknown, n in (("a", va, ua, na), ("b", vb, ub, nb)):
        sides[name] = {
            "n_calls": n,
            **{k: summarize(vals[k], confidence, units[k]) for k, _ in _COMPONENTS},
            "unknown": unknown,
            "cached_share": cache[name],
        }
    changes = {k: _component_change(va[k], vb[k], confidence) for k, _ in _COMPONENTS}
    order = sorted(_COMPONENTS, key=lambda c: changes[c[0]]["status"] not in ("up", "down"))
    explanation = f"{_HEAD[verdict]}: " + ", ".join(_phrase(lbl, changes[k]) for k, lbl in order)
    warning = _cache_warning(cache["a"], cache["b"], step)
    if warning is not None:
        explanation += f" ({warning})"
    return {
        **sides,
        "changes": changes,
        "cause": _cause(verdict, changes),
        "explanation": explanation,
        "cache_warning": warning,
        "like_with_like": _like_with_like(wa, wb, confidence) if warning else None,
    }


# -- conversations: figures by turn index ----------------------------------------------


def _answer_steps(store: Store, side: Side) -> set[str]:
    """The answer step of each of the side's runs (from their stored configs)."""
    names = set()
    for rid in side.run_ids:
        config = store.get_run(rid).config
        try:
            names.add(str(json.loads(config or "{}").get("answer_step") or "compose"))
        except ValueError:
            names.add("compose")
    return names


def _turn_costs(store: Store, side: Side) -> dict[int, Cost]:
    """Each completed turn's cost (by turn id) over all its calls, copies included, at
    the prices of its run's config (:func:`chainrun.pricing.price_book`)."""
    books = {rid: price_book(store.get_run(rid).config) for rid in side.run_ids}
    default = PriceBook()
    return turn_costs(side.completed.of(side.calls), lambda rid: books.get(rid, default))


def _cost(store: Store, a: Side, b: Side, confidence: float) -> dict[str, Any]:
    """Cost per completed turn on each side (``{n, mean_usd, p50_usd, p50_ci,
    n_unknown}``: turns with a call of unknown cost left out and counted) and B's mean
    minus A's."""
    out: dict[str, Any] = {}
    for name, side in (("a", a), ("b", b)):
        costs = _turn_costs(store, side)
        known = [c.usd for c in costs.values() if c.known]
        out[name] = {**cost_summary(known, confidence),
                     "n_unknown": sum(not c.known for c in costs.values())}  # fmt: skip
    ma, mb = out["a"]["mean_usd"], out["b"]["mean_usd"]
    out["diff_mean_usd"] = None if ma is None or mb is None else round(mb - ma, 9)
    return out


def _turn_figures(
    side: Side, answer_steps: set[str], costs: Mapping[int, Cost] | None = None
) -> dict[tuple[str, int], dict[str, float]]:
    """Per completed turn with a turn index, keyed by (conversation id, turn index): its
    answer TTFT (ms), the answer call's prompt tokens and the turn's cost (USD, from
    ``costs`` by turn id), where known."""
    done = side.completed
    winners = winning_calls(done.of(side.calls))
    answers = {tid: c for (tid, step), c in winners.items() if step in answer_steps}
    prompt = {tid: c.input_tokens for tid, c in answers.items()}
    out: dict[tuple[str, int], dict[str, float]] = {}
    for t in done.of(side.turns):
        if t.turn_index is None or t.conversation_id is None or t.id is None:
            continue
        figures: dict[str, float] = {}
        if t.answer_ttft_ms is not None:
            figures["answer_ttft"] = float(t.answer_ttft_ms)
        tokens = prompt.get(t.id)
        if tokens is not None:
            figures["prompt_tokens"] = float(tokens)
            cached = answers[t.id].cached_input_tokens
            if cached is not None:
                figures["cached_tokens"] = float(cached)
        cost = (costs or {}).get(t.id)
        if cost is not None and cost.known:
            figures["cost"] = cost.usd
        out[(t.conversation_id, t.turn_index)] = figures
    return out


def _cached_share(figures: Sequence[Mapping[str, float]]) -> float | None:
    """The answer calls' cached prompt tokens over their prompt tokens (the calls that
    reported both); None when none did."""
    both = [f for f in figures if "cached_tokens" in f and f.get("prompt_tokens")]
    total = sum(f["prompt_tokens"] for f in both)
    return round(sum(f["cached_tokens"] for f in both) / total, 4) if total else None


def _by_turn_index(
    store: Store, a: Side, b: Side, confidence: float
) -> dict[str, Any] | None:
    """The shopper's wait and the answer's prompt tokens per turn index, each side's and
    paired over the turns both sides have (same conversation id and turn index: a
    conversation replay set run twice); None when neither side has a conversation of
    more than one turn."""
    fa = _turn_figures(a, _answer_steps(store, a), _turn_costs(store, a))
    fb = _turn_figures(b, _answer_steps(store, b), _turn_costs(store, b))
    indexes = sorted({i for _, i in [*fa, *fb]})
    if not indexes or max(indexes) < 2:
        return None
    units = {"answer_ttft": "ms", "prompt_tokens": "tokens"}
    rows = []
    for i in indexes:
        row: dict[str, Any] = {"turn_index": i}
        for name, figs in (("a", fa), ("b", fb)):
            at = [f for (_, ti), f in figs.items() if ti == i]
            row[name] = {"n_turns": len(at), **{
                k: summarize([f[k] for f in at if k in f], confidence, unit)
                for k, unit in units.items()
            }, "cost": cost_summary([f["cost"] for f in at if "cost" in f], confidence),
                "cached_share": _cached_share(at)}  # fmt: skip
        both = [(fa[k], fb[k]) for k in fa if k[1] == i and k in fb]
        row["paired"] = {"n_pairs": len(both), **{
            f"{k}_diff": summarize([y[k] - x[k] for x, y in both if k in x and k in y],
                                   confidence, unit)
            for k, unit in units.items()
        }, "cost_diff": cost_summary([y["cost"] - x["cost"] for x, y in both
                                      if "cost" in x and "cost" in y], confidence)}  # fmt: skip
        rows.append(row)
    return {"pairing": ["conversation_id", "turn_index"], "turns": rows}


# -- evals --------------------------------------------------------------------------------


def _skipped(rows: Sequence[EvalResultRow]) -> dict[str, Any]:
    """One side's skipped verdicts (``passed`` NULL: e.g. ``llm-rubric`` without a
    grader): ``{"n", "cases": cases with at least one, "by_type": {type: {"n",
    "reason"}}}``."""
    skipped = [r for r in rows if r.passed is None]
    return {
        "n": len(skipped),
        "cases": len({r.case_id for r in skipped}),
        "by_type": skipped_summary(skipped),
    }


def _evals(store: Store, a: Side, b: Side) -> dict[str, Any] | None:
    ids_a, ids_b = a.turn_ids, b.turn_ids
    ra = [r for r in load_results(store, a.run_ids) if r.turn_id in ids_a]
    rb = [r for r in load_results(store, b.run_ids) if r.turn_id in ids_b]
    if not ra and not rb:
        return None
    cases = paired_compare(case_outcomes(ra), case_outcomes(rb))
    by_type = {}
    graded = {r.type for r in [*ra, *rb] if r.passed is not None}
    for t in sorted(graded):  # a type with no verdict on either side is only in "skipped"
        by_type[t] = paired_compare(
            case_outcomes(r for r in ra if r.type == t),
            case_outcomes(r for r in rb if r.type == t),
        ).as_dict()
    return {
        "scored": {"a": bool(ra), "b": bool(rb)},
        "test": "exact McNemar (two-sided binomial on discordant cases), alpha 0.05",
        **cases.as_dict(),
        "by_type": by_type,
        "flip": {"a": flip_rate(ra), "b": flip_rate(rb)},
        "skipped": {"a": _skipped(ra), "b": _skipped(rb)},
    }


# -- the API ------------------------------------------------------------------------------


def compare(
    store: Store,
    a: str,
    b: str,
    metric: str = ALL,
    confidence: float = 0.95,
    min_effect: MinEffect = DEFAULT_MIN_EFFECT,
) -> dict[str, Any]:
    """Compare B against A: latency of the turn and each step, the LLM split, evals.

    Args:
        store: the run log.
        a, b: a run id (as a string) or ``live`` / ``live:FROM..TO``.
        metric: ``"all"`` (the turn and every step), ``"turn"`` or one step name.
        confidence: level of every interval (default 95%).
        min_effect: the practical tolerance of every latency verdict (default 5% of
            A's percentile; ``MinEffect(0, "%")`` for none).

    Returns (JSON-ready; times in ms, every ``*_ci`` a ``[lo, hi]`` list or None where
    the data cannot bound it)::

        {"a": {"selector", "kind": "run"|"live", "run_ids", "n_turns", ...},
         "b": {...},
         "confidence": 0.95,
         "min_effect": {"text": "5%", "value": 5.0, "unit": "%"},
         "metrics": {
            "turn": {"a": SUMMARY, "b": SUMMARY, "diff": DIFF, "verdict": V,
                     "replayed": {"a": REPLAYED | None, "b": REPLAYED | None}},
            "<step>": {"a": SUMMARY, "b": SUMMARY, "diff": DIFF, "verdict": V,
                       "llm": {"a": SPLIT, "b": SPLIT, "changes": {...},
                               "cause": ..., "explanation": "slower: +40% ..."}},
         },
         "evals": EVALS | None,  # paired pass rates; EVALS["skipped"] = {"a": SKIPPED,
                                 # "b": SKIPPED}, SKIPPED = {"n", "cases", "by_type":
                                 # {type: {"n", "reason"}}}
         "answer_ttft": {like "turn": the shopper's wait for the first answer token},
         "answer_done": {like "turn": until the answer was complete},
         "cache": {"a": CACHE, "b": CACHE, "differs": bool, "warning": str | None},
         "grounding": {"a": GROUNDING, "b": GROUNDING},  # answers with a fact judged
                     # false: {"shown": RATE, "model": RATE}, RATE = {"ungrounded", "n",
                     # "rate", "ci95", "claims_judged", "claims_unjudged",
                     # "answers_judged"} (chainrun.analysis.grounding)
         "by_turn_index": BY_TURN | None,  # conversations: figures per turn index
         "cost": {"a": COST, "b": COST, "diff_mean_usd"},  # per completed turn (USD)
         "regressions": ["turn", "compose", "answer_ttft", "evals", ...]}

        CACHE    = {"share", "n_calls", "n_unknown", "cached_tokens", "input_tokens"}
                   (:func:`chainrun.analysis.summary.cache_state` of the winning calls)

        BY_TURN  = {"pairing": ["conversation_id", "turn_index"],
                    "turns": [{"turn_index": 1,
                               "a": {"n_turns", "answer_ttft": SUMMARY,
                                     "prompt_tokens": SUMMARY (p50_tokens, ...)},
                               "b": {...},
                               "paired": {"n_pairs", "answer_ttft_diff": SUMMARY,
                                          "prompt_tokens_diff": SUMMARY,
                                          "cost_diff": COST}}, ...]}
                   (each side's row also has "cost": COST, its turns' cost, and
                   "cached_share": the answer calls' cached prompt tokens over their
                   prompt tokens, None when unknown)

        COST     = {"n", "mean_usd", "p50_usd", "p50_ci"} (:func:`chainrun.pricing.
                   cost_summary`; the sides' also "n_unknown": turns of unknown cost)

        SUMMARY  = {"n", "p50_ms", "p90_ms", "p99_ms", "p50_ci", "p90_ci", "p99_ci"}
        DIFF     = {"n_a", "n_b", "confidence", "p50_ms", "p50_ci", ...,   (B − A)
                    "tolerance_ms": {"p50", "p90", "p99"}}
        V        = "better" | "worse" | "same" | "inconclusive"

    The diff interval is :func:`chainrun.statistics.intervals.quantile_diff`'s
    (conservative, from the two order-statistic intervals); ``worse`` needs some
    percentile's difference to be above 0 across its whole interval with its estimate beyond
    the tolerance; ``same`` needs every bounded percentile's interval within ±its tolerance
    (:func:`chainrun.statistics.intervals.practical_latency_verdict`). Each latency block
    also has ``decided_by``. See the module docstring for the rest.

    Raises:
        UserInputError: unknown run id, malformed selector, empty live window, unknown metric.
    """
    sa, sb = select(store, a), select(store, b)
    steps_a, steps_b = _step_ms(sa), _step_ms(sb)
    step_names = list(dict.fromkeys([*steps_a, *steps_b]))
    known = [TURN, *step_names]
    if metric != ALL and metric not in known:
        raise UserInputError(f"unknown metric {metric!r}; expected {ALL} or one of {known}")
    llm_steps = {c.step for c in [*sa.calls, *sb.calls]}
    metrics: dict[str, Any] = {}
    answer: dict[str, Any] = {}  # the shopper's wait, shaped like the turn block
    if metric in (ALL, TURN):
        m = _latency_metric(_turn_ms(sa.turns), _turn_ms(sb.turns), confidence, min_effect)
        m["replayed"] = {"a": _replayed(sa.turns, confidence), "b": _replayed(sb.turns, confidence)}
        metrics[TURN] = m
        for key, column in ((ANSWER_TTFT, "answer_ttft_ms"), (ANSWER_DONE, "answer_done_ms")):
            answer[key] = _latency_metric(
                _turn_ms(sa.turns, column), _turn_ms(sb.turns, column), confidence, min_effect
            )
    for name in step_names:
        if metric not in (ALL, name):
            continue
        m = _latency_metric(steps_a.get(name, []), steps_b.get(name, []), confidence, min_effect)
        if name in llm_steps:
            m["llm"] = _llm_split(sa, sb, name, m["verdict"], confidence)
        metrics[name] = m
    evals = _evals(store, sa, sb)
    ca = cache_state(winning_calls(sa.completed.of(sa.calls)).values())
    cb = cache_state(winning_calls(sb.completed.of(sb.calls)).values())
    warning = _cache_warning(ca, cb, "all steps")
    cache: dict[str, Any] = {"a": ca, "b": cb, "differs": warning is not None,
                             "warning": warning}  # fmt: skip
    by_turn = _by_turn_index(store, sa, sb, confidence)
    cost = _cost(store, sa, sb, confidence)
    grounding = {side: _grounding(store, x) for side, x in (("a", sa), ("b", sb))}
    sequences = _sequences(store, sa, sb)
    regressions = [k for k, v in metrics.items() if v["verdict"] == "worse"]
    regressions += [k for k, v in answer.items() if v["verdict"] == "worse"]
    if evals is not None and evals["verdict"] == "worse":
        regressions.append(EVALS)
    return {
        "a": sa.describe(),
        "b": sb.describe(),
        "confidence": confidence,
        "min_effect": min_effect.as_dict(),
        "metrics": metrics,
        **answer,
        "evals": evals,
        "cache": cache,
        "grounding": grounding,
        "sequences": sequences,
        "by_turn_index": by_turn,
        "cost": cost,
        "regressions": regressions,
    }


def _sequences(store: Store, a: Side, b: Side) -> dict[str, Any]:
    """Confidence sequences of B against A, valid at every look (compare run again and
    again as traffic arrives): each ``{n, estimate, lower, upper, alpha, method, null,
    decided_at, verdict, drifted}`` (:mod:`chainrun.statistics.sequential`), or None
    where the sides give no data for it.

    - ``pass_rate``: the paired difference of the eval pass rate (B − A, in [−1, 1]), on
      the cases both sides scored, in A's case order;
    - ``ungrounded_rate``: B's share of answers with a fact judged false as the
      shopper received them minus A's (unpaired: a CS per side at alpha / 2);
    - ``answer_ttft``: the share of the requests both sides answered (same request id)
      that B answered first, null 1/2 (the sign of the paired difference: decided above
      1/2 when B is faster at the median); None on sides without shared requests (live
      traffic against a replay), whose turns cannot be paired.

    A verdict is taken when the interval excludes the null at the look it is read; with
    a sequence that is valid whenever the look happens (the fixed-n intervals beside it
    are valid at one planned look only).
    """
    from chainrun.analysis.grounding import groundings_of
    from chainrun.statistics.sequential import (
        faster_share_cs,
        paired_difference_cs,
        two_sample_difference_cs,
    )

    out: dict[str, Any] = {"alpha": 0.05}
    oa = case_outcomes(r for r in load_results(store, a.run_ids) if r.turn_id in a.turn_ids)
    ob = case_outcomes(r for r in load_results(store, b.run_ids) if r.turn_id in b.turn_ids)
    shared = [c for c in oa if c in ob]
    out["pass_rate"] = (paired_difference_cs([oa[c] for c in shared], [ob[c] for c in shared])
                        .as_dict() if shared else None)  # fmt: skip
    ga = [t.shown_ungrounded for t in groundings_of(a.turns, a.steps, configs=_configs(store, a))]
    gb = [t.shown_ungrounded for t in groundings_of(b.turns, b.steps, configs=_configs(store, b))]
    out["ungrounded_rate"] = (two_sample_difference_cs([bool(x) for x in ga],
                                                       [bool(x) for x in gb]).as_dict()
                              if ga and gb else None)  # fmt: skip
    ttft_b = {t.request_id: t.answer_ttft_ms for t in b.turns
              if t.request_id is not None and t.answer_ttft_ms is not None}  # fmt: skip
    pairs = [(t.answer_ttft_ms, ttft_b[t.request_id]) for t in a.turns
             if t.request_id in ttft_b and t.answer_ttft_ms is not None]  # fmt: skip
    out["answer_ttft"] = (faster_share_cs([x for x, _ in pairs], [y for _, y in pairs])
                          .as_dict() if pairs else None)  # fmt: skip
    return out


def _configs(store: Store, side: Side) -> dict[int, str | None]:
    """The config snapshots of the side's runs, by run id (what their grounding judged
    with: :func:`chainrun.analysis.grounding.shop_settings`)."""
    ids = {t.run_id for t in side.turns if t.run_id is not None} | set(side.run_ids)
    return {rid: store.get_run(rid).config for rid in sorted(ids)}


def _grounding(store: Store, side: Side) -> dict[str, Any]:
    """A side's answers with a fact judged false: as the shopper received them
    (``shown``, checked again against each turn's logged products) and as the model wrote
    them (``model``, the answer step's grounding records), each ``{ungrounded, n, rate,
    ci95, claims_judged, claims_unjudged, answers_judged}`` (95% Wilson;
    :func:`chainrun.analysis.grounding.grounding_rate`)."""
    from chainrun.analysis.grounding import grounding_rate, groundings_of

    turns = groundings_of(side.turns, side.steps, configs=_configs(store, side))
    return {"shown": grounding_rate(turns), "model": grounding_rate(turns, shown=False)}


def regression(result: Mapping[str, Any], metric: str = ANY) -> bool:
    """True when :func:`compare`'s ``result`` shows B worse than A on ``metric``.

    ``metric``: ``"any"`` (any latency metric or the evals), ``"turn"``, a step name, or
    ``"evals"`` (paired pass rate). For ``--fail-on-regression``; an A/A comparison is
    never a regression.

    Raises:
        UserInputError: ``metric`` is not in the result.
    """
    if metric == ANY:
        return bool(result["regressions"])
    if metric == EVALS:
        evals = result.get("evals")
        return evals is not None and evals["verdict"] == "worse"
    if metric in (ANSWER_TTFT, ANSWER_DONE) and metric in result:
        return bool(result[metric]["verdict"] == "worse")
    metrics = result["metrics"]
    if metric not in metrics:
        raise UserInputError(
            f"unknown metric {metric!r}; expected {ANY}, {EVALS} or one of {list(metrics)}"
        )
    return bool(metrics[metric]["verdict"] == "worse")
