"""The ``chainrun`` command line: a thin layer over the library (parse, call, print).

Start-up: ``chainrun --help`` and every command's ``--help`` import only typer, rich and
the command modules; a command imports the library it needs when it runs (the chain,
the HTTP stack, statistics, plots), so that ``--help`` and ``runs`` start fast
(``benchmarks/cli_startup.py``).

Every command takes ``--json`` (one JSON document on stdout instead of tables) and,
where it touches the log, ``--db``. A user mistake or a provider failure is printed
as one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import importlib.abc
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from typer._click import exceptions as _cx  # typer carries its own click
from typer.core import TyperGroup
from typer.exceptions import TyperException

from chainrun.cli.grid import fitted


def _refuse_repeated_options(ctx: Any, name: str | None, cmd: Any, args: list[str]) -> None:
    """Raise a usage error when an option that takes one value is given more than once.

    click keeps the last value of a repeated single-value option and drops the others
    without a word (``chainrun runs --db a --db b`` showed b only); an option meant to
    repeat is declared ``multiple`` (``compare --db``) and is not refused. Flags may repeat.
    """
    sub = cmd.context_class(cmd, info_name=name, parent=ctx, resilient_parsing=True)
    try:
        _, _, order = cmd.make_parser(sub).parse_args(args=list(args))
    except _cx.UsageError:
        return  # the real parse reports it
    seen: dict[int, int] = {}
    for param in order:
        seen[id(param)] = seen.get(id(param), 0) + 1
        if seen[id(param)] != 2 or getattr(param, "param_type_name", "") != "option":
            continue
        if param.multiple or getattr(param, "is_flag", False) or getattr(param, "count", False):
            continue
        opt = max(param.opts, key=len)
        raise _cx.UsageError(
            f"{opt} given more than once; it takes one value (the last would be used "
            "silently)",
            ctx=sub,
        )


class _StderrFormatter(logging.Formatter):
    """``chainrun: warning: ...`` for warnings and errors, ``chainrun: ...`` for progress."""

    def format(self, record: logging.LogRecord) -> str:
        level = "warning: " if record.levelno >= logging.WARNING else ""
        return f"chainrun: {level}{record.getMessage()}"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (a test runner may
    swap it between commands), never to the stream it saw when it was made."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def log_to_stderr() -> None:
    """Show the library's log on stderr, one line a message: its warnings, and the
    operator-facing progress of ``chainrun.progress`` (starting the local model). The
    library itself never prints; the CLI attaches this handler once per process."""
    root = logging.getLogger("chainrun")
    if any(isinstance(h, _StderrHandler) for h in root.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(_StderrFormatter())
    handler.setLevel(logging.INFO)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("chainrun.progress").setLevel(logging.INFO)


class _OneLineErrors(TyperGroup):
    """A group of commands: a usage error (a missing argument, an unknown option, a bad
    value, an option that takes one value given twice) prints one line and exits 2,
    instead of click's usage block or typer's box."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not isinstance(cmd, TyperGroup):
            _refuse_repeated_options(ctx, name, cmd, rest)
        return name, cmd, rest

    def main(  # type: ignore[override]
        self, args: Any = None, prog_name: str | None = None, *,
        standalone_mode: bool = True, **extra: Any,
    ) -> Any:  # fmt: skip
        log_to_stderr()
        if not standalone_mode:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, standalone_mode=False, **extra)
        except _cx.NoArgsIsHelpError as e:
            assert e.ctx is not None
            typer.echo(e.ctx.get_help())
            sys.exit(2)
        except _cx.UsageError as e:
            cmd = e.ctx.command_path if e.ctx is not None else "chainrun"
            typer.echo(f"{cmd}: error: {e.format_message()} (see '{cmd} --help')", err=True)
            sys.exit(2)
        except _cx.ClickException as e:
            typer.echo(f"chainrun: error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("chainrun: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


class _App(typer.Typer):
    """``typer.Typer`` whose help is click's plain text (``rich_markup_mode=None``, typer's
    documented switch): it wraps every line at the terminal's width and never cuts a word
    with "…", as rich's help panels did to an option's help column at 80 columns (an
    environment variable or a URL lost its end); and ``--help`` loads no rich layout."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("rich_markup_mode", None)
        super().__init__(**kwargs)


app = _App(
    name="chainrun",
    cls=_OneLineErrors,
    help="Run multi-step LLM chains fast and measurably: hedged steps, TTFT and tokens in SQLite.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
local_app = _App(
    cls=_OneLineErrors, no_args_is_help=True,
    help="Start, stop and inspect the embedded local model server.",
)  # fmt: skip
lab_app = _App(
    cls=_OneLineErrors, no_args_is_help=True,
    help="The latency lab: an OpenAI-compatible server with known latencies.",
)  # fmt: skip
catalog_app = _App(
    cls=_OneLineErrors, no_args_is_help=True,
    help="The product catalogue the retrieve step searches.",
)  # fmt: skip
config_app = _App(
    cls=_OneLineErrors, no_args_is_help=True,
    help="The chain's configuration: print the effective config.",
)  # fmt: skip
log_app = _App(
    cls=_OneLineErrors, no_args_is_help=True,
    help="The run log itself: copy runs from one log into another.",
)  # fmt: skip
app.add_typer(local_app, name="local")
app.add_typer(catalog_app, name="catalog")
app.add_typer(log_app, name="log")
app.add_typer(lab_app, name="lab")
app.add_typer(config_app, name="config")

# Outside a terminal rich would squeeze tables into 80 columns; tables of timings read
# better wide (COLUMNS, else 120).
_width = None if sys.stdout.isatty() else shutil.get_terminal_size((120, 24)).columns
#: exit status when the reader of stdout went away (``chainrun show 1 | head -1``): that
#: of a process killed by SIGPIPE (128 + 13), as Unix tools (cat, seq) give, with no message
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def exit_broken_pipe() -> NoReturn:
    """Exit quietly with :data:`EXIT_BROKEN_PIPE`; stdout is pointed at /dev/null first so
    the interpreter's final flush does not fail again (Python docs, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(EXIT_BROKEN_PIPE)


class _Console(Console):
    """rich's console, exiting as :func:`exit_broken_pipe` says when stdout's reader left
    (rich's own exits 1, which reads as a failure)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        exit_broken_pipe()

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """rich's print; a table is fitted to the width first (:func:`fit_table`: numbers
        are never cut, columns are left out in a stated order when too narrow), and a
        plain one drawn without rich's layout (:func:`chainrun.cli.grid.fitted`: the same
        output, a small part of the time)."""
        super().print(*(fitted(o) if isinstance(o, Table) else o for o in objects), **kwargs)


out = _Console(highlight=False, soft_wrap=True, width=_width)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# shared options (the pattern of simonw/llm: one definition, many commands)
#: the environment variable every command (and ``chainrun serve``) reads the log from
DB_ENV = "CHAINRUN_DB"
DbOpt = Annotated[
    str,
    typer.Option(
        "--db",
        envvar=DB_ENV,
        help="Run log: a SQLite file, or a PostgreSQL database as postgresql://USER@HOST/DB "
        f"(default: ${DB_ENV}, else chainrun.db).",
        show_default=True,
    ),
]
SinceOpt = Annotated[
    str | None,
    typer.Option(
        "--since",
        help="Live traffic from this time on (ISO-8601, UTC unless it says otherwise, "
        "e.g. 2026-12-01T15:00).",
    ),
]
UntilOpt = Annotated[
    str | None,
    typer.Option(
        "--until",
        help="Live traffic before this time (ISO-8601; a date alone includes that day).",
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="chainrun.toml (default: ./chainrun.toml or built-in)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
#: ``--act``: a replay or an eval carries out tools with side effects (default: stubbed)
ActOpt = Annotated[
    bool,
    typer.Option("--act", help="Carry out tools with side effects (place orders, fill carts) "
                 "as live traffic does. Default: they are stubbed ([tools.NAME] replay)."),
]
ConcurrencyOpt = Annotated[int, typer.Option(min=1, help="Turns in flight at once.")]
LabelOpt = Annotated[str | None, typer.Option(help="A label for the run.")]
DEFAULT_DB_PATH = "chainrun.db"

F = TypeVar("F", bound=Callable[..., Any])


def fail(
    message: str, code: int = 2, *, as_json: bool = False, error: dict[str, Any] | None = None
) -> None:
    """Print one error line on stderr and exit with ``code``.

    With ``as_json`` the error is also one JSON document on stdout,
    ``{"error": {"type", "message", "file", "line"}}`` (``error`` gives those fields;
    default: type ``error``, no file), so a script reading stdout never gets plain text.
    """
    if as_json:
        doc = error or {"type": "error", "message": message, "file": None, "line": None}
        print_json({"error": doc})
    shown = message.replace("[", r"\[")  # a message is text, not rich markup
    err.print(f"[bold red]chainrun: error:[/] {shown}", markup=True, highlight=False)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn chainrun's exceptions into one line on stderr and exit code 2 (with ``--json``,
    also one JSON error document on stdout: see :func:`fail`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        db = kwargs.get("db")
        # a log file this command creates and then fails before a run: removed, not left
        # empty (a database on a server is never removed)
        new_log = (
            Path(db) if isinstance(db, str) and "://" not in db and not Path(db).exists() else None
        )
        try:
            try:
                return fn(*args, **kwargs)
            except BaseException:
                if new_log is not None:
                    from chainrun.log.opening import remove_unused_log  # only on failure

                    remove_unused_log(new_log)
                raise
        except KeyboardInterrupt:
            err.print("chainrun: interrupted")
            raise typer.Exit(130) from None
        except Terminated:
            err.print("chainrun: terminated")
            raise typer.Exit(143) from None
        except Exception as e:
            from chainrun.errors import ChainrunError  # loaded by then if it was raised

            if isinstance(e, ChainrunError):
                fail(str(e), as_json=as_json, error=e.as_dict())
            if type(e).__module__.startswith(("psycopg", "psycopg_pool")):
                # the PostgreSQL log went away mid-command, or refused a statement
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                message = f"the log database failed ({type(e).__name__}: {first})"
                fail(message, as_json=as_json, error={"type": "database_error",
                                                      "message": message, "file": None,
                                                      "line": None})  # fmt: skip
            if not _database_error(e):  # e.g. another process holds a write lock
                raise
            where = f"{db}: " if db is not None else ""
            what = "is not writable" if "readonly" in str(e) else "is busy or unwritable"
            message = f"{where}the log database {what} ({e})"
            fail(message, as_json=as_json, error={"type": "database_error", "message": message,
                                                  "file": None if db is None else str(db),
                                                  "line": None})  # fmt: skip

    return wrapper  # type: ignore[return-value]


def _database_error(e: BaseException) -> bool:
    """Whether ``e`` is SQLite's ``OperationalError`` (of the sqlite3 module sqlite-utils
    uses: pysqlite3's when installed), imported only when an error is being reported."""
    from sqlite_utils.utils import sqlite3

    return isinstance(e, sqlite3.OperationalError)


