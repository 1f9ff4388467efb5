"""Rich tables shared by the commands (rendering only; the numbers come from the library)."""

from __future__ import annotations

import json
import re
from typing import Any

from rich.table import Table
from rich.text import Text

from chainrun.analysis.summary import left_out
from chainrun.cli.fit import drop_first
from chainrun.events import StepFinished, TurnFinished
from chainrun.log.rows import StepRow, ToolCallRow, TurnRow
from chainrun.pricing import cost_text, hedge_cost_text, usd

#: width of the waterfall bars, in characters
_BAR = 40


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str | None) -> str:
    """Model or user text made safe for a terminal: control characters (ANSI escape
    sequences among them) shown as ``\\xNN`` instead of being sent raw; newlines and
    tabs kept. Print it with ``markup=False`` (or through ``rich.markup.escape``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text or "")


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def steps_table(steps: list[StepFinished], turn: TurnFinished) -> Table:
    """One turn: step, status (with the step's error type when it failed, e.g.
    ``failed_closed: timeout``), model, effort, TTFT, duration (ms), tokens, attempts."""
    t = Table(title=f"turn {turn.turn_id} of run {turn.run_id}: {turn.status}, "
                    f"{turn.duration_ms:.0f} ms")  # fmt: skip
    for col in ("step", "status", "model", "effort", "TTFT ms", "duration ms", "out tokens",
                "attempts"):  # fmt: skip
        t.add_column(col, justify="right" if "ms" in col or "tok" in col else "left")
    for s in steps:
        status = f"{s.status}: {s.error_type}" if s.error_type else s.status
        t.add_row(s.step, status, s.model or "-", s.reasoning_effort or "-", _f(s.ttft_ms),
                  _f(s.duration_ms), _f(s.output_tokens), str(s.n_attempts))  # fmt: skip
    return t


def grounding_text(g: dict[str, Any]) -> str:
    """The answer's grounding record in one line: claims checked, each ungrounded claim
    with why, and what was done (:meth:`chainrun.checks.grounding.StreamGrounding.report`)."""
    unjudged = f", {g['unjudged']} not judged" if g.get("unjudged") else ""
    head = (f"grounding: {g.get('claims', 0)} claims checked, {g.get('n_ungrounded', 0)} "
            f"ungrounded{unjudged}")  # fmt: skip
    parts = []
    done = list(g.get("done") or [])
    for i, u in enumerate(g.get("ungrounded") or []):
        action = done[i]["action"] if i < len(done) else g.get("action")
        to = f" to {done[i]['to']!r}" if i < len(done) and done[i].get("to") else ""
        parts.append(f"{u.get('kind')} {u.get('text')!r}: {u.get('why')} ({action}{to})")
    return head + ("; " + "; ".join(parts) if parts else "")


def verdict_lines(verdicts: dict[str, Any] | None) -> list[str]:
    """One line per step verdict of a turn, made printable: a text verdict (a critique's
    advice) as its text, a grounding record as :func:`grounding_text`, another as
    ``key=value`` pairs (values as compact JSON)."""
    lines = []
    for name, v in (verdicts or {}).items():
        if isinstance(v, dict) and isinstance(v.get("grounding"), dict):
            rest = {k: x for k, x in v.items() if k != "grounding"}
            shown = grounding_text(v["grounding"])
            if rest:
                shown += "; " + ", ".join(f"{k}={json.dumps(x, ensure_ascii=False)}"
                                          for k, x in rest.items())  # fmt: skip
        elif isinstance(v, dict) and set(v) == {"text"}:
            shown = str(v["text"]).strip()
        elif isinstance(v, dict):
            shown = ", ".join(f"{k}={json.dumps(x, ensure_ascii=False)}" for k, x in v.items())
        else:
            shown = json.dumps(v, ensure_ascii=False)
        lines.append(printable(f"{name}: {shown}"))
    return lines


def verdict_mark(verdict: Any) -> str:
    """The mark ``show`` prints beside a step's verdict: ``✓`` only for a verdict that
    passed (``"ok": true``), ``✗`` for one that failed (``"ok": false``), ``?`` for a
    missing verdict (``"ok": null``: a timeout, an error, an unparseable reply) and ``·``
    for a verdict that judges nothing (a critique's advice, a guard's categories)."""
    if isinstance(verdict, dict) and "ok" in verdict:
        ok = verdict["ok"]
        return "✓" if ok is True else "✗" if ok is False else "?"
    if isinstance(verdict, dict) and isinstance(verdict.get("grounding"), dict):
        return "✓" if verdict["grounding"].get("grounded") else "✗"
    if isinstance(verdict, dict) and verdict.get("missing"):
        return "?"
    return "·"


def marked_verdict_lines(verdicts: dict[str, Any] | None) -> list[str]:
    """:func:`verdict_lines` with each verdict's :func:`verdict_mark` in front."""
    marks = [verdict_mark(v) for v in (verdicts or {}).values()]
    return [f"{m} {line}" for m, line in zip(marks, verdict_lines(verdicts), strict=True)]


