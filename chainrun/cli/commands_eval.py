"""``chainrun eval`` (a regression eval set) and ``chainrun compare`` (two runs, honestly)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from chainrun.cli import (
    DB_ENV,
    DEFAULT_DB_PATH,
    ActOpt,
    ConfigOpt,
    DbOpt,
    JsonOpt,
    LabelOpt,
    SinceOpt,
    Terminated,
    UntilOpt,
    app,
    err,
    exit_stopped,
    handle_errors,
    interrupted_line,
    out,
    print_json,
    run_async,
)

# The library is imported inside each command, when it runs (fast --help).

if TYPE_CHECKING:
    from rich.table import Table


def _fmt_rate(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "-"
    ci = r.get("pass_rate_ci")
    ci_s = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    return f"{r['passed']}/{r['n']} = {r['pass_rate']:.2f}{ci_s}"


#: what ``chainrun eval --json`` shows of each stored verdict
VERDICT_FIELDS = {"case_id", "repeat", "type", "step", "passed", "detail", "grader"}


@app.command("eval")
@handle_errors
def eval_command(
    file: Annotated[Path, typer.Argument(help="Eval set: JSON Lines of cases with assertions.")],
    run: Annotated[
        int | None, typer.Option("--run", help="Score this existing run instead of running.")
    ] = None,
    repeat: Annotated[
        int | None, typer.Option(min=1, help="Run each case K times (flip rate). [default: 1]")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Turns in flight at once. [default: 1]")
    ] = None,
    label: LabelOpt = None,
    fail_on_skipped: Annotated[
        bool,
        typer.Option(
            "--fail-on-skipped",
            help="Exit 1 when an assertion got no verdict (e.g. llm-rubric, no grader).",
        ),
    ] = False,
    fail_under: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="Exit 1 when the case pass rate is under this "
                     "(0..1). A case marked must_pass that fails exits 1 whatever the rate."),
    ] = None,
    config: ConfigOpt = None,
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
    act: ActOpt = False,
    as_configured: Annotated[
        bool,
        typer.Option(
            "--as-configured",
            help="Sample as the chain is configured; by default an eval runs every model "
            "step at temperature 0 with a fixed seed, so that a change, not sampling "
            "noise, moves its verdicts.",
        ),
    ] = False,
) -> None:
    """Run an eval set through the chain (kind eval) and print pass rates with n and the
    failed cases. Exit 1 when a must_pass case fails, the pass rate is under
    --fail-under, or (--fail-on-skipped) an assertion got no verdict."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Table

    from chainrun.analysis.summary import latency_summary
    from chainrun.config import load_config
    from chainrun.errors import UserInputError
    from chainrun.evals import load_cases, load_results
    from chainrun.evals.runner import check_grader, run_eval, score_existing
    from chainrun.evals.scoring import failed_cases, gate
    from chainrun.log.store import Store

    if run is not None:
        given = [f"--{n}" for n, v in (("repeat", repeat), ("concurrency", concurrency),
                                        ("label", label)) if v is not None]  # fmt: skip
        if given:
            raise UserInputError(
                f"{', '.join(given)}: only for a new eval run; --run {run} scores an existing "
                "run as it was run (drop --run to run the cases again)"
            )
    repeat = repeat or 1
    cfg = load_config(config)
    cases = load_cases(file, steps=cfg.order)  # validated before any run exists
    if run is None:  # a grader that is down fails before the log file is even created
        run_async(check_grader(cfg, cases, quiet=as_json))
    store = Store.open(db, create=run is None)
    progress = Progress(
        TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, disable=as_json or run is not None or not err.is_terminal, transient=True,
    )  # fmt: skip
    task = progress.add_task("", total=len(cases) * repeat)
    started: list[int] = []
    try:
        try:
            with progress:
                if run is not None:
                    result = run_async(score_existing(store, run, cases, cfg, quiet=as_json))
                    result = {**result, "n_cases": len(cases), "repeat": None}
                else:
                    result = run_async(
                        run_eval(cfg, cases, store, repeat=repeat, as_configured=as_configured,
                                 concurrency=concurrency or 1, label=label, source=str(file),
                                 quiet=as_json, on_turn=lambda *_: progress.advance(task),
                                 on_run=started.append, act=act)
                    )  # fmt: skip
        except (KeyboardInterrupt, Terminated) as e:
            if not started:
                raise
            # the turns so far, unscored: `eval FILE --run N` scores them
            _print_interrupted(latency_summary(store, started[0]), file, repeat, len(cases),
                               as_json, db, e)  # fmt: skip
            exit_stopped(e)
        results = load_results(store, [result["run_id"]])
        verdicts = [r.model_dump(include=VERDICT_FIELDS) for r in results]
    finally:
        store.close()
    failed = failed_cases(results, {c.id for c in cases if c.must_pass})
    gate_failures = gate(result["cases"]["pass_rate"], failed, fail_under)
    keys = ("n", "passed", "pass_rate", "pass_rate_ci")
    by_type = {k: {key: v[key] for key in keys} for k, v in result["by_type"].items()}
    doc = {
        "run_id": result["run_id"],
        "n_cases": result["n_cases"],
        "n_turns": result["n_turns"],
        "repeat": result["repeat"],
        "pass_rate": result["cases"]["pass_rate"],
        "cases": result["cases"],
        "by_type": by_type,
        "by_step": result["by_step"],
        "flip": result["flip"],
        "skipped": result["skipped"],
        "unmatched_turns": result["unmatched_turns"],
        "verdicts": verdicts,  # one per assertion and repeat, with the grader config
        "failed_cases": failed,
        "gate": {"fail_under": fail_under, "failed": gate_failures},
    }
    if as_json:
        print_json(doc)
        if gate_failures or (fail_on_skipped and result["skipped"]):
            raise typer.Exit(1)
        return
    table = Table(title=f"eval run {doc['run_id']}: {doc['n_cases']} cases, {doc['n_turns']} turns")
    table.add_column("")
    table.add_column("passed / n = rate [95% CI]", justify="right")
    table.add_row("[bold]cases[/]", _fmt_rate(result["cases"]))
    for k, v in result["by_type"].items():
        table.add_row(f"type {k}", _fmt_rate(v))
    for k, v in result["by_step"].items():
        table.add_row(f"step {k}", _fmt_rate(v))
    out.print(table)
    flip = result["flip"]
    if flip["n_cases"]:
        fa = flip["assertions"]
        out.print(f"flip rate: {flip['flipped']}/{flip['n_cases']} repeated cases and "
                  f"{fa['flipped']}/{fa['n']} repeated assertions changed verdict")  # fmt: skip
        for key in fa["flipped_assertions"][:10]:
            out.print(f"  flipped: {key}", markup=False)
    for kind, sk in result["skipped"].items():  # one line per kind: how many, and why
        out.print(f"[yellow]skipped {sk['n']} {kind}[/]: " + sk["reason"].replace("[", r"\["))
    if result["unmatched_turns"]:
        out.print(f"[yellow]{result['unmatched_turns']} turns of the run matched no case[/]")
    if failed:
        out.print(f"failed cases ({len(failed)} of {doc['n_cases']}):", markup=False)
        for case in failed:
            mark = " (must pass)" if case["must_pass"] else ""
            out.print(f"  {case['case_id']}{mark}", markup=False)
            for f in case["failed"][:5]:
                where = f" step {f['step']}" if f["step"] else ""
                rep = f" repeat {f['repeat']}" if doc["repeat"] and doc["repeat"] > 1 else ""
                out.print(f"    {f['type']}{where}{rep}: {f['detail']}", markup=False)
    for why in gate_failures:
        out.print(f"[red]gate failed:[/] {escape(why)}")
    if gate_failures or (fail_on_skipped and result["skipped"]):
        raise typer.Exit(1)


