"""Hedging commands: ``hedge-stats`` (does it pay, per step of a run), ``simulate`` (the
latency budget of a check policy) and ``advise`` (the hedge delay from the log)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from chainrun.cli import DEFAULT_DB_PATH, DbOpt, JsonOpt, app, handle_errors, out, print_json

# The library is imported inside each command, when it runs (fast --help).


@app.command("hedge-stats")
@handle_errors
def hedge_stats_command(
    run_id: Annotated[int | None, typer.Argument(help="Run id (default: the latest run).")] = None,
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
) -> None:
    """Fire rate, win rate, time saved per win and extra calls per turn, per step; and
    every change of a step's hedge setting (auto delay, back-off, resume) with its why."""
    from chainrun.analysis.summary import hedge_stats
    from chainrun.cli.tables import hedge_changes_table, hedge_table
    from chainrun.errors import UserInputError
    from chainrun.log.store import Store

    with Store.open(db, create=False) as store:
        rid = run_id if run_id is not None else store.latest_run_id()
        if rid is None:
            raise UserInputError(f"{db}: no runs in this log yet")
        stats = hedge_stats(store, rid)
    if as_json:
        print_json(stats)
    else:
        out.print(hedge_table(stats))
        changes = hedge_changes_table(stats)
        if changes is not None:
            out.print(changes)


def _numbers(text: str, option: str, kind: type = float) -> list[Any]:
    from chainrun.errors import UserInputError

    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserInputError(f"{option}: expected comma-separated numbers, got {text!r}") from None


def _range(text: str, option: str) -> tuple[float, float]:
    from chainrun.errors import UserInputError

    parts = text.replace(",", "-").split("-")
    try:
        lo, hi = (float(p) for p in parts)
    except ValueError:
        raise UserInputError(f"{option}: expected LO-HI in ms (e.g. 100-300), got {text!r}") from (
            None
        )
    return lo, hi


def _opt(help_text: str) -> Any:
    return typer.Option(help=help_text)


@app.command("simulate")
@handle_errors
def simulate_command(
    dist: Annotated[str, _opt("lognormal | bimodal.")] = "lognormal",
    median_ms: Annotated[float, _opt("lognormal: median latency of one check, ms.")] = 8.0,
    sigma: Annotated[float, _opt("lognormal: sigma of log latency.")] = 0.6,
    checks: Annotated[str, _opt("lognormal: values of k, e.g. 1,2,4,8.")] = "1,2,3,4,5,6,7,8",
    hedge_quantile: Annotated[float, _opt("lognormal: hedge at this quantile.")] = 0.95,
    fast_share: Annotated[float, _opt("bimodal: share of the fast path.")] = 0.5,
    fast_ms: Annotated[str, _opt("bimodal: fast range LO-HI, ms.")] = "100-300",
    slow_ms: Annotated[str, _opt("bimodal: slow range LO-HI, ms.")] = "3000-19000",
    deadline_s: Annotated[float, _opt("bimodal: deadline, s.")] = 3.0,
    every_ms: Annotated[str, _opt("bimodal: copy every d ms (list).")] = "1000,400,350",
    attempts: Annotated[str, _opt("bimodal: up to k attempts (list).")] = "1,3,7,8",
    requests: Annotated[int, _opt("Simulated requests.")] = 1_000_000,
    seed: Annotated[int | None, _opt("RNG seed.")] = None,
    plot: Annotated[Path | None, _opt("lognormal: write a PNG of p99 against k.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Monte Carlo latency budget of k checks: sequential, parallel, hedged (or bimodal)."""
    from chainrun.analysis.simulate import (
        Bimodal,
        plot_p99,
        simulate_bimodal,
        simulate_lognormal,
    )
    from chainrun.cli.tables import simulate_table
    from chainrun.errors import UserInputError

    if dist == "lognormal":
        result = simulate_lognormal(
            median_ms=median_ms, sigma=sigma, checks=_numbers(checks, "--checks", int),
            hedge_quantile=hedge_quantile, requests=requests, seed=seed,
        )  # fmt: skip
        if plot is not None:
            result["plot"] = str(plot_p99(result, plot))
    elif dist == "bimodal":
        result = simulate_bimodal(
            Bimodal(fast_share, _range(fast_ms, "--fast-ms"), _range(slow_ms, "--slow-ms")),
            deadline_s=deadline_s, every_ms=_numbers(every_ms, "--every-ms"),
            attempts=_numbers(attempts, "--attempts", int), requests=requests, seed=seed,
        )  # fmt: skip
    else:
        raise UserInputError(f"--dist: expected lognormal or bimodal, got {dist!r}")
    if as_json:
        print_json(result)
    else:
        out.print(simulate_table(result))


@app.command("advise")
@handle_errors
def advise_command(
    run: Annotated[int, typer.Option("--run", help="Run whose logged calls to replay.")],
    step: Annotated[str, typer.Option("--step", help="Step name.")],
    deadline_s: Annotated[float | None, _opt("Deadline, s (default: the run's).")] = None,
    max_extra_calls: Annotated[float, _opt("Most extra calls per turn allowed.")] = 0.1,
    simulations: Annotated[int, _opt("Resampled turns per candidate.")] = 20_000,
    seed: Annotated[int, _opt("Resampling seed.")] = 0,
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
) -> None:
    """Pick a hedge delay and attempts for a step from its logged calls (or: do not hedge)."""
    from chainrun.analysis.advise import advise_from_log
    from chainrun.cli.tables import advise_table
    from chainrun.log.store import Store

    with Store.open(db, create=False) as store:
        result = advise_from_log(
            store, run, step, deadline_s=deadline_s, max_extra_calls=max_extra_calls,
            simulations=simulations, seed=seed,
        )  # fmt: skip
    if as_json:
        print_json(result)
    else:
        out.print(advise_table(result))
        note = (result.get("validation") or {}).get("note")
        if note:
            out.print(f"observed run {run}: {note}", markup=False)
        tail = result.get("censored_tail")
        if tail:
            out.print(f"censored tail: {tail['share']:.1%} of the calls outlived every answer "
                      f"(longest logged time {tail['at_ms']:g} ms, a cut call); drawn just "
                      "above it, a lower bound (Efron 1967)"
                      + ("" if tail["beyond_deadline"] else ": in time is an upper bound"),
                      markup=False)  # fmt: skip
        out.print("\n# paste into chainrun.toml:\n" + result["toml"], markup=False)
