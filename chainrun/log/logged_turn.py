"""A logged turn read back from the run log: its row, its steps and its calls.

What a chat backend shows or exports after a turn has ended (the serve faces' per-step
summary and summed usage, the OpenTelemetry spans) comes from here, so it is what the
log holds, shadow losers and cancelled steps included. Times are in ms.
"""

from __future__ import annotations

from chainrun.log.rows import UNSENT_OUTCOMES, TurnLog, TurnUsage
from chainrun.log.store import Store

#: a turn as read back from the log (the same model the chain writes)
LoggedTurn = TurnLog

__all__ = ["UNSENT_OUTCOMES", "LoggedTurn", "TurnUsage", "find_turn", "read_turn"]


def read_turn(store: Store, turn_id: int) -> LoggedTurn | None:
    """The logged turn ``turn_id`` with its steps and calls, or None when there is none."""
    return store.turn(turn_id)


def find_turn(store: Store, run_id: int, request_id: str) -> LoggedTurn | None:
    """The latest turn of run ``run_id`` logged with ``request_id`` (how a backend finds a
    turn it cancelled, whose id it never received), or None."""
    turn_id = store.find_turn_id(run_id, request_id)
    return read_turn(store, turn_id) if turn_id is not None else None