#: why a turn was logged ``lost``, by its error type (see the error types reference)
_LOST_WHY = {"process_ended": "its process ended before the turn's rows were written"}


def turn_times(t: TurnRow) -> str:
    """A turn's status and times for ``chainrun show``'s turn line: ``ok 812 ms, answer
    TTFT 140 ms, answer done 655 ms``; a turn that did not end ok has its error type
    after its status when it has one (``error (http_400) 264 ms, ...``). A time the log
    does not have is ``-`` when the turn has none (no answer: no answer TTFT) and
    ``unknown`` for a ``lost`` turn, whose rows
    were never written (``lost (process_ended: ...), started 2026-12-03T14:00:00+00:00,
    duration unknown, no answer``); never a unit without its number."""

    def ms(v: float | None, none: str) -> str:
        return none if v is None else f"{v:.0f} ms"

    if t.status == "lost":
        why = t.error_type or "unknown"
        if t.error_type in _LOST_WHY:
            why = f"{t.error_type}: {_LOST_WHY[t.error_type]}"
        parts = [f"lost ({why})"]
        if t.started_at:
            parts.append(f"started {t.started_at}")
        parts.append(f"duration {ms(t.duration_ms, 'unknown')}")
        if t.output is None:
            parts.append("no answer")
        return ", ".join(parts)
    why = f" ({t.error_type})" if t.error_type and t.status != "ok" else ""
    return (f"{t.status}{why} {ms(t.duration_ms, 'duration unknown')}, answer TTFT "
            f"{ms(t.answer_ttft_ms, '-')}, answer done {ms(t.answer_done_ms, '-')}")  # fmt: skip


def step_waterfall(steps: list[StepRow]) -> Table:
    """One turn's steps as a waterfall: start and end offsets (ms from the turn's start)
    and a bar, so steps that ran concurrently show overlapping; post-answer steps
    (not part of the shopper's wait) are marked."""
    t = Table(show_edge=False)
    for col in ("step", "status", "start ms", "end ms", "", "after answer"):
        # a bar is drawn whole or not at all (fit_table leaves the bars out when narrow)
        t.add_column(col, justify="right" if "ms" in col else "left", no_wrap=col == "")
    end = max((s.started_offset_ms + s.duration_ms for s in steps), default=0.0) or 1.0
    for s in steps:
        a = int(s.started_offset_ms / end * _BAR)
        b = max(a + 1, int((s.started_offset_ms + s.duration_ms) / end * _BAR))
        bar = " " * a + "█" * (b - a) if s.status != "skipped" else ""
        end_ms = s.started_offset_ms + s.duration_ms
        t.add_row(s.step, s.status, _f(s.started_offset_ms), _f(end_ms), bar,
                  "yes" if s.post_answer else "")  # fmt: skip
    return drop_first(t, "", "after answer")  # too narrow: the bars go first


def skipped_lines(steps: list[StepRow]) -> list[str]:
    """Per step skipped by its ``when``, one printable line with the reason it was
    logged with: ``retrieve skipped: when: label is 'order_status', one of ...``."""
    lines = []
    for s in steps:
        why = (s.detail or {}).get("skipped") if s.status == "skipped" else None
        if why:
            lines.append(printable(f"{s.step} skipped: {why}"))
    return lines


def cancelled_check_lines(turn_status: str, steps: list[StepRow]) -> list[str]:
    """For a turn that stayed answered while steps of it were cancelled (a stop after the
    whole answer reached the shopper), one line naming those steps: ``validate, critique
    cancelled after the answer was done: the stop cut these checks``; else none."""
    cut = [s.step for s in steps if s.status == "cancelled"]
    if turn_status != "ok" or not cut:
        return []
    return [printable(f"{', '.join(cut)} cancelled after the answer was done: the stop "
                      "cut these checks, the shopper had the whole answer")]  # fmt: skip


