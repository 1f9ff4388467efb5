"""Rich tables shared by the commands (rendering only; the numbers come from the library)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from chainrun.events import StepFinished, TurnFinished


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def steps_table(steps: list[StepFinished], turn: TurnFinished) -> Table:
    """One turn: step, model, effort, TTFT, duration, tokens (ms)."""
    t = Table(title=f"turn {turn.turn_id} of run {turn.run_id}: {turn.status}, "
                    f"{turn.duration_ms:.0f} ms")  # fmt: skip
    for col in ("step", "status", "model", "effort", "TTFT ms", "duration ms", "out tokens",
                "attempts"):  # fmt: skip
        t.add_column(col, justify="right" if "ms" in col or "tok" in col else "left")
    for s in steps:
        t.add_row(s.step, s.status, s.model or "-", s.reasoning_effort or "-", _f(s.ttft_ms),
                  _f(s.duration_ms), _f(s.output_tokens), str(s.n_attempts))  # fmt: skip
    return t


def latency_table(summary: dict[str, Any]) -> Table:
    """Per turn and per step: n, p50, p90 (ms), TTFT p50 and mean output tokens."""
    t = Table(title=f"run {summary['run_id']} ({summary['kind']}, {summary['status']}): "
                    f"{summary['n_turns']} turns")  # fmt: skip
    for col in ("", "n", "p50 ms", "p90 ms", "TTFT p50 ms", "out tokens (mean)", "failed",
                "model", "effort"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("", "model", "effort") else "right")
    turn = summary["turn"]
    t.add_row("turn", str(turn["n"]), _f(turn["p50_ms"]), _f(turn["p90_ms"]), "", "", "", "", "")
    for name, s in summary["steps"].items():
        t.add_row(name, str(s["n"]), _f(s["p50_ms"]), _f(s["p90_ms"]), _f(s["ttft_p50_ms"]),
                  _f(s["output_tokens_mean"], 1), str(s["n_failed"]), s["model"] or "-",
                  s["reasoning_effort"] or "-")  # fmt: skip
    n = turn["n"]
    if n and n < 36:  # below 36 values no order-statistic interval bounds a p90
        rank = n - max(1, -(-n * 90 // 100)) + 1
        ordinal = {1: "", 2: "2nd-", 3: "3rd-"}.get(rank, f"{rank}th-")
        t.caption = f"n = {n}: a p90 of {n} values is in effect the {ordinal}slowest value"
    return t


def hedge_table(stats: dict[str, Any]) -> Table:
    """Whether hedging pays, per step."""
    t = Table(title=f"hedging, run {stats['run_id']} ({stats['n_turns']} turns)")
    cols = ("step", "n", "armed", "fire rate", "win rate", "saved/win ms", "measured",
            "extra calls/turn", "budget refused", "mean d ms")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col == "step" else "right")
    for name, s in stats["steps"].items():
        t.add_row(name, str(s["n"]), str(s["n_armed"]), _f(s["fire_rate"], 3),
                  _f(s["win_rate"], 3), _f(s["time_saved_per_win_ms"]),
                  str(s["n_saved_measured"]), _f(s["extra_calls_per_turn"], 3),
                  str(s["budget_exhausted"]), _f(s["mean_delay_ms"]))  # fmt: skip
    return t
