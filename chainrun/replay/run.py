"""Replay a fixed request set through the chain as one run (kind ``replay``).

A replay file is JSON Lines: one object a line with ``id`` and ``message`` (each a
non-empty string); optional ``conversation_id`` (a non-empty string) and
``original_ms`` (the latency the original live turn recorded, in ms, reported apart
from the replay's own wall time), and ``turn`` and ``history`` (below); any other field
is refused, naming the file and line.

**Conversations.** A line with ``turn`` (an int >= 1, with a ``conversation_id``) is
that turn of its conversation. A replay runs each conversation's turns in ``turn``
order, one after another, and conversations side by side (``concurrency`` turns in
flight in all). Each turn's ``{history}`` is the conversation's earlier turns as this
run answered them (the chain's own answers, or what reached the shopper of a turn that
did not end ok), or the line's own ``history`` for a fixed context: a list of
``{"message": ..., "answer": ...}`` objects, oldest first (the next turns of that
conversation then continue from it). A line without ``turn`` is a conversation of its
own (no history). ``(conversation_id, turn)`` is unique in a file, and a turn's earlier
turns are in it (a turn 2 with no turn 1 and no ``history`` is refused: it would run,
and be reported under turn 2, without the turn before it)::

    {"id": "rain-1", "conversation_id": "rain", "turn": 1, "message": "Do you have rain jackets?"}
    {"id": "rain-2", "conversation_id": "rain", "turn": 2, "message": "Which is cheapest?"}

The whole file is validated before any run is created.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.turn_input import MAX_MESSAGE_CHARS, text_problem
from chainrun.conversations.turn_order import missing_earlier_turn
from chainrun.errors import InputFileError, LogFileGone, LostTurn
from chainrun.evals.assertions import parse_assertion
from chainrun.events import TurnFinished
from chainrun.identity import Identity
from chainrun.input_files import read_jsonl, unknown_field
from chainrun.log.rows import RunKind
from chainrun.log.store import Store
from chainrun.providers.base import Provider
from chainrun.steps import Retriever


@dataclass(frozen=True)
class ReplayRequest:
    """One request of a replay set."""

    id: str
    message: str
    conversation_id: str | None = None
    original_ms: float | None = None
    #: the turn's position in its conversation (None: a conversation of its own)
    turn: int | None = None
    #: a fixed context for this turn (None: the run's own earlier turns)
    history: tuple[HistoryTurn, ...] | None = None
    #: what a usable answer to this turn holds: eval assertions
    #: (:mod:`chainrun.evals.assertions`, as dicts checked at load); () none
    expect: tuple[dict[str, Any], ...] = ()
    #: the shopper the turn was for (a user id): the turn runs as that identity (tools
    #: read it as ``context.user``); None: no identity
    user: str | None = None


#: the fields a replay line may have (any other is refused: a misspelled field would
#: otherwise be dropped without a word)
REPLAY_FIELDS = ("id", "message", "conversation_id", "turn", "history", "original_ms",
                 "expect", "user")


def load_requests(path: str | Path) -> list[ReplayRequest]:
    """Read and validate a replay file.

    Raises:
        InputFileError: unreadable or oversized file (see :mod:`chainrun.input_files`), a
            malformed line (file and line named), a field not in :data:`REPLAY_FIELDS`,
            a duplicate id, a turn repeated in its
            conversation, a turn whose earlier turn is neither in the file nor in its
            ``history`` (:func:`~chainrun.conversations.turn_order.missing_earlier_turn`),
            or no requests at all.
    """
    p = Path(path)
    out: list[ReplayRequest] = []
    seen: set[str] = set()
    turns_seen: dict[tuple[str, int], int] = {}
    for no, obj in read_jsonl(p, "replay set"):
        for key in obj:
            if key not in REPLAY_FIELDS:
                raise InputFileError(str(p), no, unknown_field(key, REPLAY_FIELDS))
        rid = _text_field(obj, "id", str(p), no)
        msg = _text_field(obj, "message", str(p), no)
        conv = _text_field(obj, "conversation_id", str(p), no, required=False)
        assert rid is not None and msg is not None
        if rid in seen:
            raise InputFileError(str(p), no, f"duplicate id {rid!r}")
        orig = obj.get("original_ms")
        if orig is not None and (not isinstance(orig, int | float) or isinstance(orig, bool)
                                 or not math.isfinite(orig) or orig < 0):  # fmt: skip
            raise InputFileError(str(p), no, "field 'original_ms' must be a number of ms, "
                                 f">= 0 (got {orig!r})")  # fmt: skip
        turn, history = _conversation_fields(obj, str(p), no)
        if turn is not None:
            if conv is None:
                raise InputFileError(str(p), no, "field 'turn' needs a 'conversation_id'")
            key = (str(conv), turn)
            if key in turns_seen:
                raise InputFileError(
                    str(p), no, f"conversation {conv!r} has turn {turn} twice "
                    f"(first on line {turns_seen[key]})",
                )  # fmt: skip
            turns_seen[key] = no
        seen.add(rid)
        out.append(
            ReplayRequest(rid, msg, conv, float(orig) if orig is not None else None, turn,
                          history, _expect_field(obj, str(p), no),
                          _user_field(obj, str(p), no))
        )  # fmt: skip
    if not out:
        raise InputFileError(str(p), None, "no requests in file")
    gap = missing_earlier_turn(
        (r.conversation_id, r.turn, r.history is not None, turns_seen[(r.conversation_id, r.turn)])
        for r in out if r.turn is not None and r.conversation_id is not None
    )  # fmt: skip
    if gap is not None:
        raise InputFileError(str(p), *gap)
    return out


def _text_field(
    obj: Mapping[str, Any], name: str, path: str, line: int, *, required: bool = True
) -> str | None:
    """A line's text field ``name``: a non-empty string (the one rule for ``id``,
    ``message`` and ``conversation_id``), within the turn's own limits
    (:func:`~chainrun.conversations.turn_input.text_problem`); None when absent and not
    ``required``.

    Raises:
        InputFileError: missing when required, or not such a string (saying what it got).
    """
    value = obj.get(name)
    if value is None:
        if required:
            raise InputFileError(path, line, f"missing field {name!r} (a non-empty string)")
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputFileError(path, line, f"field {name!r}: expected a non-empty string, got "
                             f"{_shown(value)}")  # fmt: skip
    problem = text_problem(value, required=True, max_chars=MAX_MESSAGE_CHARS)
    if problem is not None:  # the turn's own rule, said here with the line
        raise InputFileError(path, line, f"field {name!r}: {problem}")
    return value


def _expect_field(obj: Mapping[str, Any], path: str, line: int) -> tuple[dict[str, Any], ...]:
    """A line's ``expect``: a list of eval assertions (each checked as ``chainrun eval``
    checks its cases' ``assert``), or () when absent.

    Raises:
        InputFileError: not a list, or an assertion of an unknown type or with a bad
            field (naming the item and the problem).
    """
    raw = obj.get("expect")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputFileError(path, line, "field 'expect' must be a list of assertions "
                             '({"type": ..., ...})')  # fmt: skip
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InputFileError(path, line, f"field 'expect[{i}]': expected an object "
                                 f"with a 'type', got {_shown(item)}")  # fmt: skip
        try:
            parse_assertion(item)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"][1:]) or "type"
            raise InputFileError(path, line, f"field 'expect[{i}]' ({where}): "
                                 f"{first['msg']}") from None  # fmt: skip
    return tuple(raw)


def _user_field(obj: Mapping[str, Any], path: str, line: int) -> str | None:
    """A line's ``user``: a user id (:class:`~chainrun.identity.Identity`'s rule),
    or None when absent.

    Raises:
        InputFileError: not a non-empty string of at most
            :data:`~chainrun.identity.MAX_USER_ID_CHARS` characters.
    """
    value = obj.get("user")
    if value is None:
        return None
    try:
        Identity(value if isinstance(value, str) else "")
    except ValueError as e:
        raise InputFileError(path, line, f"field 'user': {e} (got {_shown(value)})") from None
    return str(value)


def _shown(value: Any, limit: int = 40) -> str:
    """``value`` as the JSON it was written as, cut to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _conversation_fields(
    obj: Mapping[str, Any], path: str, line: int
) -> tuple[int | None, tuple[HistoryTurn, ...] | None]:
    """A line's ``turn`` and ``history``, checked.

    Raises:
        InputFileError: ``turn`` is not an int >= 1; ``history`` is not a list of
            ``{"message": non-empty text, "answer": text}`` objects.
    """
    turn = obj.get("turn")
    if turn is not None and (not isinstance(turn, int) or isinstance(turn, bool) or turn < 1):
        raise InputFileError(path, line, f"field 'turn' must be an int >= 1, got {turn!r}")
    raw = obj.get("history")
    if raw is None:
        return turn, None
    if not isinstance(raw, list):
        raise InputFileError(path, line, "field 'history' must be a list of "
                             '{"message": ..., "answer": ...} objects')  # fmt: skip
    history = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) - {"message", "answer"}:
            raise InputFileError(path, line, f"field 'history[{i}]': expected an object "
                                 "with 'message' and 'answer' only")  # fmt: skip
        message, answer = item.get("message"), item.get("answer", "")
        for name, value, required in (("message", message, True), ("answer", answer, False)):
            problem = text_problem(value, required=required, max_chars=MAX_MESSAGE_CHARS)
            if problem is None and value is None:
                problem = "expected a string, got NoneType"
            if problem is not None:
                raise InputFileError(path, line, f"field 'history[{i}].{name}': {problem}")
        history.append(HistoryTurn(str(message), str(answer)))
    return turn, tuple(history)


