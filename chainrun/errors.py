"""The one exception tree of chainrun.

::

    ChainrunError                 root: catch this to catch everything chainrun raises
    ├── UserInputError            the user's mistake; the CLI prints one line and exits 2
    │   ├── ConfigError           bad chainrun.toml / field path and value named
    │   └── InputFileError        bad replay / eval / catalogue / scenario file, file and line named
    ├── ChainClosed               a turn asked of a Chain already closed (also a RuntimeError)
    ├── RequestInProgress         an Idempotency-Key's first request still runs past the wait
    ├── LogUnavailable            the log a request needs (owner, key) away past the turn's wait
    ├── LogWriteError             a run log write failed (turns that returned and are lost named)
    │   ├── LogFileGone           the log's file was deleted or replaced during a run
    │   ├── LogWriteLost          a write given up: the database away too long, or the queue full
    │   └── LogWriterStopped      the log's writer thread stopped on an error of its own
    └── ProviderError             the model server failed us (not the user's fault)
        ├── ProviderUnavailable   cannot connect / server not running / local model missing
        ├── ProviderStatusError   the server answered with an HTTP error status
        │   └── RequestRejected   400 naming a parameter, 401/403/404: a configuration mistake
        ├── StreamError           the server reported an error inside a 200 stream (SSE)
        │   └── ContextLengthExceeded   ... because the prompt does not fit the context
        ├── ProviderTimeout       no answer within the step's deadline
        │   ├── FirstTokenTimeout no first content/reasoning token within first_token_timeout_s
        │   └── IdleTimeout       a gap between chunks longer than idle_timeout_s
        ├── InvalidAnswer         an answer not in the required form (not JSON, breaks its schema)
        ├── MalformedStream       a stream line that is not valid SSE/JSON
        ├── StreamTruncated       the stream ended without a finish_reason
        ├── ToolRoundsExceeded    the model still asked for tools after max_tool_rounds
        └── AnswerCutAtLimit      an answer cut at the token cap (on_truncated = "fail")

An error that refuses a request before its turn runs (the front desk,
:mod:`chainrun.desk`) carries the HTTP status a face answers it with (``http_status``:
400 a bad request, 403 another identity's conversation, 409 a key still in progress, 422
a key reused, 503 the log away); None for the rest.

A :class:`RequestRejected` from a step is turned by the chain into a
:class:`StepConfigError` (a :class:`ConfigError`): a replay or eval stops at the first
one, and a live chain raises it to its caller.

User mistakes and provider failures are kept apart on purpose: the first is fixed
by editing a file, the second by waiting or pointing at another server. The CLI
exits 2 for both (a clear one-line message, never a traceback; with ``--json`` also
:meth:`ChainrunError.as_dict` as one JSON document on stdout).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class ChainrunError(Exception):
    """Root of every exception chainrun raises on purpose.

    ``path`` and ``line`` (1-based) name the file at fault when there is one, else None.
    """

    path: str | None = None
    line: int | None = None
    #: the HTTP status of a request refused with this error before its turn ran (None:
    #: not such a refusal)
    http_status: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{"type", "message", "file", "line"}``: ``type`` is the class name in snake case
        (``config_error``, ``input_file_error``, ``provider_unavailable``...), ``file`` and
        ``line`` are None when no file is at fault (the shape of ``--json`` errors)."""
        return {"type": _snake(type(self).__name__), "message": str(self),
                "file": self.path, "line": self.line}  # fmt: skip


class UserInputError(ChainrunError):
    """Something the user wrote (a file, an option, a request's field) is wrong."""

    http_status = 400


class ConversationForbidden(UserInputError):
    """A conversation is bound to another identity than the caller's (``chainrun serve``
    answers 403, naming nothing of the conversation)."""

    http_status = 403


class IdempotencyKeyReused(UserInputError):
    """An ``Idempotency-Key`` sent again with a different request (serve answers 422
    naming the key)."""

    http_status = 422

    def __init__(self, key: str) -> None:
        super().__init__(f"Idempotency-Key {key!r} was used for a different request; "
                         "send a new key for a new request")  # fmt: skip
        self.key = key


class RequestInProgress(ChainrunError):
    """The first request with this ``Idempotency-Key`` is still running (in another
    process) past the wait; nothing was run for this one (serve answers 409)."""

    http_status = 409


