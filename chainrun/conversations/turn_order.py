"""The turns of a file's conversations (a replay set, an eval set): each turn's earlier
turns must be there, in the file or as the line's own ``history``."""

from __future__ import annotations

from collections.abc import Iterable


def missing_earlier_turn(entries: Iterable[tuple[str, int, bool, int]]) -> tuple[int, str] | None:
    """The first line (by line number) whose turn would run without one of its earlier
    turns, and what is wrong with it; None when every turn has them.

    ``entries``: ``(conversation_id, turn, has_history, line)`` per line with a turn. A
    conversation's turns run in ``turn`` order, each continuing from the one before; a
    line with a ``history`` is a fixed context, so what comes before it does not matter.
    A turn ``n`` (above 1) with no turn ``n - 1`` in the file and no ``history`` would be
    run, and reported under turn ``n``, without the turns its number says came before.
    """
    by_conversation: dict[str, list[tuple[int, bool, int]]] = {}
    for conversation_id, turn, has_history, line in entries:
        by_conversation.setdefault(conversation_id, []).append((turn, has_history, line))
    found: list[tuple[int, str]] = []
    for conversation_id, turns in by_conversation.items():
        before = 0
        for turn, has_history, line in sorted(turns):
            if turn != before + 1 and not has_history:
                found.append((line, (
                    f"conversation {conversation_id!r}: turn {turn} has no turn {turn - 1} in "
                    f"the file and no 'history', so it would run without turn {turn - 1}; add "
                    f"turn {turn - 1}, give this line a 'history' (the turns before it, oldest "
                    f"first), or number it turn {before + 1}"
                )))  # fmt: skip
                break
            before = turn
    return min(found) if found else None
