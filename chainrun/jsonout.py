"""Model answers as JSON (the one place that answers "is this JSON?")."""

from __future__ import annotations

import json
import re
from typing import Any


def parse_json_object(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (models wrap JSON in prose or code fences), or None."""
    if not text:
        return None
    m = re.search(r"\{.*\}", text, re.S)
    if not m:
        return None
    try:
        value = json.loads(m.group(0))
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
