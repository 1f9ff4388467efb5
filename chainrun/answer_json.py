"""Model answers as JSON: the one parser and the one schema check of chainrun.

"Is this JSON?" is answered here and only here, by :func:`parse_json_output` (the
chain's JSON steps, the hedging quality gate and the eval assertions all call it),
and "does it follow its schema?" by :func:`schema_errors`, which is the
``jsonschema`` library's Draft 2020-12 validator with format checking on
(https://json-schema.org/draft/2020-12). Servers do not always enforce
``response_format`` (llama.cpp answers unconstrained text when a schema cannot
become a grammar), so an answer is always checked here on the client.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

_FENCE_RE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```$", re.S)


def find_json_values(text: str) -> list[Any]:
    """Every JSON object or array embedded in ``text``, in order (promptfoo's
    ``contains-json``). Each is decoded where it starts, so ``{"a": 1} and {"b": 2}``
    gives two values (a greedy ``{.*}`` would give none)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except RecursionError:
                break  # nested deeper than Python can decode: give up, never raise
            except ValueError:
                i += 1
                continue
            found.append(value)
            i = end
        else:
            i += 1
    return found


def parse_json_output(text: str | None, *, embedded: bool = False) -> tuple[bool, Any]:
    """Parse a model's answer as JSON.

    Strict (the default): ``(True, value)`` when the whole of ``text`` is JSON
    (surrounding whitespace and one enclosing markdown code fence allowed).
    With ``embedded=True``, when the whole is not JSON the first embedded JSON
    *object* counts (models wrap JSON in prose). Otherwise ``(False, None)``.
    Never raises.
    """
    if not text:
        return False, None
    body = text.strip()
    m = _FENCE_RE.match(body)
    if m:
        body = m.group(1).strip()
    try:
        return True, json.loads(body)
    except (ValueError, RecursionError):
        pass
    if embedded:
        for value in find_json_values(text):
            if isinstance(value, dict):
                return True, value
    return False, None


def parse_json_object(text: str | None) -> dict[str, Any] | None:
    """The answer's JSON object (whole text, or the first one embedded), or None."""
    ok, value = parse_json_output(text, embedded=True)
    return value if ok and isinstance(value, dict) else None


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    schema = json.loads(schema_json)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _key(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True)


def check_schema(schema: Any) -> None:
    """Check that ``schema`` is a valid Draft 2020-12 JSON Schema (its metaschema).

    Raises:
        ValueError: one line naming where in the schema and what is wrong.
    """
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = e.json_path if hasattr(e, "json_path") else "$"
        raise ValueError(f"not a valid JSON Schema at {where}: {e.message}") from None
    try:
        _validator(_key(schema))
    except (TypeError, ValueError) as e:  # pragma: no cover - not JSON-serialisable
        raise ValueError(f"not a valid JSON Schema ({e})") from None


def schema_errors(value: Any, schema: Any, limit: int = 5) -> list[str]:
    """Where ``value`` (decoded JSON) breaks ``schema`` (Draft 2020-12, formats checked).

    Returns up to ``limit`` messages, each ``JSON-path: problem``, most relevant first;
    empty = the value conforms. The schema must have passed :func:`check_schema`.
    """
    validator = _validator(_key(schema))
    errors = sorted(validator.iter_errors(value), key=jsonschema.exceptions.relevance)
    return [f"{e.json_path}: {e.message}" for e in errors[:limit]]


def answer_problem(text: str | None, schema: dict[str, Any] | None) -> str | None:
    """Why an answer that must be a JSON object (following ``schema`` when given) is not
    acceptable, in one line; None when it is acceptable."""
    parsed = parse_json_object(text)
    if parsed is None:
        return "the answer is not a JSON object"
    if schema is not None:
        errs = schema_errors(parsed, schema, limit=3)
        if errs:
            return "the answer breaks its JSON Schema: " + "; ".join(errs)
    return None