def tool_calls_table(rows: list[ToolCallRow]) -> Table:
    """A turn's tool calls: step, round, the attempt that asked, tool, status, start (ms
    from its step's start) and duration (see :func:`tool_call_lines` for the rest)."""
    t = Table(show_edge=False)
    for col in ("step", "round", "attempt", "tool", "status", "start ms", "duration ms"):
        t.add_column(col, justify="right" if "ms" in col else "left", overflow="fold")
    for r in rows:
        status = r.status + (" (turn cancelled)" if r.turn_cancelled else "")
        t.add_row(r.step, str(r.round), str(r.attempt), r.tool, status,
                  _f(r.started_offset_ms), _f(r.duration_ms))  # fmt: skip
    return t


def tool_call_lines(rows: list[ToolCallRow]) -> list[str]:
    """Per tool call one line: its call id, idempotency key, the arguments as logged
    (after ``[log] redact``) and the error, if any (printable, never cut)."""
    lines = []
    for r in rows:
        line = f"{r.tool} {r.call_id}: key={r.idempotency_key} args={r.arguments}"
        if r.error_message or r.error_type:
            line += f" error={r.error_message or r.error_type}"
        if r.question is not None:  # a confirm tool: what the shopper was asked, and who decided
            line += f" asked={r.question!r} status={r.status} expires={r.expires_at}"
            if r.decided_by is not None:
                line += f" decided_by={r.decided_by} at={r.decided_at}"
        if r.action_id is not None:
            line += f" confirmed_action={r.action_id}"
        lines.append(printable(line))
    return lines


def turn_counts(counts: dict[str, int] | None) -> str:
    """ "over 6 completed turns; 2 cancelled, 1 refused" (the one rule, said beside)."""
    if not counts:
        return ""
    others = left_out(counts)
    return f"over {counts['n_completed']} completed turns" + (
        f"; not in the percentiles: {others}" if others else ""
    )


#: a cell whose interval cannot be bounded at this n (one footnote under the table)
NO_CI = "-*"
NO_CI_NOTE = "* not enough data for a 95% interval at this n"


def ci_cell(ci: Any, digits: int = 0) -> str:
    """``[lo, hi]`` of a 95% interval, or :data:`NO_CI` when n cannot bound it."""
    return NO_CI if ci is None else f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def _with_ci(v: Any, ci: Any, digits: int = 0) -> str:
    """An estimate and its 95% interval in one cell: ``123 [118, 130]``; ``-`` when no
    estimate."""
    return "-" if v is None else f"{_f(float(v), digits)} {ci_cell(ci, digits)}"


def _note_no_ci(t: Table, caption: str | Text | None) -> str | Text | None:
    """``caption`` plus :data:`NO_CI_NOTE` when a cell of ``t`` shows :data:`NO_CI`."""
    if any(NO_CI in str(cell) for col in t.columns for cell in col.cells):
        return NO_CI_NOTE if caption is None else f"{caption}\n{NO_CI_NOTE}"
    return caption


def _share(share: float | None) -> str:
    """A cached share as ``"99%"`` (``"?%"`` when unknown)."""
    return "?%" if share is None else f"{share * 100:.0f}%"


def _failed_cell(step: dict[str, Any]) -> str:
    """``2: timeout``: the turns a step failed in (refused and errored turns included),
    with the failures by error type; ``0``. One count: the turns it ran in are in
    ``--json`` (``n_ran``), not beside it, where a second count read as the first's total."""
    cell = str(step["n_failed"])
    kinds = step.get("failures") or {}
    if len(kinds) == 1:
        return f"{cell}: {next(iter(kinds))}"
    if kinds:
        return f"{cell}: " + ", ".join(f"{k} ×{n}" for k, n in kinds.items())
    return cell


def _ms_with_ci(v: Any, ci: Any) -> str:
    """``120 ms [83, 274]``: an estimate in ms and its 95% interval (:func:`ci_cell`)."""
    return f"{_f(float(v))} ms {ci_cell(ci)}"


