"""A logged turn read back from the run log: its row, its steps and its calls.

What a chat backend shows or exports after a turn has ended (the serve faces' per-step
summary and summed usage, the OpenTelemetry spans) comes from here, so it is what the
log holds, shadow losers and cancelled steps included. Times are in ms.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chainrun.store import Store


@dataclass(frozen=True)
class Usage:
    """Tokens summed over a turn's model calls (every attempt: copies cost tokens too).

    A count a call did not report (a cancelled loser, a server that sent no usage) is
    unknown, not 0: ``unknown_calls`` says how many calls of ``calls`` added nothing.
    The GenAI conventions' inclusions hold: ``input_tokens`` includes cached ones and
    ``output_tokens`` includes reasoning ones.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0
    calls: int = 0
    unknown_calls: int = 0

    def as_json(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "calls": self.calls,
            "unknown_calls": self.unknown_calls,
        }


#: attempts the hedging engine decided not to send (no request left the process)
UNSENT_OUTCOMES = frozenset({"budget_exhausted", "suppressed"})


@dataclass
class LoggedTurn:
    """One ``turns`` row with its ``steps`` and ``calls`` rows (dicts, column names as keys).

    ``steps`` are in the order they were logged; each call's ``started_offset_ms`` is
    from its step's start, each step's from the turn's start.
    """

    turn: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def turn_id(self) -> int:
        return int(self.turn["id"])

    @property
    def started_at(self) -> datetime | None:
        """The turn's wall-clock start (UTC), or None when the row has none."""
        value = self.turn.get("started_at")
        return datetime.fromisoformat(value) if value else None

    def calls_of(self, step: str) -> list[dict[str, Any]]:
        """The calls rows of ``step``, by attempt number."""
        return sorted((c for c in self.calls if c["step"] == step), key=lambda c: c["attempt"])

    def step_detail(self, step: dict[str, Any]) -> dict[str, Any] | None:
        raw = step.get("detail")
        return json.loads(raw) if raw else None

    def usage(self) -> Usage:
        """The turn's tokens summed over its sent calls (see :class:`Usage`)."""
        sums = {"input_tokens": 0, "output_tokens": 0, "reasoning_tokens": 0,
                "cached_input_tokens": 0}  # fmt: skip
        calls = unknown = 0
        for c in self.calls:
            if c["outcome"] in UNSENT_OUTCOMES:
                continue
            calls += 1
            if c["input_tokens"] is None and c["output_tokens"] is None:
                unknown += 1
            for key in sums:
                if c[key] is not None:
                    sums[key] += int(c[key])
        return Usage(**sums, calls=calls, unknown_calls=unknown)


def read_turn(store: Store, turn_id: int) -> LoggedTurn | None:
    """The logged turn ``turn_id`` with its steps and calls, or None when there is none."""
    rows = list(store.db.table("turns").rows_where("id = ?", [turn_id]))
    if not rows:
        return None
    steps = list(store.db.table("steps").rows_where("turn_id = ?", [turn_id], order_by="id"))
    calls = list(store.db.table("calls").rows_where("turn_id = ?", [turn_id], order_by="id"))
    return LoggedTurn(rows[0], steps, calls)


def find_turn(store: Store, run_id: int, request_id: str) -> LoggedTurn | None:
    """The latest turn of run ``run_id`` logged with ``request_id`` (how a backend finds a
    turn it cancelled, whose id it never received), or None."""
    row = store.db.execute(
        "select id from turns where run_id = ? and request_id = ? order by id desc limit 1",
        [run_id, request_id],
    ).fetchone()
    return read_turn(store, int(row[0])) if row else None
