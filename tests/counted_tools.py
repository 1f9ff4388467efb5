"""A tool that counts its own runs, for the tests that check how often chainrun ran it
(the tool config names it by module path: ``counted_tools:order_status``)."""

from __future__ import annotations

from typing import Any

#: the order ids the tool was run with, in order (tests clear it)
RUNS: list[int] = []


def order_status(order_id: int) -> dict[str, Any]:
    """Look an order up: records the run and answers "shipped"."""
    RUNS.append(order_id)
    return {"order_id": order_id, "status": "shipped"}


ORDER = {"description": "Look an order up", "function": f"{__name__}:order_status",
         "parameters": {"type": "object", "required": ["order_id"],
                        "properties": {"order_id": {"type": "integer"}}}}  # fmt: skip
