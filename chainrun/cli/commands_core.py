"""``chainrun run | replay | runs | show`` and ``chainrun local up | down | status``."""

from __future__ import annotations

import contextlib
import enum
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from chainrun.cli import (
    DB_ENV,
    DEFAULT_DB_PATH,
    ActOpt,
    ConcurrencyOpt,
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
    local_app,
    out,
    print_json,
    run_async,
)
from chainrun.runtime import local_model

if TYPE_CHECKING:
    from chainrun.events import TurnFinished
    from chainrun.log.rows import TurnRow
    from chainrun.replay.run import ReplayRequest

# The library is imported inside each command, when it runs: ``--help`` and ``runs``
# do not pay for the chain, the providers' HTTP stack or the statistics.


#: ``chainrun replay``'s exit status when the run ended without a turn answered ok (every
#: turn refused or errored: a provider that answers nothing usable, a deadline below what
#: the server takes); 2 stays for bad input and failures that stop the run, 130/143 for
#: Ctrl-C/SIGTERM
EXIT_NO_TURN_OK = 1


class PromptCacheMode(enum.StrEnum):
    """``chainrun replay --prompt-cache``: who decides the prompt cache state measured."""

    server = "server"
    off = "off"


@app.command()
@handle_errors
def run(
    message: Annotated[str, typer.Argument(help="The shopper's message.")],
    config: ConfigOpt = None,
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
) -> None:
    """Run one turn through the chain, streaming the answer, then print a per-step table."""
    from chainrun.chain import Chain
    from chainrun.cli.tables import printable, steps_table
    from chainrun.config import load_config
    from chainrun.errors import UserInputError
    from chainrun.events import StepFinished, TokenDelta, TurnFinished
    from chainrun.log.store import Store

    cfg = load_config(config)
    if not message.strip():
        raise UserInputError("message: expected a non-empty message")
    store = Store.open(db)
    steps: list[StepFinished] = []
    finished: list[TurnFinished] = []

    async def go() -> None:
        chain = Chain(cfg, store=store, kind="live", quiet=as_json)
        async with chain:
            async with contextlib.aclosing(chain.stream_turn(message)) as events:
                async for ev in events:
                    if isinstance(ev, TokenDelta) and ev.step == cfg.answer_step and not as_json:
                        out.print(printable(ev.text), end="", markup=False)
                    elif isinstance(ev, StepFinished):
                        steps.append(ev)
                    elif isinstance(ev, TurnFinished):
                        finished.append(ev)

    try:
        run_async(go())
    finally:
        store.close()
    turn = finished[0]
    steps.sort(key=lambda s: cfg.order.index(s.step))  # concurrent steps end in any order
    if as_json:
        print_json({
            "run_id": turn.run_id, "turn_id": turn.turn_id, "status": turn.status,
            "label": turn.label, "output": turn.output, "duration_ms": round(turn.duration_ms, 1),
            "answer_ttft_ms": turn.answer_ttft_ms, "answer_done_ms": turn.answer_done_ms,
            "verdicts": turn.verdicts,
            "steps": [
                {"step": s.step, "status": s.status, "model": s.model,
                 "reasoning_effort": s.reasoning_effort, "ttft_ms": s.ttft_ms,
                 "duration_ms": round(s.duration_ms, 1), "output_tokens": s.output_tokens,
                 "n_attempts": s.n_attempts, "error_type": s.error_type,
                 "started_offset_ms": round(s.started_offset_ms, 1),
                 "post_answer": s.post_answer}
                for s in steps
            ],
        })  # fmt: skip
        return
    out.print()
    if turn.status != "ok":
        failed = ", ".join(f"{s.step}: {s.error_type}" for s in steps if s.error_type)
        why = f" ({escape(failed)})" if failed else ""
        out.print(f"[yellow]turn {turn.status}[/]{why}: {escape(printable(turn.output))}")
    out.print(steps_table(steps, turn))