class LogUnavailable(ChainrunError, ConnectionError):
    """The run log a request needs before its turn can run (its conversation's owner, its
    ``Idempotency-Key``) did not answer within the turn's wait for an outage (``[log]
    outage_wait_s``); nothing ran (serve answers 503 with ``Retry-After``). The message
    says for how long the log has been away."""

    http_status = 503


class ConfigError(UserInputError):
    """The chain configuration is invalid; the message names the field path and the bad value.

    ``path``: the config file at fault, when the config came from a file; ``line`` when
    the TOML parser named one.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class InputFileError(UserInputError):
    """An input file is malformed; the message names the file, the line and what was expected."""

    def __init__(self, path: str, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


class ChainClosed(ChainrunError, RuntimeError):
    """A :class:`~chainrun.Chain` was used after :meth:`~chainrun.Chain.aclose` (or after
    its ``async with`` block): its providers are closed and its run has ended, so a turn
    would be logged into a finished run. Build a new chain."""


@dataclass(frozen=True)
class LostTurn:
    """A turn that returned (its ``TurnFinished`` has ``turn_id``) but whose rows the run
    log refused: the turn is not in the log.

    Attributes:
        turn_id: the id the turn returned with (no row has it).
        request_id: the turn's request id (a replay's request ``id``), None when it had none.
        error: what the database said.
    """

    turn_id: int | None
    request_id: str | None
    error: str

    def as_dict(self) -> dict[str, Any]:
        """``{"turn_id", "request_id", "error"}``."""
        return {"turn_id": self.turn_id, "request_id": self.request_id, "error": self.error}

    def describe(self) -> str:
        """``turn 5 (request r2)``."""
        return f"turn {self.turn_id} (request {self.request_id or '-'})"


class LogWriteError(ChainrunError):
    """A write to the run log failed: catch this for "a log write failed". Raised as is
    when turns that had returned could not be written (a write the database refused:
    disk full, a constraint, a lock held past the busy timeout; they are named in
    ``lost``): the run ends ``lost_turns``, and a resumed replay runs them again. Its
    subclasses :class:`LogFileGone`, and ``LogWriteLost`` and ``LogWriterStopped`` of
    :mod:`chainrun.log.writer` (a write given up while the database was away, the writer
    thread stopped; their ``lost`` is empty: the turns they cost are named by the next
    flush), say what else went wrong.

    Attributes:
        lost: the turns lost since the last time this was raised (:class:`LostTurn`).
        log: the log file (None: not known).

    ``message``: the error's text (default: the first lost turn named, and how many more).
    """

    error_type = "log_write"
    #: a request whose run could not be created or written answers 503
    http_status = 503

    def __init__(
        self, lost: list[LostTurn], log: str | None = None, *, message: str | None = None
    ) -> None:
        self.lost = list(lost)
        self.log = log
        if message is None:
            where = f"run log {log}" if log else "run log"
            first = lost[0] if lost else None
            what = (f"{first.describe()} was not logged: {first.error}" if first is not None
                    else "a write failed")  # fmt: skip
            more = f" (and {len(lost) - 1} more turns)" if len(lost) > 1 else ""
            message = f"{where}: {what}{more}"
        super().__init__(message)

    def lines(self) -> list[str]:
        """One line per lost turn, each naming its turn id and request id."""
        where = f"run log {self.log}: " if self.log else ""
        return [f"{where}{t.describe()} was not logged: {t.error}" for t in self.lost]


class LogFileGone(LogWriteError):
    """The run log's SQLite file was deleted, or replaced by another file, while a run was
    writing it. SQLite raises nothing then: its open connections go on writing to the
    deleted file, which disappears with them when the process ends, so every turn of
    the run (and of any other run in that file) is lost. A replay or eval stops at the
    first turn that finds the file gone.

    Attributes:
        lost: the run's turns that were in the file (:class:`LostTurn`, oldest first).
        log: the log file.
        run_id: the run that was being written.
        not_run: requests of the run that were not sent because of it.
    """

    def __init__(self, log: str, run_id: int, lost: list[LostTurn], not_run: int = 0) -> None:
        self.run_id = run_id
        self.not_run = not_run
        names = [t.request_id or f"turn {t.turn_id}" for t in lost]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        turns = f"its {len(lost)} turns so far ({shown}) are lost with it" if lost else (
            "no turn of it had been written")  # fmt: skip
        rest = f"; stopped with {not_run} requests not run" if not_run else ""
        message = (f"run log {log} was deleted or replaced while run {run_id} was writing "
                   f"it: {turns}{rest}")  # fmt: skip
        super().__init__(lost, log, message=message)
        self.path = log  # the file at fault (--json's "file")


class ProviderError(ChainrunError):
    """A model provider failed to give an answer."""

    #: short machine-readable kind stored in ``calls.error_type`` (OpenTelemetry ``error.type``)
    error_type: str = "provider_error"


class ProviderUnavailable(ProviderError):
    """The provider cannot be reached (connection refused, DNS, local server not installed)."""

    error_type = "unavailable"


class ProviderConnectionLost(ProviderError):
    """The provider's connection broke while its answer streamed (closed or reset by the
    server before the stream ended, e.g. a killed server): the server went away, nothing
    the chain decided. ``chainrun replay --resume`` runs such a refused turn again."""

    error_type = "connection_lost"


class ProviderStatusError(ProviderError):
    """The provider answered with an HTTP error status.

    Attributes:
        status: the HTTP status code (e.g. 429, 500).
        retry_after_s: the server's ``Retry-After`` in seconds, when it sent one.
    """

    def __init__(self, message: str, status: int, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s
        self.error_type = f"http_{status}"


class PromptTooLong(ProviderStatusError):
    """The provider refused the request as longer than the model's context: HTTP 400
    saying so (llama-server: "the request exceeds the available context size"; OpenAI:
    code ``context_length_exceeded``). A shorter prompt would pass, the same one never
    will: not a configuration mistake, and not worth a retry."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message, status)
        self.error_type = "context_length"


