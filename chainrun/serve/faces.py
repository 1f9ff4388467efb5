"""What the OpenAI-shaped faces share (:mod:`chainrun.serve.openai_face`, Chat
Completions; :mod:`chainrun.serve.responses_face`, Responses): the checks every request
body passes first, its optional fields as the faces read them, and a turn that gave no
answer as an HTTP error (OpenAI's error object, API reference "Error codes").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from starlette.responses import Response

from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.turn_input import MAX_MESSAGE_CHARS, text_problem
from chainrun.desk import TurnRequest
from chainrun.serve.errors import RETRY_AFTER_S, error_response
from chainrun.serve.turns import TurnRunner

__all__ = ["FAILED_STATUS", "InvalidRequest", "check_body", "check_texts", "failed",
           "failed_response", "failure", "flag", "text_field", "whole_turn"]


class InvalidRequest(ValueError):
    """A request the face refuses: ``param`` names the field, as OpenAI's 400s do."""

    def __init__(self, message: str, param: str | None, status: int = 400,
                 code: str = "invalid_value") -> None:  # fmt: skip
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


def check_body(body: Any, model_id: str,
               refused: dict[str, tuple[Callable[[Any], bool], str]]) -> None:  # fmt: skip
    """The checks every face's body passes first: a JSON object, ``model`` the served
    ``model_id``, and no parameter of ``refused`` set to a value it does not accept.

    Raises:
        InvalidRequest: not an object; ``model`` missing (400) or another (404
            ``model_not_found``); a refused parameter (400 ``unsupported_parameter``).
    """
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"model: required (this server serves {model_id!r})", "model")
    if model != model_id:
        raise InvalidRequest(
            f"The model {model!r} does not exist; this server serves {model_id!r}",
            "model", status=404, code="model_not_found",
        )  # fmt: skip
    for param, (accepts, reason) in refused.items():
        if body.get(param) is not None and not accepts(body[param]):
            raise InvalidRequest(f"{param}: not supported by this server: {reason}", param,
                                 code="unsupported_parameter")  # fmt: skip


def check_texts(text: str, history: Sequence[HistoryTurn], param: str) -> None:
    """The library's rule (:func:`~chainrun.conversations.turn_input.text_problem`) for the
    message a turn answers and every earlier text of its thread.

    Raises:
        InvalidRequest: naming ``param``, the turn and the message at fault.
    """
    problem = text_problem(text, required=True, max_chars=MAX_MESSAGE_CHARS)
    if problem is not None:
        raise InvalidRequest(f"{param}: the last user message: {problem}", param)
    for i, turn in enumerate(history):
        for what, value in (("user", turn.message), ("assistant", turn.answer)):
            problem = text_problem(value, required=False, max_chars=MAX_MESSAGE_CHARS)
            if problem is not None:
                raise InvalidRequest(
                    f"{param}: earlier turn {i + 1}, the {what} message: {problem}", param)


def text_field(value: Any, param: str, max_chars: int) -> str | None:
    """An optional text field: None, or a string of 1 to ``max_chars`` characters.

    Raises:
        InvalidRequest: anything else, naming ``param``.
    """
    if value is None:
        return None
    problem = text_problem(value, required=True, max_chars=max_chars)
    if problem is not None:
        raise InvalidRequest(f"{param}: {problem}", param)
    return str(value)


def flag(value: Any, param: str) -> bool:
    """A boolean request field: true, false or absent (null); anything else is refused."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{param}: expected a boolean (true or false), "
                             f"got {json.dumps(value)}", param)  # fmt: skip
    return value


#: the HTTP status of a turn that failed, by its error type (the rest: 502): the
#: provider's own limits and an unreachable server 503, a deadline 504, a message too long
#: for the model's context 400 (OpenAI answers its `context_length_exceeded` so)
FAILED_STATUS = {"http_429": 503, "rate_limited": 503, "circuit_open": 503,
                  "unavailable": 503, "timeout": 504, "first_token_timeout": 504,
                  "idle_timeout": 504, "context_length": 400}  # fmt: skip


def failed(summary: dict[str, Any]) -> bool:
    """Whether the turn gave no answer of its own making: it ended ``error`` or
    ``cancelled``, or it was refused because a step failed (its provider down, a 500,
    a 429, a deadline, a broken stream: the refused turn's ``error_type`` is set), not
    because a check refused the answer (``error_type`` null)."""
    status = summary["status"]
    return status in ("error", "cancelled") or (
        status in ("refused", "replaced") and summary.get("error_type") is not None)


def failure(summary: dict[str, Any]) -> tuple[int, str, str | None]:
    """The HTTP status, error message and code of a turn that gave no answer
    (:func:`failed`): cancelled by the server stopping (503; the client that went away
    reads nothing), or failed (503, 504 or 502 by its error type, the code its type)."""
    if summary["status"] == "cancelled":
        return (503, "the server stopped before the turn finished (the turn was cancelled)",
                "cancelled")  # fmt: skip
    kind = summary["error_type"]
    return FAILED_STATUS.get(kind, 502), f"the chain failed: {kind}", kind


def failed_response(summary: dict[str, Any]) -> Response:
    """The HTTP error of a turn that gave no answer (:func:`failure`)."""
    status, message, code = failure(summary)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return error_response(status, message, "server_error", code=code, headers=headers)


async def whole_turn(runner: TurnRunner, turn: TurnRequest) -> dict[str, Any]:
    """A turn run to its end for a response that is not streamed: its summary (the
    ``turn`` event's data), or ``{"error": refusal}`` when it was refused before it ran."""
    summary: dict[str, Any] = {}
    async for ev in runner.stream(turn):
        if ev.event == "turn":
            summary = ev.data
        elif ev.event == "error":
            summary = {"error": ev.data}
    return summary