def print_json(doc: Any) -> None:
    """Print one JSON document on stdout (no rich markup, no wrapping)."""
    try:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        exit_broken_pipe()


def interrupted_line(
    command: str, summary: dict[str, Any], stopped: BaseException | None = None
) -> str:
    """One stderr line for a run stopped by Ctrl-C or SIGTERM (``stopped``: the
    :class:`KeyboardInterrupt` or :class:`Terminated`; it says ``terminated`` for the
    latter): its id and its turns so far (``summary`` is
    :func:`chainrun.analysis.summary.latency_summary`'s). The command then leaves with
    :func:`exit_stopped`, so this is the only line that says it stopped."""
    c = summary["turns"]
    done = c["n_completed"] + c["n_cut"] + c["n_refused"] + c["n_replaced"] + c["n_errored"]
    how = "terminated" if isinstance(stopped, Terminated) else "interrupted"
    return (f"chainrun: {command} {how}: run {summary['run_id']} has {done} turns "
            f"answered ({c['n_completed']} completed), {c['n_cancelled']} cancelled in "
            "flight")  # fmt: skip


class Terminated(Exception):
    """The command received SIGTERM (its work was cancelled and logged as such)."""


def exit_stopped(stopped: BaseException) -> NoReturn:
    """Leave a command stopped by Ctrl-C (exit 130) or SIGTERM (:class:`Terminated`, exit
    143) whose own line (:func:`interrupted_line`) already said so: no second line."""
    raise typer.Exit(143 if isinstance(stopped, Terminated) else 130)