class RequestRejected(ProviderStatusError):
    """The provider refused the request itself: HTTP 400 naming a request parameter
    (``param``), or 401/403/404 (bad key, no access, unknown model). Retrying or hedging
    cannot help; the configuration must change.

    Attributes:
        param: the request parameter the provider named (None for 401/403/404).
        value: the value chainrun sent for ``param`` (None when not sent or unknown).
        accepted: the values the provider says it accepts, when its message lists them.
        code: the provider's error code (e.g. ``unsupported_value``), when given.
        provider: the name of the provider that refused.
    """

    def __init__(
        self,
        message: str,
        status: int,
        *,
        param: str | None = None,
        value: object = None,
        accepted: tuple[str, ...] = (),
        code: str | None = None,
        provider: str | None = None,
    ) -> None:
        super().__init__(message, status)
        self.provider = provider
        self.param = param
        self.value = value
        self.accepted = accepted
        self.code = code


class StepConfigError(ConfigError):
    """A step's configuration was refused by its provider (see :class:`RequestRejected`);
    the message is one line naming the step, the parameter, the value sent and the values
    the provider accepts."""

    def __init__(self, step: str, provider: str, rejected: RequestRejected) -> None:
        r = rejected
        if r.param is not None:
            sent = f"{r.value!r}" if r.value is not None else "(not sent)"
            accepts = "; it accepts " + ", ".join(repr(a) for a in r.accepted) if r.accepted else ""
            why = f" {r.code}" if r.code else ""
            text = (
                f"steps.{step}: provider {provider!r} refused {r.param} = {sent} "
                f"(HTTP {r.status}{why}){accepts}"
            )
        else:
            what = {401: "the API key", 403: "access", 404: "the model or URL"}.get(
                r.status, "the request"
            )
            text = (
                f"steps.{step}: provider {provider!r} refused {what} on the step's first call "
                f"(HTTP {r.status}){_server_detail(str(r), provider, r.status)}"
            )
        super().__init__(text)
        self.step = step
        self.rejected = rejected
        #: the turn's ``error_type`` in the log (that of the refusal, e.g. ``http_400``)
        self.error_type = rejected.error_type


