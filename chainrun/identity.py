"""The shopper a turn is for, as the shop vouches for them.

:class:`Identity` is a user id and optional claims (the shop's own: a tier, a country, a
list of scopes). The library's turn API takes one (``Chain.stream_turn(..., user=)``, a field of
:class:`chainrun.desk.TurnRequest`); it reaches every tool as ``context.user`` and the log
(``turns.user_id``), and a conversation is bound to the identity that started it (the
front desk, :mod:`chainrun.desk`). ``chainrun serve`` takes it only from a source the shop
controls (:mod:`chainrun.serve.identity`). Leaf module: the standard library only, so
that every package may import it (the tools, the desk, the faces).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_USER_ID_CHARS", "Identity"]

#: the longest user id taken, in characters
MAX_USER_ID_CHARS = 200


@dataclass(frozen=True)
class Identity:
    """A shopper as the shop identified them.

    Attributes:
        user_id: the shop's id for the shopper (1 to :data:`MAX_USER_ID_CHARS`
            characters).
        claims: more of what the shop vouches for (JSON-serialisable), read-only.

    Raises:
        ValueError: an empty or too long user id, one holding a NUL character, or
            claims that are not a JSON object or hold a NUL character.
    """

    user_id: str
    claims: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.user_id, str) or not self.user_id.strip():
            raise ValueError("user_id: expected a non-empty string")
        if len(self.user_id) > MAX_USER_ID_CHARS:
            raise ValueError(f"user_id: expected at most {MAX_USER_ID_CHARS} characters, "
                             f"got {len(self.user_id)}")  # fmt: skip
        if "\x00" in self.user_id:  # PostgreSQL's text cannot hold it: refused on any log
            raise ValueError("user_id: holds a NUL character (U+0000)")
        if not isinstance(self.claims, Mapping):
            raise ValueError(f"claims: expected a JSON object, got {type(self.claims).__name__}")
        try:
            json.dumps(dict(self.claims))
        except (TypeError, ValueError) as e:
            raise ValueError(f"claims: not JSON-serialisable ({e})") from None
        if _holds_nul(dict(self.claims)):  # PostgreSQL's jsonb cannot hold it: refused anywhere
            raise ValueError("claims: hold a NUL character (U+0000)")

    def as_json(self) -> dict[str, Any]:
        """``{"user_id", "claims"}``."""
        return {"user_id": self.user_id, "claims": dict(self.claims)}


def _holds_nul(value: Any) -> bool:
    """Whether a JSON value holds U+0000 in any string, key or value."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False