def run_headline(summary: dict[str, Any]) -> str:
    """The one line printed before a run's tables: what a shopper got and waited.

    ``run 1 (replay, complete): 12 turns, 10 ok (2 refused); answer TTFT p50 120 ms
    [83, 274], p90 274 ms -*, n = 10``: the run's turns and those that ended ok,
    the others by status (:func:`~chainrun.analysis.summary.left_out`), then the answer's
    time to first token over the ok turns (``summary`` is
    :func:`~chainrun.analysis.summary.latency_summary`'s; p50 and p90 with their 95%
    order-statistic intervals, ``-*`` where n cannot bound one, and n). A run with no
    ok turn says so instead of a latency.
    """
    counts = summary.get("turns") or {}
    ok = counts.get("n_completed", 0)
    others = left_out(counts)
    line = (f"run {summary['run_id']} ({summary['kind']}, {summary['status']}): "
            f"{summary['n_turns']} turns, {ok} ok")  # fmt: skip
    if others:
        line += f" ({others})"
    a = summary.get("answer_ttft") or {}
    if not ok:
        return f"{line}; no ok answer to time"
    if not a.get("n"):
        return f"{line}; answer TTFT unknown (no ok turn recorded one)"
    return (f"{line}; answer TTFT p50 {_ms_with_ci(a['p50_ms'], a.get('p50_ci'))}, "
            f"p90 {_ms_with_ci(a['p90_ms'], a.get('p90_ci'))}, n = {a['n']}")  # fmt: skip


def cost_line(summary: dict[str, Any]) -> str | None:
    """The run's cost in money after its headline: ``cost: $0.001234 for the run;
    per turn p50 $0.000044 [lo, hi], mean $0.000046, n = 28 (prices: ... as of DATE)``
    (``summary`` is :func:`~chainrun.analysis.summary.latency_summary`'s); None when the
    summary has no cost (an answered summary from memory)."""
    cost = summary.get("cost")
    if not cost:
        return None
    per = cost["per_turn"]
    line = f"cost: {cost_text(cost['run'])} for the run"
    if per["n"]:
        ci = per.get("p50_ci")
        interval = f" [{usd(ci[0])}, {usd(ci[1])}]" if ci else " -*"
        line += (f"; per ok turn p50 {usd(per['p50_usd'])}{interval}, mean "
                 f"{usd(per['mean_usd'])}, n = {per['n']}")  # fmt: skip
    if per.get("n_unknown"):
        line += f" ({per['n_unknown']} turns of unknown cost left out)"
    src = cost.get("prices") or {}
    if src:
        line += f" (prices: config, else {src.get('url', '?')} as of {src.get('date', '?')})"
    return line


def hedge_cost_lines(stats: dict[str, Any]) -> list[str]:
    """What each hedged step's copies cost against the time they saved, one line a step
    that sent copies (``stats`` is :func:`~chainrun.analysis.summary.hedge_stats`'s)."""
    return [line for name, s in stats["steps"].items()
            if (line := hedge_cost_text(name, s, s["n_saved_measured"])) is not None]  # fmt: skip


#: the table's legend of its two counts (its caption)
_COUNTS_NOTE = ("n: the completed turns a row is over (a step's: those it ran in); "
                "failed: the turns a step failed in, refused and errored ones included")