@app.command()
@handle_errors
def replay(
    file: Annotated[Path, typer.Argument(help="Replay set: JSON Lines with id and message.")],
    concurrency: ConcurrencyOpt = 1,
    label: LabelOpt = None,
    config: ConfigOpt = None,
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
    resume: Annotated[
        int | None,
        typer.Option(
            help="Run the requests this run has not answered yet, into it (after a "
            "crash, a kill or a provider outage: those with no turn, or whose turns ended "
            "cancelled or error, or refused because the provider was down), with the run's "
            "own config."
        ),
    ] = None,
    prompt_cache: Annotated[
        PromptCacheMode,
        typer.Option(
            "--prompt-cache",
            help="server: the server's prompt cache decides (the summaries say the cached "
            "share); off: ask llama-server not to reuse cached prompts (cache_prompt: "
            "false on every Chat Completions request), so every TTFT includes the whole "
            "prompt. OpenAI and Azure cache on their own: no request can turn it off.",
        ),
    ] = PromptCacheMode.server,
    act: ActOpt = False,
) -> None:
    """Run a fixed request set as one run; print a headline (turns ok, the answer's TTFT),
    p50/p90 per turn and per step with n, then warnings. Exits 1 when no turn ended ok."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from chainrun.analysis.summary import answered_summary, hedge_stats, latency_summary
    from chainrun.cli.tables import cost_line, hedge_table, latency_table, run_headline
    from chainrun.config import load_config
    from chainrun.errors import UserInputError
    from chainrun.evals.expectations import quality_line, score_expectations
    from chainrun.replay.run import load_requests
    from chainrun.replay.session import open_replay, run_replay, without_prompt_cache

    if resume is not None and config is not None:
        raise UserInputError("--resume uses the run's own config; leave out --config")
    if resume is not None and prompt_cache is not PromptCacheMode.server:
        raise UserInputError("--resume uses the run's own config; leave out --prompt-cache")
    cfg = load_config(config) if resume is None else None
    if cfg is not None and prompt_cache is PromptCacheMode.off:
        cfg = without_prompt_cache(cfg, lambda line: err.print(
            f"chainrun: warning: {line}", markup=False, highlight=False))  # fmt: skip
    opened = open_replay(file, db, cfg, resume)  # the file checked before any run exists
    quality: dict[str, Any] | None = None
    progress = Progress(
        TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=err, transient=True,
        disable=as_json or not err.is_terminal,  # a bar in a log file is noise
    )  # fmt: skip
    task = progress.add_task("", total=len(opened.requests))

    def on_turn(req: ReplayRequest, done: TurnFinished) -> None:
        progress.update(task, advance=1, description=f"{escape(req.id)}: {done.status}")

    try:
        with progress:
            end = run_replay(opened, file=file, db=db, resume_run=resume,
                             concurrency=concurrency, label=label, act=act, quiet=as_json,
                             on_turn=on_turn, runner=run_async,
                             stop_errors=(KeyboardInterrupt, Terminated))  # fmt: skip
        if end.run_id is None:  # stopped while the chain opened: say so, not a bare word
            assert end.stopped is not None
            how = "terminated" if isinstance(end.stopped, Terminated) else "interrupted"
            what = "no run was made and nothing was logged"
            if resume is not None:
                what = f"run {resume} got no new turn; {end.again} runs the rest"
            err.print(f"chainrun: replay {how} before its first turn (while the chain "
                      f"was starting: its providers' startup checks, the models it "
                      f"loads): {what}", markup=False, highlight=False)  # fmt: skip
            exit_stopped(end.stopped)
        run_id = end.run_id
        if end.log_unreachable:  # the database away: what was answered, from memory
            summary = answered_summary(run_id, "replay", "log unreachable", end.finished)
            hedging: dict[str, Any] = {"steps": {}}
        else:
            summary, hedging = latency_summary(opened.store, run_id), hedge_stats(
                opened.store, run_id)
            if run_id is not None and any(r.expect for r in opened.requests):
                # the answers against what the replay set expects of them (all its lines:
                # a resumed run's earlier turns count too)
                quality = run_async(score_expectations(opened.store, run_id,
                                                       load_requests(file)))
    finally:
        opened.store.close()
    stopped, lost = end.stopped, end.lost
    none_ok = stopped is None and lost is None and not summary["turns"]["n_completed"]
    if as_json:
        doc = {**summary, "hedging": hedging["steps"]}
        if quality is not None:
            doc["quality"] = quality
        if lost is not None:
            doc["lost_turns"] = [t.as_dict() for t in lost.lost]
            doc["error"] = lost.as_dict()
        print_json(doc)
    else:
        # what the shopper got and waited first, then the tables, then the warnings
        headline = run_headline(summary)
        if none_ok:
            headline += f"; exit {EXIT_NO_TURN_OK}: no turn ok"
        out.print(headline, markup=False)
        if quality is not None:
            out.print(quality_line(quality), markup=False, highlight=False)
        costs = cost_line(summary)
        if costs is not None:
            out.print(costs, markup=False)
        out.print(latency_table(summary))
        if any(s["n_armed"] for s in hedging["steps"].values()):
            out.print(hedge_table(hedging))
    if stopped is None and lost is None:
        _warn_failed_turns(store_path=db, run_id=run_id)
    if end.log_unreachable:  # the database away: one line, what was lost and how
        n = end.dropped_writes
        what = f"{n} log writes" if n else "its pending log writes"
        err.print(f"chainrun: error: run log {db} could not be reached: {what}"
                  f" of run {run_id} were lost (its {len(end.finished)} turns answered are "
                  f"summarised above, from memory); once the database is back, {end.again} "
                  "runs the rest", markup=False, highlight=False)  # fmt: skip
        raise typer.Exit(2)
    if lost is not None:
        for line in lost.lines():
            err.print(f"chainrun: error: {line}", markup=False, highlight=False)
        err.print(f"chainrun: run {run_id} ended lost_turns; {end.again} runs them again",
                  markup=False, highlight=False)  # fmt: skip
        raise typer.Exit(2)
    if stopped is not None:
        err.print(interrupted_line("replay", summary, stopped) + f"; {end.again} runs the rest",
                  markup=False)  # fmt: skip
        exit_stopped(stopped)
    if none_ok:
        raise typer.Exit(EXIT_NO_TURN_OK)


@app.command()
@handle_errors
def runs(
    limit: Annotated[
        int, typer.Option(min=1, max=100_000, help="How many runs per log (newest first).")
    ] = 20,
    db: Annotated[
        list[str] | None,
        typer.Option(
            "--db",
            envvar=DB_ENV,
            help="Run log (a SQLite file or postgresql://...); repeat it to list several "
            "processes' SQLite logs (each run also named RUN@PROCESS, as compare takes it).",
        ),
    ] = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the runs in the log (or in each of several logs), newest first. On a shared
    log (PostgreSQL) every serving process has its own live run; --since/--until keep the
    runs that were running at some time in that window."""
    from rich.table import Table

    from chainrun.log.several_logs import process_name, process_names
    from chainrun.log.store import Store
    from chainrun.log.time_window import log_window
    from chainrun.replay.hints import resume_command

    dbs = db or [DEFAULT_DB_PATH]
    if len(dbs) > 1:
        process_names(dbs)  # two logs of one name could not be told apart in compare
    lo, hi = log_window(since, until)
    keys = ("id", "kind", "label", "status", "n_turns", "started_at", "ended_at", "source")
    listed: list[tuple[str, list[dict[str, Any]]]] = []
    for path in dbs:
        with Store.open(path, create=False) as store:
            found = store.list_runs(limit, since=lo, until=hi)
            name = store.name
        rows = []
        for run in found:
            row = run.model_dump(include=set(keys))
            writer = (run.meta or {}).get("writer") or {}  # the process that wrote it
            row["process"] = f"{writer.get('host')}:{writer.get('pid')}" if writer else None
            rows.append(row)
        if len(dbs) > 1:
            for r in rows:
                r.update(log=str(path), selector=f"{r['id']}@{process_name(path)}")
        listed.append((name, rows))
    if as_json:
        print_json({"runs": [r for _, rows in listed for r in rows]})
        return
    for path, rows in listed:
        cols = (*keys, "process") if len(dbs) == 1 else ("selector", *keys, "process")
        table = Table(title=f"runs in {path}")
        for k in cols:
            table.add_column(k)
        for r in rows:
            table.add_row(*("" if r[k] is None else str(r[k]) for k in cols))
        out.print(table)
    for path, rows in listed:  # how to go on with a replay that did not finish
        for r in rows:
            if r["kind"] == "replay" and r["status"] in ("interrupted", "failed") and r["source"]:
                again = resume_command(r["source"], path, r["id"])
                out.print(f"run {r['id']} is {r['status']} after {r['n_turns']} turns: "
                          f"{again} runs the rest", markup=False, highlight=False)  # fmt: skip


