"""Replay a fixed request set through the chain as one run (kind ``replay``).

A replay file is JSON Lines: one object a line with ``id`` (string) and ``message``
(non-empty string); optional ``conversation_id`` and ``original_ms`` (the latency the
original live turn recorded, in ms, reported apart from the replay's own wall time).
The whole file is validated before any run is created.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.errors import InputFileError, UserInputError
from chainrun.events import TurnFinished
from chainrun.input_files import read_jsonl
from chainrun.log.rows import RunKind
from chainrun.log.store import Store
from chainrun.providers.base import Provider
from chainrun.steps import Retriever
from chainrun.turn_input import MAX_MESSAGE_CHARS, text_problem


@dataclass(frozen=True)
class ReplayRequest:
    """One request of a replay set."""

    id: str
    message: str
    conversation_id: str | None = None
    original_ms: float | None = None


def load_requests(path: str | Path) -> list[ReplayRequest]:
    """Read and validate a replay file.

    Raises:
        InputFileError: unreadable or oversized file (see :mod:`chainrun.input_files`), a
            malformed line (file and line named), a duplicate id, or no requests at all.
    """
    p = Path(path)
    out: list[ReplayRequest] = []
    seen: set[str] = set()
    for no, obj in read_jsonl(p, "replay set"):
        rid, msg = obj.get("id"), obj.get("message")
        if not isinstance(rid, str | int) or isinstance(rid, bool) or str(rid) == "":
            raise InputFileError(str(p), no, "expected field 'id' (a non-empty string)")
        if not isinstance(msg, str) or not msg.strip():
            raise InputFileError(str(p), no, "expected field 'message' (a non-empty string)")
        problem = text_problem(msg, required=True, max_chars=MAX_MESSAGE_CHARS)
        if problem is not None:  # the turn's own rule, said here with the line
            raise InputFileError(str(p), no, f"field 'message': {problem}")
        if str(rid) in seen:
            raise InputFileError(str(p), no, f"duplicate id {rid!r}")
        orig = obj.get("original_ms")
        if orig is not None and (not isinstance(orig, int | float) or isinstance(orig, bool)):
            raise InputFileError(str(p), no, "field 'original_ms' must be a number (ms)")
        conv = obj.get("conversation_id")
        seen.add(str(rid))
        out.append(
            ReplayRequest(str(rid), msg, str(conv) if conv is not None else None,
                          float(orig) if orig is not None else None)
        )  # fmt: skip
    if not out:
        raise InputFileError(str(p), None, "no requests in file")
    return out


def missing_requests(
    store: Store, run_id: int, requests: list[ReplayRequest], source: str | None = None
) -> list[ReplayRequest]:
    """The requests of a replay set that run ``run_id`` has not yet answered: those with
    no logged turn, or only ``cancelled`` ones (``chainrun replay FILE --resume RUN``).

    Raises:
        UserInputError: no such run, not a replay run, still being written, or made
            from another file than ``source``.
    """
    run = store.get_run(run_id)
    if run.kind != "replay":
        raise UserInputError(f"run {run_id}: a {run.kind} run, not a replay; cannot resume")
    if run.status == "running":
        raise UserInputError(
            f"run {run_id}: still running (another process is writing it); cannot resume"
        )
    if source is not None and run.source and Path(run.source).name != Path(source).name:
        raise UserInputError(
            f"run {run_id}: was made from {run.source}, not {source}; cannot resume"
        )
    done = {
        t.request_id
        for t in store.turns(run_id)
        if t.status != "cancelled" and t.request_id is not None
    }
    return [r for r in requests if r.id not in done]


async def run_requests(
    config: ChainConfig,
    requests: list[ReplayRequest],
    store: Store,
    *,
    kind: RunKind = "replay",
    concurrency: int = 1,
    label: str | None = None,
    source: str | None = None,
    providers: Mapping[str, Provider] | None = None,
    retriever: Retriever | None = None,
    on_turn: Callable[[ReplayRequest, TurnFinished], Any] | None = None,
    quiet: bool = False,
    run_id: int | None = None,
    on_run: Callable[[int], Any] | None = None,
) -> int:
    """Run ``requests`` through the chain as one run, ``concurrency`` turns at a time.

    Returns the run id. The run ends ``complete``, or ``failed`` when a provider was
    unreachable or refused a step's configuration (the remaining requests are not
    sent), or ``interrupted``. With ``run_id``, the turns go into that existing run
    (marked ``running`` again: see :func:`missing_requests` for a resume). ``on_run`` is
    called with the run id once the run exists, before any turn: a caller stopped by
    Ctrl-C (which never sees the return value) can still report the run's partial summary.

    Raises:
        ProviderUnavailable: a provider could not be reached (the run is marked failed).
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if run_id is not None:
        store.resume_run(run_id)
    chain = Chain(config, store=store, providers=providers, retriever=retriever, kind=kind,
                  label=label, source=source, quiet=quiet, run_id=run_id)  # fmt: skip
    sem = asyncio.Semaphore(concurrency)

    stopped = False  # set inside the semaphore, so no queued turn starts after a stop

    async def one(req: ReplayRequest) -> None:
        nonlocal stopped
        async with sem:
            if stopped:
                return
            try:
                done = await chain.run_turn(
                    req.message, request_id=req.id, conversation_id=req.conversation_id,
                    original_ms=req.original_ms,
                )  # fmt: skip
            except BaseException:
                stopped = True
                raise
            if on_turn is not None:
                on_turn(req, done)

    async with chain:
        started = await chain.ensure_run()
        if on_run is not None and started is not None:
            on_run(started)
        tasks = [asyncio.create_task(one(r)) for r in requests]
        try:
            await asyncio.gather(*tasks)
        finally:
            # stopped (unreachable provider, Ctrl-C, SIGTERM): cancel the turns in flight
            # and let them log themselves as cancelled before the run is closed
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert chain.run_id is not None
    return chain.run_id