def latency_table(summary: dict[str, Any]) -> Table:
    """Per turn and per step: n, p50, p90 (ms) with their 95% order-statistic intervals,
    TTFT p50 (its own n when it differs) with the cached share of its calls' prompt
    tokens, and mean output tokens, over completed turns (the others are counted in
    :func:`run_headline`); the turns each step failed in, by error type; the model, and
    the reasoning effort where a step sent one. One count a column, said in the caption."""
    counts = summary.get("turns") or {}
    t = Table(title=f"run {summary['run_id']} per turn and step: percentiles over "
                    f"{counts.get('n_completed', 0)} completed turns")  # fmt: skip
    # a column of "-" only says nothing: effort shows where a step sent one
    efforts = any(s["reasoning_effort"] for s in summary["steps"].values())
    cols = ("", "n", "p50 ms [95% CI]", "p90 ms [95% CI]", "TTFT p50 ms [95% CI]",
            "out tokens (mean)", "cost", "failed", "model", *(("effort",) if efforts else ()))
    for col in cols:
        t.add_column(col, justify="left" if col in ("", "model", "effort") else "right")
    blank = [""] * (len(cols) - 4)

    def pcts(s: dict[str, Any]) -> tuple[str, str]:
        return (_with_ci(s["p50_ms"], s.get("p50_ci")), _with_ci(s["p90_ms"], s.get("p90_ci")))

    turn = summary["turn"]
    t.add_row("turn", str(turn["n"]), *pcts(turn), *blank)
    for key, name in (("answer_ttft", "answer TTFT"), ("answer_done", "answer done")):
        a = summary.get(key)
        if a:
            # the answer's TTFT is this row's own p50: said again in the TTFT column, with
            # the prompt cache's share that decides it (a lone "0% cached" read as missing)
            ttft = ""
            if key == "answer_ttft" and a["p50_ms"] is not None:
                ttft = (f"{_with_ci(a['p50_ms'], a.get('p50_ci'))} · "
                        f"{_share(a.get('cached_share'))} cached")  # fmt: skip
            t.add_row(name, str(a["n"]), *pcts(a), ttft, *blank[1:])
    for name, s in summary["steps"].items():
        ttft = _with_ci(s["ttft_p50_ms"], s.get("ttft_p50_ci"))
        if s["ttft_p50_ms"] is not None and s.get("ttft_n", s["n"]) != s["n"]:
            ttft = f"{ttft} (n={s['ttft_n']})"
        if s["ttft_p50_ms"] is not None:  # the server's prompt cache decides TTFT
            ttft = f"{ttft} · {_share(s.get('ttft_cached_share'))} cached"
        effort = (s["reasoning_effort"] or "-",) if efforts else ()
        t.add_row(name, str(s["n"]), *pcts(s), ttft, _f(s["output_tokens_mean"], 1),
                  cost_text(s.get("cost")) if s.get("cost", {}).get("calls") else "",
                  _failed_cell(s), s["model"] or "-", *effort)  # fmt: skip
    n = turn["n"]
    if summary.get("prompt_cache") == "off":
        t.title = f"{t.title}; prompt cache off (cache_prompt: false)"
    t.caption = _COUNTS_NOTE
    if n and n < 36:  # below 36 values no order-statistic interval bounds a p90
        rank = n - max(1, -(-n * 90 // 100)) + 1
        ordinal = {1: "", 2: "2nd-", 3: "3rd-"}.get(rank, f"{rank}th-")
        t.caption += f"\nn = {n}: a p90 of {n} values is in effect the {ordinal}slowest value"
    t.caption = _note_no_ci(t, t.caption)
    # too narrow: model and effort go first, then token means, failures, TTFT
    return drop_first(t, "effort", "model", "out tokens (mean)", "cost", "failed",
                      "TTFT p50 ms [95% CI]")  # fmt: skip


def hedge_table(stats: dict[str, Any]) -> Table:
    """Whether hedging pays, per step. Fire rate is how often the hedge timer went off;
    copies sent per call is what actually went out (a due copy the budget refused, or
    that an open breaker or a lagging loop held back, is counted under "not sent")."""
    t = Table(title=f"hedging, run {stats['run_id']} ({turn_counts(stats.get('turns'))})")
    cols = ("step", "n", "armed", "fire rate [95% CI]", "sent/call", "fired unsent",
            "unsent b/c/l/r", "win rate [95% CI]", "saved/win ms", "measured", "extra calls/turn",
            "mean d ms")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col == "step" else "right")
    for name, s in stats["steps"].items():
        unsent = s["unsent"]
        t.add_row(name, str(s["n"]), str(s["n_armed"]),
                  _with_ci(s["fire_rate"], s.get("fire_rate_ci95"), 3),
                  _f(s["copies_sent_per_call"], 3), str(s["n_fired_no_copy_sent"]),
                  f"{unsent['budget_exhausted']}/{unsent['circuit_open']}/{unsent['loop_lag']}/"
                  f"{unsent.get('rate_limited', 0)}",
                  _with_ci(s["win_rate"], s.get("win_rate_ci95"), 3),
                  _f(s["time_saved_per_win_ms"]),
                  str(s["n_saved_measured"]), _f(s["extra_calls_per_turn"], 3),
                  _f(s["mean_delay_ms"]))  # fmt: skip
    notes = []
    if any(s["n_fired_no_copy_sent"] for s in stats["steps"].values()):
        notes.append("fire rate: the hedge timer went off (a copy was due); sent/call: copies "
                     "actually sent per call; unsent b/c/l/r: due copies not sent (budget "
                     "refused / breaker open / loop lag / rate limited); a fire with no copy "
                     "sent cannot win, so its loss says nothing of the copy")  # fmt: skip
    for name, s in stats["steps"].items():
        turns = s.get("seeded_delay_turns") or []
        if turns:  # hedged at a delay from the log's recent calls (a window seeded at start)
            shown = ", ".join(str(t) for t in turns[:8]) + (", ..." if len(turns) > 8 else "")
            notes.append(f"{name}: {len(turns)} calls hedged at a delay seeded from the log's "
                         f"recent calls (turns {shown})")  # fmt: skip
    notes += hedge_cost_lines(stats)
    if notes:
        t.caption = "\n".join(notes)
    # too narrow: the detail columns go first; fire rate, win rate and savings stay
    return drop_first(t, "mean d ms", "unsent b/c/l/r", "fired unsent", "measured", "armed",
                      "sent/call", "extra calls/turn")  # fmt: skip


def hedge_changes_table(stats: dict[str, Any]) -> Table | None:
    """The hedge settings each step's controller chose during the run (``delay = "auto"``
    advice, back-off, resume): when, from what, to what and why; None if none changed."""
    rows = [(name, c) for name, s in stats["steps"].items() for c in s.get("changes", [])]
    if not rows:
        return None
    t = Table(title=f"hedge setting changes, run {stats['run_id']}")
    for col in ("step", "at (UTC)", "change", "from", "to", "why"):
        t.add_column(col, justify="left")
    for name, c in rows:
        t.add_row(name, c["at"], c["kind"], c["old"], c["new"], c["why"])
    return t


def simulate_table(result: dict[str, Any]) -> Table:
    """``chainrun simulate``: p50/p90/p99 per k and mode (log-normal) or the bimodal grid."""
    if result["dist"] == "bimodal":
        t = Table(title=f"bimodal checks, deadline {result['deadline_s']:g} s, "
                        f"n = {result['requests']} per row")  # fmt: skip
        for col in ("copy every ms", "attempts", "in time", "95% CI", "calls/check",
                    "closed form", "p50 ms", "p99 ms"):  # fmt: skip
            t.add_column(col, justify="right")
        for g in result["grid"]:
            cf = g["closed_form"]
            t.add_row(_f(float(g["every_ms"])), str(g["attempts"]), _f(g["in_time"], 4),
                      f"{g['in_time_ci95'][0]:.4f}-{g['in_time_ci95'][1]:.4f}",
                      _f(g["calls_per_check"], 3),
                      "-" if cf is None else f"{cf['in_time']:.4f} / {cf['calls_per_check']:.3f}",
                      _f(g["p50_ms"]), _f(g["p99_ms"]))  # fmt: skip
        return t
    title = (f"k log-normal checks, median {result['median_ms']:g} ms, sigma {result['sigma']:g}; "
             f"hedged at the q={result['hedge_quantile']:g} quantile "
             f"({result['hedge_delay_ms']:.2f} ms); n = {result['requests']}")  # fmt: skip
    t = Table(title=title)
    for col in ("k", "mode", "p50 ms", "p90 ms", "p99 ms", "p99 95% CI", "extra load"):
        t.add_column(col, justify="right")
    for k, modes in result["by_k"].items():
        for mode, s in modes.items():
            ci = s["p99_ci95_ms"]
            t.add_row(k, mode, _f(s["p50_ms"], 2), _f(s["p90_ms"], 2), _f(s["p99_ms"], 2),
                      f"{ci[0]:.2f}-{ci[1]:.2f}", _f(s.get("extra_load"), 4))  # fmt: skip
    return t


def advise_table(result: dict[str, Any], top: int = 8) -> Table:
    """``chainrun advise``: the baseline and the best candidates, by share in time then p99,
    and always the recommended setting (marked ``←``), also when it ranks below ``top``:
    the pick weighs extra calls too, so it need not be among the fastest rows."""
    rec = result["recommendation"]
    verdict = (f"hedge: delay {rec['delay_ms']:g} ms, {rec['attempts']} attempts"
               if rec["hedge"] else "do not hedge")  # fmt: skip
    t = Table(title=f"advise {result['step']} (run {result['run_id']}, {result['n_calls']} calls, "
                    f"{result['n_censored']} censored; deadline {result['deadline_s']:g} s): "
                    f"{verdict}")  # fmt: skip
    for col in ("delay ms", "attempts", "in time", "p50 ms", "p99 ms", "extra calls/turn",
                "fire rate", "win rate", "pick"):  # fmt: skip
        t.add_column(col, justify="left" if col == "pick" else "right")

    def picked(c: dict[str, Any]) -> bool:
        return bool(rec["hedge"]) and (c["delay_ms"], c["attempts"]) == (
            rec["delay_ms"], rec["attempts"])  # fmt: skip

    def row(c: dict[str, Any], label: str | None = None, mark: bool = False) -> None:
        t.add_row(label or _f(c["delay_ms"]), str(c["attempts"]), _f(c["in_time"], 4),
                  _f(c["p50_ms"]), _f(c["p99_ms"]), _f(c["extra_calls_per_turn"], 3),
                  _f(c["fire_rate"], 3), _f(c["win_rate"], 3),
                  "← recommended" if mark else "")  # fmt: skip

    row(result["baseline"], "no hedge", mark=not rec["hedge"])
    ranked = sorted(result["candidates"],
                    key=lambda c: (-c["in_time"], c["p99_ms"] or float("inf")))  # fmt: skip
    shown = ranked[:top]
    shown += [c for c in ranked[top:] if picked(c)][:1]  # the pick, wherever it ranks
    for c in shown:
        row(c, mark=picked(c))
    t.caption = rec["reason"]
    # too narrow: p50, fire and win rates go first (never the pick or the setting)
    return drop_first(t, "p50 ms", "win rate", "fire rate")


def _p50(summary: dict[str, Any], unit: str) -> str:
    v, ci = summary[f"p50_{unit}"], summary["p50_ci"]
    if v is None:
        return "-"
    digits = 1 if unit == "ms" and v < 100 else 0
    return f"{v:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def provider_compare_table(doc: dict[str, Any]) -> Table:
    """``compare --by provider``: per step and side, n and p50 [95% CI] of TTFT, time per
    output token and generated tokens; the verdict (work or serving) as the caption."""
    t = Table(title=f"compare by provider: A={doc['a']['selector']}  B={doc['b']['selector']}")
    for col in ("step", "side", "provider (server)", "n", "TTFT p50 ms", "per token p50 ms",
                "tokens p50", "change"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("step", "side", "provider (server)",
                                                    "change") else "right")  # fmt: skip
    verdicts = []
    for name, s in doc["steps"].items():
        for side in ("a", "b"):
            x = s[side]
            who = ", ".join(x["provider"]) + (f" ({', '.join(x['server_address'])})"
                                              if x["server_address"] else "")  # fmt: skip
            change = "" if side == "a" else " ".join(
                f"{k.split('_')[0]}:{c['status']}" for k, c in s["changes"].items())  # fmt: skip
            t.add_row(name if side == "a" else "", side.upper(), who or "-", str(x["n_calls"]),
                      _p50(x["ttft_ms"], "ms"), _p50(x["tpot_ms"], "ms"),
                      _p50(x["output_tokens"], "tokens"), change)  # fmt: skip
        verdicts.append(f"{name}: {s['verdict']['explanation']}")
    t.caption = "\n".join(verdicts)
    return t


def server_table(calls: list[Any]) -> Table | None:
    """Per server a run's model calls went to (``calls.server_address``: each replica of
    a provider with ``replicas``), per step: calls sent, TTFT p50 (ms) with its 95%
    order-statistic interval, and the cached share of their prompt tokens; None when
    every call went to one server (nothing to compare)."""
    from chainrun.statistics.intervals import summarize

    sent = [c for c in calls if c.started_offset_ms is not None and c.server_address]
    if len({c.server_address for c in sent}) < 2:
        return None
    t = Table(title="calls by server", show_edge=False)
    for col in ("server", "step", "calls", "TTFT p50 ms [95% CI]", "cached"):
        t.add_column(col, justify="left" if col in ("server", "step") else "right")
    groups: dict[tuple[str, str], list[Any]] = {}
    for c in sent:
        groups.setdefault((c.server_address, c.step), []).append(c)
    for (server, step), rows in sorted(groups.items()):
        s = summarize([c.ttft_ms for c in rows if c.ttft_ms is not None])
        prompt = sum(c.input_tokens or 0 for c in rows)
        cached = sum(c.cached_input_tokens or 0 for c in rows)
        t.add_row(server, step, str(len(rows)), _with_ci(s["p50_ms"], s["p50_ci"]),
                  _share(cached / prompt if prompt else None))  # fmt: skip
    return t