@app.command()
@handle_errors
def show(
    run_id: Annotated[int, typer.Argument(help="Run id (see `chainrun runs`).")],
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
) -> None:
    """Show a run: its turns, and each turn's steps and calls."""
    from rich.table import Table

    from chainrun.analysis.summary import latency_summary, run_detail
    from chainrun.cli.fit import drop_first
    from chainrun.cli.tables import (
        cancelled_check_lines,
        cost_line,
        cost_text,
        latency_table,
        marked_verdict_lines,
        printable,
        run_headline,
        server_table,
        skipped_lines,
        step_waterfall,
        tool_call_lines,
        tool_calls_table,
        turn_times,
        usd,
    )
    from chainrun.log.store import Store
    from chainrun.pricing import price_book

    with Store.open(db, create=False) as store:
        detail = run_detail(store, run_id)
        summary = latency_summary(store, run_id)
        turns, steps, calls = store.turns(run_id), store.steps(run_id), store.calls(run_id)
        tool_calls = store.tool_calls(run_id)
        book = price_book(store.get_run(run_id).config)
    if as_json:
        print_json({**detail, "summary": summary})
        return
    out.print(f"run {run_id}: {detail['kind']} {detail['status']} "
              f"label={detail['label'] or '-'} source={detail['source'] or '-'}",
              markup=False)  # fmt: skip
    by_id = {t.id: t for t in turns}
    # per turn, in the log's order (one pass over the rows, not one per turn)
    calls_of: dict[int | None, list[Any]] = {}
    for c in calls:
        calls_of.setdefault(c.turn_id, []).append(c)
    steps_of: dict[int | None, list[Any]] = {}
    for s in steps:
        steps_of.setdefault(s.turn_id, []).append(s)
    tools_of: dict[int | None, list[Any]] = {}
    for tc in tool_calls:
        tools_of.setdefault(tc.turn_id, []).append(tc)
    groups = detail["conversations"]
    grouped = any(len(g["turn_ids"]) > 1 for g in groups)  # a run with conversations
    order: list[tuple[dict[str, Any] | None, TurnRow]] = []
    for g in groups:
        for i, tid in enumerate(g["turn_ids"]):
            order.append((g if grouped and i == 0 else None, by_id[tid]))
    if not grouped:
        order = [(None, t) for t in turns]
    for group, t in order:
        if group is not None:
            out.print(f"\n[bold]conversation {escape(str(group['conversation_id']))}[/] "
                      f"({len(group['turn_ids'])} turns)")  # fmt: skip
        place = f" #{t.turn_index}" if grouped and t.turn_index is not None else ""
        cut = " [yellow](answer cut at the token cap)[/]" if t.truncated else ""
        turn_calls = calls_of.get(t.id, [])
        label = t.label or ("unknown" if t.status == "lost" else "-")  # lost: never classified
        out.print(f"\n[bold]turn {t.id}{place}[/] ({escape(t.request_id or '-')}) "
                  f"{escape(turn_times(t))}{cut}, "
                  f"cost {escape(cost_text(book.total(turn_calls).as_json()))}, "
                  f"label={escape(label)}")  # fmt: skip
        out.print(f"  > {printable(t.input)}", markup=False)
        if t.output is None and t.status == "lost":
            out.print("  < (no answer: the turn was lost)", markup=False)
        elif t.output is None:  # nothing reached the shopper (failed, or cancelled first)
            out.print("  < (no answer)", markup=False)
        else:
            out.print(f"  < {printable(t.output)}", markup=False)
        for line in marked_verdict_lines(t.verdicts):  # validate's verdict, the critique, ...
            out.print(f"  {line}", markup=False)
        turn_steps = steps_of.get(t.id, [])
        if turn_steps:  # a lost turn logged none: no empty table
            out.print(step_waterfall(turn_steps))
        for line in skipped_lines(turn_steps):  # why a routed step did not run
            out.print(f"  {line}", markup=False)
        for line in cancelled_check_lines(t.status, turn_steps):  # an answered turn's cut checks
            out.print(f"  {line}", markup=False)
        table = Table(show_edge=False)
        for col in ("step", "attempt", "outcome", "target", "ttft_ms", "duration_ms",
                    "chunks", "in", "cached", "out", "reasoning", "cost", "finish",
                    "error"):  # fmt: skip
            table.add_column(col)
        for c in turn_calls:
            table.add_row(
                escape(c.step), str(c.attempt), c.outcome, escape(c.target or '-'),
                _ms(c.ttft_ms), _ms(c.duration_ms), str(c.n_chunks),
                _n(c.input_tokens), _n(c.cached_input_tokens), _n(c.output_tokens),
                _n(c.reasoning_tokens), usd(book.cost(c)),
                str(c.finish_reason or ""), str(c.error_type or ""),
            )  # fmt: skip
        drop_first(table, "reasoning", "finish", "chunks", "target", "in", "cost", "error")
        if turn_calls:
            out.print(table)
        turn_tools = tools_of.get(t.id, [])
        if turn_tools:
            out.print(tool_calls_table(turn_tools))
            for line in tool_call_lines(turn_tools):
                out.print(f"  tool {line}", markup=False, soft_wrap=True)
    out.print()
    out.print(run_headline(summary), markup=False)
    costs = cost_line(summary)
    if costs is not None:
        out.print(costs, markup=False)
    out.print(latency_table(summary))
    servers = server_table(calls)
    if servers is not None:
        out.print(servers)