def _print_interrupted(
    summary: dict[str, Any], file: Path, repeat: int, n_cases: int, as_json: bool, db: str,
    stopped: BaseException,
) -> None:
    """An eval run stopped by Ctrl-C or SIGTERM: its turns so far (not scored)."""
    run_id = summary["run_id"]
    again = shlex.join(["chainrun", "eval", str(file), "--db", str(db), "--run", str(run_id)])
    hint = f"{again} scores the turns done"
    if as_json:
        print_json({"run_id": run_id, "status": summary["status"], "n_cases": n_cases,
                    "repeat": repeat, "n_turns": summary["n_turns"],
                    "turns": summary["turns"], "scored": False, "score_with": hint})  # fmt: skip
    err.print(interrupted_line("eval", summary, stopped) + f"; {hint}", markup=False)


@app.command("compare")
@handle_errors
def compare_command(
    a: Annotated[str, typer.Argument(help="Run id, or live / live:FROM..TO (ISO times).")],
    b: Annotated[str, typer.Argument(help="Run id, or live / live:FROM..TO (ISO times).")],
    metric: Annotated[
        str, typer.Option(help="all, turn or a step name (turn also gives answer_ttft/_done).")
    ] = "all",
    fail_on_regression: Annotated[
        str | None,
        typer.Option(
            "--fail-on-regression",
            help="Exit 1 when B is worse than A on this metric (any, turn, answer_ttft, "
            "answer_done, a step name, evals).",
        ),
    ] = None,
    fail_on_skipped: Annotated[
        bool,
        typer.Option(
            "--fail-on-skipped",
            help="Exit 1 when either side has an eval assertion without a verdict "
            "(e.g. llm-rubric, no grader).",
        ),
    ] = False,
    min_effect: Annotated[
        str | None,
        typer.Option(
            "--min-effect",
            help="Practical tolerance: a latency difference within it (a share of A's "
            "percentile such as 5%, or a time such as 20ms; 0 for none) is 'same' "
            "(default: 5%).",
        ),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            help="provider: per step TTFT, time per output token and generated tokens, "
            "and whether B is slower from work or from serving.",
        ),
    ] = None,
    db: Annotated[
        list[str] | None,
        typer.Option(
            "--db",
            envvar=DB_ENV,
            help="Run log (a SQLite file or postgresql://...); repeat it to read several "
            "processes' SQLite logs as one (name a run RUN@PROCESS, PROCESS being a log's "
            "file name without suffix).",
        ),
    ] = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare B against A: percentiles with intervals and n, B − A, paired eval pass rates.

    A or B may be ``live``: the turns of every live run (every serving process of a shared
    log) in the --since/--until window (or ``live:FROM..TO``)."""

    from chainrun.analysis.compare import (
        DEFAULT_MIN_EFFECT,
        compare,
        live_window_selectors,
        parse_min_effect,
        regression,
    )
    from chainrun.analysis.provider_compare import compare_providers, differ_only_in_provider
    from chainrun.cli.tables import provider_compare_table
    from chainrun.errors import UserInputError
    from chainrun.log.several_logs import merge_logs
    from chainrun.log.store import Store

    if by is not None and (by != "provider" or metric != "all" or fail_on_regression):
        raise UserInputError(
            f"--by: expected 'provider' (without --metric or --fail-on-regression), got {by!r}"
        )
    if since is not None or until is not None:
        a, b = live_window_selectors(a, b, since, until)
    tolerance = DEFAULT_MIN_EFFECT if min_effect is None else parse_min_effect(min_effect)
    dbs = db or [DEFAULT_DB_PATH]
    merged = merge_logs(dbs) if len(dbs) > 1 else None
    sel_a, sel_b = (merged.run_id(a), merged.run_id(b)) if merged else (a, b)
    with merged.store if merged else Store.open(dbs[0], create=False) as store:
        if by is not None:
            doc = compare_providers(store, sel_a, sel_b)
            if as_json:
                print_json(doc)
            else:
                out.print(provider_compare_table(doc))
            return
        result = compare(store, sel_a, sel_b, metric=metric, min_effect=tolerance)
        # runs that differ only in where steps are served also get the by-provider split
        by_provider = (
            compare_providers(store, sel_a, sel_b)
            if differ_only_in_provider(store, sel_a, sel_b)
            else None
        )
    if merged is not None:
        result["a"]["selector"], result["b"]["selector"] = a, b
        result["logs"] = merged.processes
    metrics = result.pop("metrics")
    doc = {**result, "turn": metrics.get("turn"),
           "steps": {k: v for k, v in metrics.items() if k != "turn"}}  # fmt: skip
    regressed = (
        regression({**result, "metrics": metrics}, fail_on_regression)
        if (fail_on_regression)
        else False
    )
    if as_json:
        print_json({**doc, "by_provider": by_provider, "regression": regressed})
    else:
        _print_compare(doc)
        if by_provider is not None:
            out.print(provider_compare_table(by_provider))
    ev = result.get("evals")
    skipped = ev is not None and any(ev["skipped"][side]["n"] for side in ("a", "b"))
    if regressed or (fail_on_skipped and skipped):
        raise typer.Exit(1)


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.0f}"


def _ci(v: Any) -> str:
    from chainrun.cli.tables import ci_cell

    return ci_cell(v)


def _verdict(m: dict[str, Any]) -> str:
    """The verdict with the difference that decided it: ``worse (p90 +12 [3, 20])``, and
    for ``same`` the tolerance it lies within: ``same (p50 +15 [12, 18] within ±50)``."""
    key = m.get("decided_by")
    if not key:
        return str(m["verdict"])
    d = m["diff"]
    est = d.get(f"{key}_ms")
    shown = "-" if est is None else f"{est:+.0f}"
    cell = f"{m['verdict']} ({key} {shown} {_ci(d.get(f'{key}_ci'))}"
    tol = (d.get("tolerance_ms") or {}).get(key)
    if m["verdict"] == "same" and tol is not None:
        cell += f" within ±{tol:.0f}"
    return cell + ")"


def _print_compare(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from chainrun.analysis.summary import cached_text
    from chainrun.cli.fit import drop_first
    from chainrun.cli.tables import NO_CI, NO_CI_NOTE, turn_counts

    table = Table(title=f"compare A={doc['a']['selector']}  B={doc['b']['selector']}")
    for col in ("", "n A", "n B", "p50 A [95% CI]", "p50 B [95% CI]", "p90 A [95% CI]",
                "p90 B [95% CI]",
                "p99 A [95% CI]", "p99 B [95% CI]", "B−A p50 [CI]", "verdict"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("", "verdict") else "right")
    rows = [
        ("turn", doc["turn"]),
        ("answer TTFT", doc.get("answer_ttft")),
        ("answer done", doc.get("answer_done")),
        *doc["steps"].items(),
    ]
    for name, m in rows:
        if m is None:
            continue
        a, b, d = m["a"], m["b"], m["diff"]
        table.add_row(
            name, str(a["n"]), str(b["n"]),
            f"{_ms(a['p50_ms'])} {_ci(a['p50_ci'])}", f"{_ms(b['p50_ms'])} {_ci(b['p50_ci'])}",
            f"{_ms(a['p90_ms'])} {_ci(a['p90_ci'])}", f"{_ms(b['p90_ms'])} {_ci(b['p90_ci'])}",
            f"{_ms(a['p99_ms'])} {_ci(a['p99_ci'])}", f"{_ms(b['p99_ms'])} {_ci(b['p99_ci'])}",
            f"{_ms(d.get('p50_ms'))} {_ci(d.get('p50_ci'))}", _verdict(m),
        )  # fmt: skip
    notes = [f"A: {turn_counts(doc['a'].get('turns'))}",
             f"B: {turn_counts(doc['b'].get('turns'))}"]  # fmt: skip
    effect = doc.get("min_effect")
    if effect and effect["value"]:
        notes.append(f"min effect {effect['text']}: a difference shown to lie "
                     "within it is 'same' (--min-effect)")  # fmt: skip
    elif effect:
        notes.append("min effect 0: verdicts by the intervals alone (--min-effect)")
    if any(NO_CI in str(cell) for col in table.columns for cell in col.cells):
        notes.append(NO_CI_NOTE)
    table.caption = "\n".join(notes)
    # too narrow: the p99s go first, then the p90s and the n columns (never the verdict)
    drop_first(table, "p99 B [95% CI]", "p99 A [95% CI]", "p90 B [95% CI]", "p90 A [95% CI]",
               "n B", "n A")  # fmt: skip
    out.print(table)
    cache = doc.get("cache")
    if cache:  # the server's prompt cache can change TTFT twentyfold: said beside it
        out.print(f"prompt cache (winning calls' prompt tokens): A {cached_text(cache['a'])}, "
                  f"B {cached_text(cache['b'])}", markup=False)  # fmt: skip
        if cache.get("warning"):
            out.print(f"[yellow]warning:[/] {escape(cache['warning'])}")
    for name, m in doc["steps"].items():
        llm = m.get("llm") if m else None
        if llm and llm.get("explanation"):
            out.print(f"{name}: {llm['explanation']}", markup=False)
        like = (llm or {}).get("like_with_like")
        if like and like["status"] == "compared":
            change = like["ttft"]
            out.print(f"{name}: TTFT over {like['cache_state']} calls only (A n={like['n_a']}, "
                      f"B n={like['n_b']}): B−A p50 {_ms(change['p50_diff'])} "
                      f"{_ci(change['p50_diff_ci'])} ms", markup=False)  # fmt: skip
        elif like:
            out.print(f"{name}: no calls in the same cache state on both sides: no TTFT "
                      "comparison of like with like", markup=False)  # fmt: skip
    grounding = doc.get("grounding")
    if grounding:  # answers with a fact judged false, each side, n, interval, claims judged
        from chainrun.analysis.grounding import rate_text as rate

        shown_a, shown_b = grounding["a"]["shown"], grounding["b"]["shown"]
        out.print(f"ungrounded facts, answers as the shopper received them: "
                  f"A {rate(shown_a)}; B {rate(shown_b)}", markup=False)  # fmt: skip
        model_a, model_b = grounding["a"]["model"], grounding["b"]["model"]
        if model_a["n"] or model_b["n"]:
            out.print(f"... as the model wrote them (the grounding check's records): "
                      f"A {rate(model_a)}; B {rate(model_b)}", markup=False)  # fmt: skip
    sequences = doc.get("sequences")
    if sequences:
        said = _sequence_lines(sequences)
        if said:
            out.print("confidence sequences (valid at every look, alpha "
                      f"{sequences['alpha']}): " + "; ".join(said), markup=False)  # fmt: skip
    by_turn = doc.get("by_turn_index")
    if by_turn:
        out.print(_turn_index_table(by_turn))
    cost = doc.get("cost")
    if cost:
        out.print(_cost_line(cost), markup=False)
    ev = doc.get("evals")
    if ev:
        out.print(f"evals (paired on {ev['n_pairs']} cases): A {_fmt_rate(ev['a'])}, "
                  f"B {_fmt_rate(ev['b'])}, p={ev['p_value']:.3f} → {ev['verdict']}")  # fmt: skip
        for side in ("a", "b"):  # skipped verdicts: counted and named, never dropped
            for kind, sk in ev["skipped"][side]["by_type"].items():
                out.print(f"[yellow]{side.upper()}: skipped {sk['n']} {kind}[/] (in no pass "
                          "rate): " + sk["reason"].replace("[", r"\["))  # fmt: skip
    if doc.get("regressions"):
        out.print(f"[red]regressions:[/] {', '.join(doc['regressions'])}")


def _sequence_lines(sequences: dict[str, Any]) -> list[str]:
    """compare's confidence sequences, one phrase each: estimate, interval, verdict."""
    words = {"answer_ttft": ("answer TTFT, share of requests B answered first", "B faster",
                             "B slower"),
             "pass_rate": ("eval pass rate B - A", "B passes more", "B passes fewer"),
             "ungrounded_rate": ("ungrounded answers B - A", "B more ungrounded",
                                 "B less ungrounded")}  # fmt: skip
    said = []
    for key, (name, higher, lower) in words.items():
        cs = sequences.get(key)
        if not cs or cs["estimate"] is None:
            continue
        at = f" (at n = {cs['decided_at']})" if cs["decided_at"] else ""
        verdict = {"decided_higher": f"decided: {higher}{at}",
                   "decided_lower": f"decided: {lower}{at}"}.get(
            cs["verdict"], "no difference yet" + (" (the data drifted)" if cs["drifted"] else ""))
        said.append(f"{name} {cs['estimate']:.2f} [{cs['lower']:.2f}, {cs['upper']:.2f}], "
                    f"n = {cs['n']}: {verdict}")  # fmt: skip
    return said


