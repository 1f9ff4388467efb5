"""Logged turns as a replay set: last week's live traffic (or any run) replayed as it came.

:func:`replay_lines` selects turns from the log (a run, or the live runs' turns in a
window, by label and status) and writes each as a replay line: its request id, message,
conversation and position in it, the shopper it was for (``user``: the turn is replayed
as that identity, so tools that read ``context.user`` behave as they did) and the
duration the live turn took (``original_ms``, which ``chainrun compare`` shows beside
the replay's). :func:`write_replay_file` writes them whole or not at all.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chainrun.errors import UserInputError
from chainrun.log.rows import TurnRow
from chainrun.log.store import Store
from chainrun.log.time_window import log_window

__all__ = ["replay_lines", "write_replay_file"]


def _selected(
    store: Store, source: str, since: str | None, until: str | None
) -> list[TurnRow]:
    """The turns of ``source``: a run id, or ``live`` (the live runs' turns that started
    in [``since``, ``until``), ISO-8601, either bound optional).

    Raises:
        UserInputError: an unknown run, a source that is neither, a window on a run, a
            bound that is not ISO-8601.
    """
    sel = source.strip()
    if sel.isdigit():
        if since is not None or until is not None:
            raise UserInputError(f"--since/--until select live traffic; {sel} is a run "
                                 "(give live, or leave them out)")  # fmt: skip
        store.get_run(int(sel))  # an unknown run is said as such
        return store.turns(int(sel))
    if sel != "live":
        raise UserInputError(f"{source!r}: expected a run id or live")
    return store.turns_between("live", *log_window(since, until))


def replay_lines(
    store: Store,
    source: str,
    *,
    since: str | None = None,
    until: str | None = None,
    labels: Sequence[str] = (),
    statuses: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The turns of ``source`` (a run id, or ``live`` with the window [``since``,
    ``until``)) as replay lines, in the order they started; only those with a label in
    ``labels`` and a status in ``statuses`` when given. A conversation keeps all of its
    selected turns, numbered 1, 2, ... in their logged order (a filter that drops a
    conversation's earlier turn leaves the later ones numbered without it); a turn
    without a conversation is a line of its own.

    Returns:
        ``[{"id", "message", "conversation_id"?, "turn"?, "user"?, "original_ms"?}]``:
        ``id`` the turn's request id when it is unique in the set, else ``turn-<id>``.

    Raises:
        UserInputError: no turn is selected (the source and filters are named).
    """
    turns = [t for t in _selected(store, source, since, until)
             if (not labels or t.label in labels) and (not statuses or t.status in statuses)]
    if not turns:
        filters = ", ".join(f"{k} {', '.join(v)}" for k, v in (("label", labels),
                                                                 ("status", statuses)) if v)
        raise UserInputError(f"{source}: no turns to export" + (f" with {filters}" if filters
                                                                  else ""))  # fmt: skip
    turns.sort(key=lambda t: (t.started_at or "", t.id or 0))
    ids = [t.request_id for t in turns]
    position: dict[str, int] = {}
    out = []
    for t in turns:
        rid = t.request_id if t.request_id and ids.count(t.request_id) == 1 else f"turn-{t.id}"
        line: dict[str, Any] = {"id": rid, "message": t.input}
        if t.conversation_id:
            position[t.conversation_id] = position.get(t.conversation_id, 0) + 1
            line["conversation_id"] = t.conversation_id
            line["turn"] = position[t.conversation_id]
        if t.user_id:
            line["user"] = t.user_id
        if t.duration_ms is not None:
            line["original_ms"] = round(t.duration_ms, 3)
        out.append(line)
    return out


def write_replay_file(path: str | Path, lines: Sequence[dict[str, Any]]) -> None:
    """Write ``lines`` as JSON Lines to ``path``, whole or not at all (a temporary file in
    the same folder, renamed over ``path`` once written).

    Raises:
        UserInputError: the folder cannot be written.
    """
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent or Path("."), prefix=f".{target.name}.")
    except OSError as e:
        raise UserInputError(f"{target}: cannot write ({e.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