def conversations_of(requests: Sequence[ReplayRequest]) -> list[list[ReplayRequest]]:
    """The requests as conversations, in order of their first line: the lines with a
    ``turn`` grouped by ``conversation_id`` and sorted by turn; every other line alone."""
    groups: dict[str, list[ReplayRequest]] = {}
    out: list[list[ReplayRequest]] = []
    for req in requests:
        if req.turn is None or req.conversation_id is None:
            out.append([req])
            continue
        group = groups.get(req.conversation_id)
        if group is None:
            group = groups[req.conversation_id] = []
            out.append(group)
        group.append(req)
    for group in groups.values():
        group.sort(key=lambda r: r.turn or 0)
    return out


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
    earlier: Mapping[str, Sequence[HistoryTurn]] | None = None,
    act: bool = False,
) -> int:
    """Run ``requests`` through the chain as one run, ``concurrency`` turns at a time:
    each conversation's turns in order, conversations side by side (see the module
    text). ``earlier``: the history each conversation already has (a resumed run's
    answered turns, :func:`answered_history`).

    Returns the run id. The run ends ``complete``, or ``failed`` when a provider was
    unreachable or refused a step's configuration (the remaining requests are not
    sent), or ``interrupted``. With ``run_id``, the turns go into that existing run
    (marked ``running`` again: see :func:`missing_requests` for a resume). ``on_run`` is
    called with the run id once the run exists, before any turn: a caller stopped by
    Ctrl-C (which never sees the return value) can still report the run's partial summary.
    ``act``: carry out tools with side effects (default: stub them, ``[tools.NAME]
    replay``: a replay of last week's traffic must not fill carts again).

    Raises:
        ProviderUnavailable: a provider could not be reached (the run is marked failed).
        LogFileGone: the log's SQLite file was deleted or replaced during the run: the
            replay stops after the first turn that finds it gone (turns in flight are
            cancelled), naming the run's turns that went with the file.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if run_id is not None:
        store.resume_run(run_id)
    chain = Chain(config, store=store, providers=providers, retriever=retriever, kind=kind,
                  label=label, source=source, quiet=quiet, run_id=run_id,
                  act=act)  # fmt: skip
    sem = asyncio.Semaphore(concurrency)

    stopped = False  # set inside the semaphore, so no queued turn starts after a stop
    sent = 0

    async def one(req: ReplayRequest, history: Sequence[HistoryTurn]) -> TurnFinished | None:
        nonlocal stopped, sent
        async with sem:
            if stopped:
                return None
            sent += 1
            try:
                done = await chain.run_turn(
                    req.message, request_id=req.id, conversation_id=req.conversation_id,
                    history=list(history), turn_index=req.turn, original_ms=req.original_ms,
                    user=Identity(req.user) if req.user is not None else None,
                )  # fmt: skip
            except BaseException:
                stopped = True
                raise
            if store.file_gone():  # SQLite writes on into a deleted file without a word
                stopped = True
                raise _LogGone()
            if on_turn is not None:
                on_turn(req, done)
            return done

    async def conversation(turns: list[ReplayRequest]) -> None:
        cid = turns[0].conversation_id
        carried = earlier is not None and cid is not None and turns[0].turn is not None
        history = list(earlier.get(cid, ())) if carried and earlier and cid else []
        for req in turns:
            if req.history is not None:
                history = list(req.history)  # a fixed context, continued from here on
            done = await one(req, history)
            if done is None:
                return
            history.append(HistoryTurn(req.message, done.output or "", done.products,
                                       done.context, done.tool_messages))

    try:
        async with chain:
            started = await chain.ensure_run()
            if on_run is not None and started is not None:
                on_run(started)
            tasks = [asyncio.create_task(conversation(c)) for c in conversations_of(requests)]
            try:
                await asyncio.gather(*tasks)
            finally:
                # stopped (unreachable provider, Ctrl-C, SIGTERM, the log gone): cancel the
                # turns in flight and let them log themselves cancelled before the run ends
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    except _LogGone:
        assert chain.run_id is not None
        raise _log_gone(store, chain.run_id, len(requests) - sent) from None
    assert chain.run_id is not None
    if store.file_gone():  # gone after the last turn's check, before the run's end
        raise _log_gone(store, chain.run_id, 0)
    return chain.run_id


class _LogGone(Exception):
    """A turn of the run found the log's file gone (turned into :class:`LogFileGone`
    once the run is closed and its turns can be listed)."""


def _log_gone(store: Store, run_id: int, not_run: int) -> LogFileGone:
    """The error for run ``run_id`` whose log file was deleted: every turn of the run
    the store wrote is listed (read through the store's still-open connection)."""
    why = "the log file was deleted or replaced"
    lost = [LostTurn(t.id, t.request_id, why) for t in store.turns(run_id)]
    return LogFileGone(store.name, run_id, lost, not_run)
