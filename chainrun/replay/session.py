"""A replay as ``chainrun replay`` runs it, less the terminal: opened (the replay file
read and checked, the log opened, and on ``--resume`` the run's own config with the
requests it has not answered), its prompt cache turned off when asked, run to its end
(:func:`run_replay`: how it ended, a Ctrl-C or SIGTERM, turns the log refused, the
database away, told apart), and the error that says how to go on when its provider went
away. Summaries of the run are the caller's (``chainrun.analysis.summary``: a replay
does not read its analyses)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chainrun.config import ChainConfig
from chainrun.conversations.history import HistoryTurn
from chainrun.errors import LogFileGone, LogWriteError, ProviderUnavailable
from chainrun.events import TurnFinished
from chainrun.log.store import Store
from chainrun.log.writer import LogWriteLost
from chainrun.replay.hints import resume_command
from chainrun.replay.resume import resume
from chainrun.replay.run import ReplayRequest, load_requests, run_requests

__all__ = [
    "OpenedReplay",
    "ReplayEnd",
    "open_replay",
    "provider_gone",
    "run_replay",
    "without_prompt_cache",
]


@dataclass
class OpenedReplay:
    """What a replay runs: the config, the requests (on a resume, those not yet answered),
    the log (open: the caller closes it) and, on a resume, the conversations' answered
    history by conversation id (None: a new run)."""

    config: ChainConfig
    requests: list[ReplayRequest]
    store: Store
    earlier: dict[str, list[HistoryTurn]] | None = None


def open_replay(
    file: str | Path, db: str | Path, config: ChainConfig | None, resume_run: int | None
) -> OpenedReplay:
    """Read the replay file ``file`` (every line checked before any run exists) and open
    the log ``db``; with ``resume_run``, the run's own config and the requests it has not
    answered (:func:`chainrun.replay.resume.resume`), else ``config``.

    Raises:
        InputFileError: a bad line of ``file``. UserInputError: the log cannot be opened
            (``db`` missing on a resume), or the run cannot be resumed.
        ValueError: neither or both of ``config`` and ``resume_run`` given.
    """
    if (config is None) == (resume_run is None):
        raise ValueError("open_replay: give a config for a new run, or the run to resume")
    requests = load_requests(file)
    store = Store.open(db, create=resume_run is None)
    if resume_run is None:
        assert config is not None
        return OpenedReplay(config, requests, store)
    try:
        resumed = resume(store, resume_run, requests, str(file))
    except BaseException:
        store.close()
        raise
    return OpenedReplay(resumed.config, resumed.requests, store, resumed.earlier)


@dataclass
class ReplayEnd:
    """How a replay ended (:func:`run_replay`).

    Attributes:
        run_id: the run (None: stopped before its first turn, while the chain opened).
        resume_run: the run it resumed (None: a new run).
        finished: the turns as they finished, in memory (what the run answered when its
            log cannot be read).
        stopped: the Ctrl-C or SIGTERM exception that stopped it (None: it ran to its end).
        lost: turns the log refused, or the database away (:attr:`log_unreachable`).
        store: the run's log (open until the caller closes it).
        again: the command line that runs the rest (:func:`resume_command`; None for a
            run that ended with every request answered and nothing lost).
    """

    run_id: int | None
    resume_run: int | None = None
    finished: list[TurnFinished] = field(default_factory=list)
    stopped: BaseException | None = None
    lost: LogWriteError | None = None
    store: Store | None = None
    again: str | None = None

    @property
    def dropped_writes(self) -> int:
        """Log writes dropped while the database was away, so far (read after the log is
        closed, the writes its close could not commit included)."""
        writer = self.store.writer if self.store is not None else None
        return writer.dropped if writer is not None else 0

    @property
    def log_unreachable(self) -> bool:
        """The database went away: writes were lost but no turn can be named (the run's
        summary comes from :attr:`finished`)."""
        return self.lost is not None and not self.lost.lost


def run_replay(
    opened: OpenedReplay,
    *,
    file: str | Path,
    db: str | Path,
    resume_run: int | None = None,
    concurrency: int = 1,
    label: str | None = None,
    act: bool = False,
    quiet: bool = False,
    on_turn: Callable[[ReplayRequest, TurnFinished], Any] | None = None,
    runner: Callable[[Coroutine[Any, Any, int]], int] = asyncio.run,
    stop_errors: tuple[type[BaseException], ...] = (KeyboardInterrupt,),
) -> ReplayEnd:
    """Run the opened replay to its end (:func:`chainrun.replay.run.run_requests`) and say
    how it ended. The log stays open (``opened.store``: the caller summarises, then closes
    it).

    Args:
        opened: from :func:`open_replay`. file, db: the replay file and log as the user
            named them (for the resume command). resume_run: the run resumed, if any.
        runner: runs the coroutine (the CLI's turns SIGTERM into a cancellation).
        stop_errors: what a stop by the user raises (Ctrl-C's ``KeyboardInterrupt``, and
            the caller's SIGTERM exception): the run ends interrupted, its turns logged.

    Raises:
        ProviderUnavailable: the provider went away during the run (:func:`provider_gone`:
            the run, its logged turns and the resume command), or before it (no run).
        LogWriteError: the log refused the run's creation, or its file went away
            (:class:`LogFileGone`), or the writer stopped with no turn to name.
    """
    store = opened.store
    started: list[int] = []
    end = ReplayEnd(run_id=None, resume_run=resume_run, store=store)

    def turn_done(req: ReplayRequest, done: TurnFinished) -> None:
        end.finished.append(done)
        if on_turn is not None:
            on_turn(req, done)

    try:
        end.run_id = runner(
            run_requests(
                opened.config, opened.requests, store, concurrency=concurrency, label=label,
                source=str(file), on_turn=turn_done, quiet=quiet, run_id=resume_run,
                on_run=started.append, earlier=opened.earlier, act=act,
            )
        )  # fmt: skip
    except stop_errors as e:
        end.stopped = e
        end.run_id = started[0] if started else None
    except LogWriteError as e:
        # no run, no log left to summarise (its file gone), or the writer stopped on an
        # error with no turn to name: the error's own line is the report
        if not started or isinstance(e, LogFileGone) or (
            not e.lost and not isinstance(e, LogWriteLost)
        ):
            raise
        end.run_id, end.lost = started[0], e
    except ProviderUnavailable as e:
        if not started:  # no run yet: nothing to go on with
            raise
        raise provider_gone(e, store, file, db, started[0]) from None
    target = end.run_id if end.run_id is not None else resume_run
    if target is not None and (end.stopped is not None or end.lost is not None):
        end.again = resume_command(file, db, target)
    return end


def without_prompt_cache(
    cfg: ChainConfig, warn: Callable[[str], None]
) -> ChainConfig:
    """``cfg`` with ``cache_prompt = false`` on its Chat Completions providers (llama-server
    then reuses no cached prompt prefix); ``warn`` gets one line per provider where no
    request can turn the cache off (Azure, the Responses API: the service caches prefixes
    of 1,024+ tokens on its own, and the cached share says how much it helped)."""
    providers = {}
    for name, p in cfg.providers.items():
        if p.kind == "openai" and p.api == "chat_completions":
            providers[name] = p.model_copy(update={"cache_prompt": False})
        else:
            providers[name] = p
            warn(f"providers.{name} ({p.kind}, {p.api}): its prompt cache cannot be turned "
                 "off per request; its TTFT is measured in whatever state that cache is "
                 "(see the cached share)")  # fmt: skip
    return cfg.model_copy(update={"providers": providers})


def provider_gone(
    error: ProviderUnavailable, store: Store, file: str | Path, db: str | Path, run_id: int
) -> ProviderUnavailable:
    """The error to raise when the provider went away during run ``run_id``: what it said,
    how many turns the run logged, and the command that runs the rest once it answers."""
    return ProviderUnavailable(
        f"{error}; run {run_id} ended failed with {store.count_turns(run_id)} turns logged; "
        f"once it answers, {resume_command(file, db, run_id)} runs the rest"
    )