def _ms(v: Any) -> str:
    return "" if v is None else f"{v:.0f}"


def _n(v: Any) -> str:
    return "?" if v is None else str(v)


@local_app.command("up")
@handle_errors
def local_up(
    slots: Annotated[
        int, typer.Option(min=1, help="Parallel slots (-np).")
    ] = local_model.DEFAULT_SLOTS,
    as_json: JsonOpt = False,
) -> None:
    """Start llama-server with the local Gemma model on a free loopback port."""
    server = local_model.up(slots=slots, quiet=as_json)
    _print_server(server, as_json, "running")


@local_app.command("down")
@handle_errors
def local_down(
    force: Annotated[
        bool, typer.Option("--force", help="Also stop servers other installs started.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Stop this install's local model server (another install's only with --force)."""
    stopped = local_model.down(force=force)
    if as_json:
        print_json({"stopped": bool(stopped), "pid": stopped[0].pid if stopped else None,
                    "servers": [_server_doc(s) for s in stopped]})  # fmt: skip
        return
    if not stopped:
        out.print("not running")
    for s in stopped:
        out.print(f"stopped: {local_model.describe(s)}", markup=False)


@local_app.command("replicas")
@handle_errors
def local_replicas(
    n: Annotated[int, typer.Argument(min=0, help="Replicas to start (0: only list them).")] = 0,
    slots: Annotated[int, typer.Option(min=1, help="Parallel slots (-np) of each.")] = 2,
    stop: Annotated[
        bool, typer.Option("--stop", help="Stop the replicas this install started.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Start N replicas of the local model on free loopback ports, for a provider's
    replicas = [...] (not the install's local model server: local down leaves them)."""
    from chainrun.runtime import local_replicas

    if stop:
        gone = local_replicas.stop()
        if as_json:
            print_json({"stopped": [r.pid for r in gone]})
        else:
            out.print(f"stopped {len(gone)} replica(s)")
        return
    if n:
        local_replicas.start(n, slots=slots)
    urls = [r.base_url for r in local_replicas.running()]
    if as_json:
        print_json({"replicas": urls})
        return
    if not urls:
        out.print("no replicas running")
        return
    out.print("replicas = [" + ", ".join(f'"{u}"' for u in urls) + "]", markup=False)


@local_app.command("status")
@handle_errors
def local_status(as_json: JsonOpt = False) -> None:
    """Report whether this install's local model server is running, and where (and any
    server another install started)."""
    server = local_model.status()
    others = local_model.others()
    if as_json:
        doc = _server_doc(server) if server else {"running": False}
        print_json({**doc, "others": [_server_doc(s) for s in others]})
        return
    if server is None:
        out.print("not running")
    else:
        _print_server(server, as_json, "running")
    for s in others:
        out.print(f"another install's server: {local_model.describe(s)} "
                  "(chainrun local down --force stops it)", markup=False)  # fmt: skip


def _server_doc(server: local_model.LocalServer) -> dict[str, Any]:
    return {"running": True, "pid": server.pid, "port": server.port,
            "base_url": server.base_url, "model_path": server.model_path,
            "binary": server.binary, "checkout": server.checkout,
            "log": server.log_path}  # fmt: skip


def _print_server(server: local_model.LocalServer, as_json: bool, state: str) -> None:
    if as_json:
        print_json(_server_doc(server))
    else:
        out.print(f"{state}: {server.base_url} (pid {server.pid}, started by the chainrun in "
                  f"{server.checkout}, log {server.log_path})", markup=False)  # fmt: skip


def _warn_failed_turns(store_path: str, run_id: int) -> None:
    """Stderr lines after a run's tables, each said once: the turns that did not end ok
    (by status, with the step failures inside them; a server that answers but is not an
    OpenAI-compatible API completes a run of refusals), then, apart, the ok turns
    answered with a step that failed open (its failure let the turn through unchecked),
    then one line for every step that ran out of time, naming the settings to raise
    (:func:`_timeout_hint`). Where to look (``chainrun show``) is said on the first."""
    from chainrun.log.store import Store

    with Store.open(store_path, create=False) as store:
        config = store.get_run(run_id).config
        turns = store.turns(run_id)
        status_of = {t.id: t.status for t in turns}
        in_not_ok: Counter[str] = Counter()
        open_in_ok: Counter[str] = Counter()
        ok_turns_hit: set[int | None] = set()
        for s in store.steps(run_id):
            if s.status not in ("failed_open", "failed_closed"):
                continue
            key = f"{s.step}:{s.error_type}"
            if status_of.get(s.turn_id) == "ok":
                open_in_ok[key] += 1
                ok_turns_hit.add(s.turn_id)
            else:
                in_not_ok[key] += 1
    lines = []
    not_ok = Counter(t.status for t in turns if t.status != "ok")
    if not_ok:
        by_status = ", ".join(f"{n} {status}" for status, n in not_ok.most_common())
        steps = f"; failed steps in them: {_kinds(in_not_ok)}" if in_not_ok else ""
        lines.append(f"{sum(not_ok.values())} of {len(turns)} turns not ok ({by_status}{steps})")
    if open_in_ok:
        n_ok = len(turns) - sum(not_ok.values())
        lines.append(f"{len(ok_turns_hit)} of {n_ok} ok turns answered with a step failed "
                     f"open ({_kinds(open_in_ok)})")  # fmt: skip
    if lines:
        lines[0] += f"; see chainrun show {run_id}"
    hint = _timeout_hint(config, in_not_ok + open_in_ok)
    if hint is not None:
        lines.append(hint)
    for line in lines:
        err.print(f"chainrun: warning: {line}", markup=False, highlight=False)


#: a step's error type when it ran out of time -> the setting that bounds it, and its name
_TIME_LIMITS = {
    "timeout": ("deadline_s", "its deadline"),
    "first_token_timeout": ("first_token_timeout_s", "its first-token timeout"),
    "idle_timeout": ("idle_timeout_s", "its idle timeout"),
}


def _timeout_hint(config: str | None, failures: Counter[str]) -> str | None:
    """One line for every step and time limit it ran out of (``failures``:
    ``{"step:error_type": n}``), naming each setting to raise and its value in the run's
    config snapshot, and the advice once; None when no step ran out of time."""
    from chainrun.config import config_from_snapshot
    from chainrun.errors import ConfigError

    try:
        cfg = config_from_snapshot(config or "", "the run") if config else None
    except ConfigError:
        cfg = None
    parts, settings = [], []
    for key, n in failures.most_common():
        step, _, error_type = key.partition(":")
        if error_type not in _TIME_LIMITS:
            continue
        setting, what = _TIME_LIMITS[error_type]
        value = getattr(cfg.steps.get(step), setting, None) if cfg is not None else None
        now = f" = {value:g} s" if isinstance(value, int | float) else ""
        turns = "turn" if n == 1 else "turns"
        parts.append(f"{step} ran out of {what} in {n} {turns} (steps.{step}.{setting}{now})")
        settings.append(f"[steps.{step}] {setting}")
    if not parts:
        return None
    which = "it" if len(parts) == 1 else "them"
    return (f"{', '.join(parts)}: a server slower than that here needs more; raise {which} "
            f"({', '.join(settings)} in the chain's config) or use a faster model or "
            "server")  # fmt: skip


def _kinds(counts: Counter[str]) -> str:
    """``step:error_type ×n``, the four most frequent, most frequent first."""
    return ", ".join(f"{k} ×{n}" for k, n in counts.most_common(4))