def _turn_index_table(by_turn: dict[str, Any]) -> Table:
    """Conversations: the shopper's wait and the answer's prompt tokens per turn index."""
    from rich.table import Table

    table = Table(title="by turn index (paired on conversation id and turn index)")
    from chainrun.cli.fit import drop_first
    from chainrun.cli.tables import usd

    for col in ("turn", "n A", "n B", "answer TTFT p50 A [95% CI]", "B [95% CI]",
                "prompt tokens p50 A", "B", "cached A / B", "pairs", "B−A TTFT p50 [CI]",
                "B−A tokens p50", "cost/turn p50 A", "cost B", "B−A cost p50 [CI]"):  # fmt: skip
        table.add_column(col, justify="right")

    def share(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    def cost(c: dict[str, Any] | None) -> str:
        if not c or not c.get("n"):
            return "-"
        ci = c.get("p50_ci")
        return usd(c["p50_usd"]) + (f" [{usd(ci[0])}, {usd(ci[1])}]" if ci else "")

    for row in by_turn["turns"]:
        a, b, d = row["a"], row["b"], row["paired"]
        table.add_row(
            str(row["turn_index"]), str(a["n_turns"]), str(b["n_turns"]),
            f"{_ms(a['answer_ttft']['p50_ms'])} {_ci(a['answer_ttft']['p50_ci'])}",
            f"{_ms(b['answer_ttft']['p50_ms'])} {_ci(b['answer_ttft']['p50_ci'])}",
            _n(a["prompt_tokens"]["p50_tokens"]), _n(b["prompt_tokens"]["p50_tokens"]),
            f"{share(a.get('cached_share'))} / {share(b.get('cached_share'))}",
            str(d["n_pairs"]),
            f"{_ms(d['answer_ttft_diff']['p50_ms'])} {_ci(d['answer_ttft_diff']['p50_ci'])}",
            _n(d["prompt_tokens_diff"]["p50_tokens"]),
            cost(a.get("cost")), cost(b.get("cost")), cost(d.get("cost_diff")),
        )  # fmt: skip
    return drop_first(table, "B−A cost p50 [CI]", "cost B", "cost/turn p50 A",
                      "B−A tokens p50")


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


def _cost_line(cost: dict[str, Any]) -> str:
    """compare's cost per completed turn: each side's p50 with its interval and mean,
    the turns of unknown cost, and B's mean minus A's."""
    from chainrun.cli.tables import usd

    parts = []
    for side in ("a", "b"):
        c = cost[side]
        if not c["n"]:
            parts.append(f"{side.upper()} unknown ({c['n_unknown']} turns)")
            continue
        ci = c.get("p50_ci")
        interval = f" [{usd(ci[0])}, {usd(ci[1])}]" if ci else " -*"
        unknown = f", {c['n_unknown']} turns unknown" if c["n_unknown"] else ""
        parts.append(f"{side.upper()} p50 {usd(c['p50_usd'])}{interval}, mean "
                     f"{usd(c['mean_usd'])}, n = {c['n']}{unknown}")  # fmt: skip
    diff = cost.get("diff_mean_usd")
    tail = "" if diff is None else f"; B − A mean {'+' if diff >= 0 else '-'}{usd(abs(diff))}"
    return "cost per turn: " + "; ".join(parts) + tail