def _server_detail(message: str, provider: str, status: int) -> str:
    """``": <what the server said>"``, without the provider and status already said, and
    empty when the server said nothing but its status (the SDK's ``Error code: 404``)."""
    detail = message.removeprefix(f"{provider}: HTTP {status}: ").strip()
    if not detail or re.fullmatch(rf"Error code: {status}", detail):
        return ""
    return f": {detail}"


class StreamError(ProviderError):
    """The server reported an error inside an HTTP 200 stream (an SSE ``error:`` event or
    a ``data: {"error": ...}`` line); the server's message is kept.

    Attributes:
        code: the error's ``code`` as the server sent it (e.g. 400, 503), or None.
    """

    def __init__(self, message: str, code: object = None) -> None:
        super().__init__(message)
        self.code = code


class ContextLengthExceeded(StreamError):
    """The prompt does not fit the model's context (said by the server)."""

    error_type = "context_length"


class ProviderTimeout(ProviderError):
    """No answer arrived within the step's deadline."""

    error_type = "timeout"


class FirstTokenTimeout(ProviderTimeout):
    """No first content or reasoning token within the step's ``first_token_timeout_s``
    (this also catches a server that accepts the connection and never sends headers).
    A hedged step starts its next copy at once (``status`` is in every hedge's non-fatal
    set)."""

    error_type = "first_token_timeout"
    status = "first_token_timeout"


class IdleTimeout(ProviderTimeout):
    """After the first token, a gap between chunks longer than ``idle_timeout_s``."""

    error_type = "idle_timeout"


class InvalidAnswer(ProviderError):
    """The model answered, but not in the form the step requires (e.g. not JSON)."""

    error_type = "invalid_answer"


class MalformedStream(ProviderError):
    """The server sent a stream line chainrun cannot decode (not JSON where JSON belongs)."""

    error_type = "malformed_stream"


class StreamTruncated(ProviderError):
    """The stream ended (or was cut) before a ``finish_reason`` arrived."""

    error_type = "truncated"


class UndeclaredUpdate(ChainrunError):
    """A step handed back a turn-state field it does not declare in its ``writes`` (a
    bug of the step's kind): the step fails under its ``on_failure``, logged as
    ``internal_error`` with the message in its row's ``detail``."""

    error_type = "internal_error"


class ToolRoundsExceeded(ProviderError):
    """A step's model still asked for tools after its ``max_tool_rounds`` rounds (its
    answer never came); the step's ``on_failure`` decides what the turn does."""

    error_type = "tool_rounds_exceeded"


class AnswerCutAtLimit(ProviderError):
    """The model stopped at the step's token cap (finish reason ``length``; the Responses
    API's ``response.incomplete`` with reason ``max_output_tokens``) and the step treats a
    cut answer as a failure (``on_truncated = "fail"``)."""

    error_type = "length"


def error_type(err: BaseException | None) -> str | None:
    """The ``error.type`` stored for ``err`` in ``calls`` and ``steps`` (None: no error).

    One vocabulary for the whole log:

    * ``timeout``: no answer inside the step's deadline;
    * ``unavailable``, ``http_NNN``, ``truncated``, ``invalid_answer``,
      ``provider_error``: the provider failures of this module (their ``error_type``);
    * ``circuit_open``: every target's circuit breaker was open, nothing was sent;
    * ``cancelled``: the caller went away (or a sibling step failed closed);
    * ``internal_error``: anything else (a bug: the message is logged with it).

    The hedging engine's own exceptions (:mod:`chainrun.hedging.errors`) are mapped
    here, so that the engine stays free of chainrun's error tree.
    """
    if err is None:
        return None
    if isinstance(err, ChainrunError):
        return getattr(err, "error_type", None) or "internal_error"
    if isinstance(err, TimeoutError):
        return "timeout"
    # imported here, not at the top: every CLI command imports this module, and the
    # hedging package (its policy models) is not needed to list runs or print --help
    from chainrun.hedging.errors import CircuitOpen, NoAcceptableAnswer

    if isinstance(err, CircuitOpen):
        return "circuit_open"
    if isinstance(err, NoAcceptableAnswer):
        return "invalid_answer"
    asyncio = sys.modules.get("asyncio")  # without asyncio loaded, nothing was cancelled
    if asyncio is not None and isinstance(err, asyncio.CancelledError):
        return "cancelled"
    return "internal_error"
