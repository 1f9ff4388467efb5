"""The one error shape of every ``chainrun serve`` route, every face alike: OpenAI's
(so one client parser reads them all, and the ``openai`` SDK raises its usual errors)::

    {"error": {"message": "message: expected a non-empty string",
               "type": "invalid_request_error",   # or "server_error"
               "param": "message",                 # the request field at fault, or null
               "code": "invalid_value"}}           # or null

Statuses: 400 a bad body (``param`` names the field) or a ``Host`` the server does not
answer to (``invalid_host``), 401 a missing or wrong bearer
token (``invalid_api_key``) or identity (``invalid_identity``), 403 a conversation bound
to another identity (``conversation_forbidden``), 404 an unknown model
(``model_not_found``) or path (``unknown_url``), 405 a method the path does not take
(``method_not_allowed``, with ``Allow``), 409 an ``Idempotency-Key`` whose first
request is still running past the wait (``request_in_progress``), 413 a body over the server's limit
(``body_too_large``), 415 a body that is not ``application/json``
(``unsupported_media_type``), 422 an ``Idempotency-Key`` reused with another request
(``idempotency_key_reused``), 502 the chain failed (``code``: its error type), 503 the
chain is not ready yet (``not_ready``), the run log a request needs is away past its
outage wait (``log_unavailable``) or the identity provider's keys cannot be had
(``identity_unavailable``), each with ``Retry-After``. A refusal before the turn runs
takes its status from the error the front desk raised (``http_status``,
:mod:`chainrun.errors`).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

__all__ = ["JSONBody", "NotJSON", "body_too_large", "body_too_large_response", "error_body",
           "error_response", "http_error", "not_ready", "read_json", "refusal_body",
           "refusal_response"]  # fmt: skip

#: a refusal's (param, code) by the chain's error type (:func:`refusal_body`)
_REFUSALS = {
    "ConversationForbidden": ("conversation_id", "conversation_forbidden"),
    "IdempotencyKeyReused": ("Idempotency-Key", "idempotency_key_reused"),
    "RequestInProgress": ("Idempotency-Key", "request_in_progress"),
    "LogUnavailable": (None, "log_unavailable"),
}
#: s a client is told to wait before it tries a request refused 503 again
RETRY_AFTER_S = 1


class JSONBody(JSONResponse):
    """A JSON response whose non-ASCII text is escaped (``\\uXXXX``): a model can stream a
    lone surrogate (a cut ``"\\ud83d"``), which UTF-8 cannot carry; escaped, it is still
    valid JSON instead of a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


class NotJSON(ValueError):
    """A request body that is not one JSON document (the message says why)."""


#: The deepest nesting of arrays and objects a request body may have. No request of
#: either face nests deeper than a handful of levels (a message's content parts, a tool
#: call's arguments); the parser's own limit is the interpreter's recursion limit,
#: which any library may raise.
MAX_JSON_DEPTH = 64


def _depth_over(document: Any, limit: int) -> bool:
    """Whether ``document`` nests arrays and objects more than ``limit`` deep (walked
    without recursion)."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return False


def read_json(raw: bytes) -> Any:
    """The JSON document of a request body.

    Raises:
        NotJSON: not UTF-8 JSON (``the body is not JSON (Expecting value, column 1)``),
            or nested more than :data:`MAX_JSON_DEPTH` deep or deeper than the parser's
            recursion allows (``nested too deeply``: a 2 KB body of 1,000 ``[`` would
            otherwise end in a 500, or pass, by the interpreter's recursion limit).
    """
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as e:
        raise NotJSON(f"the body is not JSON ({e.msg}, column {e.colno})") from None
    except (ValueError, UnicodeDecodeError):
        raise NotJSON("the body is not JSON (expected UTF-8 text)") from None
    except RecursionError:
        document = None
    else:
        if not _depth_over(document, MAX_JSON_DEPTH):
            return document
    raise NotJSON(f"the body is not JSON we take (nested too deeply: more than "
                  f"{MAX_JSON_DEPTH} levels)")  # fmt: skip


def error_body(message: str, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The error object (see the module docstring)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    status: int, message: str, kind: str = "invalid_request_error", *,
    param: str | None = None, code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:  # fmt: skip
    """``status`` with the error object (see the module docstring)."""
    return JSONBody(error_body(message, kind, param, code), status_code=status, headers=headers)


def refusal_body(refusal: dict[str, Any]) -> dict[str, Any]:
    """The error object of a request the chain refused before its turn ran, from the
    turn's ``error`` event ``{status, message, type}`` (:mod:`chainrun.serve.turns`):
    ``param`` and ``code`` by its type (another bad argument: ``invalid_value``; a 5xx
    of another type: ``log_unavailable``, type ``server_error``)."""
    server = refusal["status"] >= 500
    param, code = _REFUSALS.get(refusal["type"],
                                (None, "log_unavailable" if server else "invalid_value"))
    kind = "server_error" if server else "invalid_request_error"
    return error_body(refusal["message"], kind, param, code)


def refusal_response(refusal: dict[str, Any]) -> Response:
    """``refusal["status"]`` (400, 403, 409, 422, 503 with ``Retry-After``) with
    :func:`refusal_body`."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if refusal["status"] == 503 else None
    return JSONBody(refusal_body(refusal), status_code=refusal["status"], headers=headers)


def not_ready(request: Request) -> Response:
    """``503`` with why the chain is not ready (still starting, or its last error)."""
    reason = request.app.state.serve.not_ready_reason()
    return error_response(503, f"not ready: {reason}", "server_error", code="not_ready",
                          headers={"Retry-After": "1"})  # fmt: skip


def body_too_large_response(limit: int) -> Response:
    """``413``: the request body is over ``limit`` bytes."""
    return error_response(413, f"the request body is over this server's limit of {limit} bytes",
                          code="body_too_large")  # fmt: skip


#: the code of an HTTP error no route answered itself (an unknown path, a method the
#: route does not take), by status
_HTTP_CODES = {404: "unknown_url", 405: "method_not_allowed"}


async def http_error(request: Request, exc: Exception) -> Response:
    """The exception handler for Starlette's own HTTP errors (an unknown path 404, a
    method the route does not take 405 with ``Allow``): in the error shape, as OpenAI
    answers an unknown URL (``Invalid URL (GET /v1/nothing)``), instead of plain text."""
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    what = {404: "Invalid URL", 405: "Method not allowed"}.get(status, str(exc.detail))
    return error_response(
        status, f"{what} ({request.method} {request.url.path})",
        "server_error" if status >= 500 else "invalid_request_error",
        code=_HTTP_CODES.get(status), headers=dict(exc.headers or {}),
    )  # fmt: skip


async def body_too_large(request: Request, exc: Exception) -> Response:
    """The exception handler for Starlette's body limit (``max_body_size``): its 413 in
    the error shape."""
    return body_too_large_response(request.app.state.max_body_bytes)
