"""A replay as ``chainrun replay`` runs it, less the terminal: opened (the replay file
read and checked, the log opened, and on ``--resume`` the run's own config with the
requests it has not answered), its prompt cache turned off when asked, and the error
that says how to go on when its provider went away."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chainrun.config import ChainConfig
from chainrun.conversations.history import HistoryTurn
from chainrun.errors import ProviderUnavailable
from chainrun.log.store import Store
from chainrun.replay.hints import resume_command
from chainrun.replay.resume import resume
from chainrun.replay.run import ReplayRequest, load_requests

__all__ = ["OpenedReplay", "open_replay", "provider_gone", "without_prompt_cache"]


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
