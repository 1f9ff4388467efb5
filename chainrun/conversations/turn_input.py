"""What a turn accepts as input: one rule for the library (:meth:`chainrun.Chain.stream_turn`)
and both faces of ``chainrun serve``, so that a message one accepts the other accepts too.

A message is a non-empty string of at most :data:`MAX_MESSAGE_CHARS` characters that can
be encoded as UTF-8 and holds no NUL character. The UTF-8 rule refuses lone UTF-16
surrogates (U+D800..U+DFFF): a browser's ``JSON.stringify`` of a string cut in the
middle of an emoji sends ``"\\ud83d"``, which Python decodes to a lone surrogate that
neither SQLite nor an HTTP body can carry. The NUL rule is PostgreSQL's: its ``text``
cannot hold U+0000 (the PostgreSQL documentation, section 8.3 "Character Types"), so a
log there would refuse a turn that a SQLite log keeps; both refuse it here, alike.
"""

from __future__ import annotations

from chainrun.conversations.history import HistoryTurn
from chainrun.errors import UserInputError

__all__ = ["MAX_MESSAGE_CHARS", "check_history", "check_turn_input", "text_problem"]

#: longest message a turn accepts, in characters (a chat message, not a document; about
#: 2,000 tokens, a quarter of the local model's default context)
MAX_MESSAGE_CHARS = 8000


def _encoding_problem(text: str) -> str | None:
    nul = text.find("\x00")
    if nul >= 0:
        return (f"a NUL character (U+0000) at character {nul}; expected text without one "
                "(a PostgreSQL log cannot store it)")  # fmt: skip
    if text.isascii():  # the common case: no encode needed
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (
            f"a lone UTF-16 surrogate (U+{ord(text[e.start]):04X}) at character {e.start}; "
            "expected valid Unicode text (a string cut inside an emoji?)"
        )
    return None


def text_problem(value: object, *, required: bool, max_chars: int) -> str | None:
    """What is wrong with ``value`` as a text field, or None when it is fine.

    ``required``: None and blank text are refused (else None is fine). ``max_chars``:
    the longest length accepted, in characters.
    """
    if value is None and not required:
        return None
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if required and not value.strip():
        return "expected a non-empty string"
    if len(value) > max_chars:
        return f"expected at most {max_chars} characters, got {len(value)}"
    return _encoding_problem(value)


def check_turn_input(
    message: object, request_id: object = None, conversation_id: object = None
) -> None:
    """Check a turn's arguments before anything runs.

    Raises:
        UserInputError: ``message`` is not a string, is blank, is over
            :data:`MAX_MESSAGE_CHARS` characters or holds a lone surrogate;
            ``request_id`` / ``conversation_id`` are neither None nor such a string
            (of at most :data:`MAX_MESSAGE_CHARS` characters). The message names the
            argument: ``message: expected a string, got NoneType``.
    """
    for name, value, required in (("message", message, True),
                                  ("request_id", request_id, False),
                                  ("conversation_id", conversation_id, False)):  # fmt: skip
        problem = text_problem(value, required=required, max_chars=MAX_MESSAGE_CHARS)
        if problem is not None:
            raise UserInputError(f"{name}: {problem}")


def check_history(history: object, turn_index: object = None) -> None:
    """Check a turn's ``history`` and ``turn_index`` arguments.

    Raises:
        UserInputError: ``history`` is neither None nor a sequence (list or tuple) of
            :class:`~chainrun.conversations.history.HistoryTurn` whose message and
            answer are strings of at most :data:`MAX_MESSAGE_CHARS` characters of valid
            Unicode (the message non-empty); ``turn_index`` is neither None nor an int
            >= 1. The message names the argument and item: ``history[1].answer: ...``.
    """
    if turn_index is not None and (
        not isinstance(turn_index, int) or isinstance(turn_index, bool) or turn_index < 1
    ):
        raise UserInputError(f"turn_index: expected an int >= 1, got {turn_index!r}")
    if history is None:
        return
    if not isinstance(history, list | tuple):
        raise UserInputError(f"history: expected a list of HistoryTurn, got "
                             f"{type(history).__name__}")  # fmt: skip
    for i, item in enumerate(history):
        if not isinstance(item, HistoryTurn):
            raise UserInputError(f"history[{i}]: expected a HistoryTurn, got "
                                 f"{type(item).__name__}")  # fmt: skip
        for name, value, required in (("message", item.message, True),
                                      ("answer", item.answer, False)):  # fmt: skip
            problem = text_problem(value, required=required, max_chars=MAX_MESSAGE_CHARS)
            if problem is None and value is None:
                problem = "expected a string, got NoneType"
            if problem is not None:
                raise UserInputError(f"history[{i}].{name}: {problem}")