def run_async(coro: Any) -> Any:
    """Run ``coro``. SIGTERM cancels it like Ctrl-C does, so that a terminated command
    cancels its turns, logs them as cancelled and marks its run ``interrupted``."""
    import asyncio  # a command that runs a coroutine: not paid by --help

    from chainrun.runtime.event_loop import loop_factory

    async def main() -> Any:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        terminated = False

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await coro
        except asyncio.CancelledError:
            if terminated:
                raise Terminated() from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    # uvloop when installed (the uvloop extra; chainrun.runtime.event_loop), else asyncio's loop
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main())


# The commands live in one module per noun; importing them registers them on `app`.
from chainrun.cli import (  # noqa: E402,F401
    commands_audit,
    commands_config,
    commands_core,
    commands_eval,
    commands_hedge,
    commands_lab,
    commands_log,
    commands_retrieve,
    commands_review,
    commands_serve,
)


class _NoNumpyForSqliteUtils(importlib.abc.MetaPathFinder):
    """Keeps NumPy out of the import of ``sqlite_utils.db``, and only of that.

    sqlite-utils imports NumPy (and pandas) when they are installed, at the top of its
    ``db`` module, whatever is imported from the package, only to map NumPy scalar types
    to column types when it creates a table from inserted values; chainrun never inserts
    NumPy values. That import was the largest part of starting a command that reads the
    log (``chainrun runs``: ~230 ms of ~1,050 ms, ``benchmarks/README.md``, "CLI
    start-up"). Installed by the console script only (:func:`main`), so that a program
    embedding chainrun keeps sqlite-utils as it is; a command that needs NumPy itself
    (statistics) imports it as usual. ``tests/test_cli_startup.py`` pins the upstream
    behaviour this relies on (a fresh ``import sqlite_utils`` loads NumPy): when
    sqlite-utils stops doing so, that test fails and this finder goes.
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in ("numpy", "pandas") and _importing_from("sqlite_utils.db"):
            raise ModuleNotFoundError(f"{name}: not loaded for sqlite-utils", name=name)
        return None


def _importing_from(module: str) -> bool:
    """Whether the import under way was asked for by the body of ``module`` (its frame
    is among the import machinery's callers: a few frames up)."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(32):
        if frame is None:
            return False
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back
    return False


def main() -> None:
    """Console-script entry point.

    With ``--json`` a usage error (an unknown option, a value out of range) is also one
    JSON document on stdout (type ``usage_error``), as every other error is.
    """
    if "sqlite_utils.db" not in sys.modules:
        sys.meta_path.insert(0, _NoNumpyForSqliteUtils())
    try:
        _main()
    except BrokenPipeError:  # output written outside rich and print_json
        exit_broken_pipe()


def _main() -> None:
    if "--json" not in sys.argv[1:]:
        app()
        return
    try:
        code = app(standalone_mode=False)
    except TyperException as e:  # click's usage errors derive from it
        message = e.format_message()
        print_json({"error": {"type": "usage_error", "message": message,
                              "file": None, "line": None}})  # fmt: skip
        err.print(f"chainrun: error: {message}", markup=False)
        sys.exit(e.exit_code)
    except typer.Abort:
        err.print("Aborted!")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
