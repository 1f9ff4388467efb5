"""The ``openai`` SDK client behind every OpenAI-style adapter and the embeddings client.

One place for what the adapters share, whatever their wire format:

- :func:`read_api_key`: the one API-key reader (keys live in the environment; the
  config only names the variable).
- :func:`build_client`: an ``openai.AsyncOpenAI`` (any OpenAI-compatible server) or an
  ``openai.AsyncAzureOpenAI`` (an Azure OpenAI deployment: ``api-key`` header or an
  Entra ID bearer token, ``?api-version=`` on every URL), always with
  ``max_retries=0``: chainrun decides what is retried or hedged, in one place (the
  hedging engine), not the SDK behind its back.
- :func:`map_openai_error`: the one mapping from the SDK's exceptions to chainrun's
  (:mod:`chainrun.errors`), keeping the server's ``Retry-After`` as ``retry_after_s``.

Faults kept apart by the mapping: an HTTP 400 naming a parameter and 401/403/404 are
:class:`~chainrun.errors.RequestRejected` (with the parameter, the value sent and the
values the server says it accepts); an error reported *inside* a 200 stream, as a
``data: {"error": ...}`` line or as an SSE ``error:`` field (llama-server sends
``error: {"code": 400, "message": "the request exceeds the available context size"}``
then ``data: [DONE]``), is a :class:`~chainrun.errors.StreamError`
(:class:`~chainrun.errors.ContextLengthExceeded` when the message says so) with the
server's message kept.
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import re
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx2
import openai
from openai._streaming import SSEDecoder  # the SDK's own decoder, extended below

from chainrun.errors import (
    ConfigError,
    ContextLengthExceeded,
    PromptTooLong,
    ProviderConnectionLost,
    ProviderError,
    ProviderStatusError,
    ProviderTimeout,
    ProviderUnavailable,
    RequestRejected,
    StreamError,
)
from chainrun.providers.affinity import AffinityMode, SlotTable
from chainrun.providers.base import ChatRequest
from chainrun.providers.pool import POOL_CONNECTIONS, ShardedTransport
from chainrun.providers.think import ReasoningInContent

#: s an idle pooled connection is kept (less than servers' common 5 s)
KEEPALIVE_EXPIRY_S = 2.0

#: s without a byte before a read gives up: only a backstop (the step's deadline and its
#: first-token and idle timers bound a call)
READ_TIMEOUT_S = 600.0

#: what the SDK is given when a server needs no key (it refuses to build without one)
NO_KEY = "not-needed"


def read_api_key(env_name: str | None, *, field: str) -> str | None:
    """The API key held by the environment variable ``env_name``.

    Args:
        env_name: the variable's *name* (from the config); None = no key configured.
        field: the config path naming it, for the error (``providers.openai.api_key_env``).

    Returns:
        The key, or None when ``env_name`` is None.

    Raises:
        ConfigError: ``env_name`` names a variable that is unset or empty.
    """
    if not env_name:
        return None
    key = os.environ.get(env_name)
    if not key:
        state = "is not set" if key is None else 'is empty (set to "")'
        raise ConfigError(f"{field}: environment variable {env_name} {state}")
    return key


def _json_body(response: httpx2.Response) -> Any:
    """The response body parsed as JSON, or None when it is not JSON."""
    try:
        return json.loads(response.content)
    except (ValueError, httpx2.ResponseNotRead):
        return None


@dataclass(frozen=True)
class AzureTarget:
    """An Azure OpenAI resource (classic ``/openai/deployments/...`` surface).

    Attributes:
        endpoint: ``https://RESOURCE.openai.azure.com`` (no path).
        api_version: the ``api-version`` query parameter, e.g. ``2024-10-21``.
        deployment: the deployment name; None = the request's model names it.
        entra_token: an Entra ID (Azure AD) bearer token, used when no API key is given.
    """

    endpoint: str
    api_version: str
    deployment: str | None = None
    entra_token: str | None = None


_sse_decode = SSEDecoder.decode


class _ErrorFieldDecoder(SSEDecoder):
    """The SDK's SSE decoder, plus the non-standard ``error:`` field llama-server uses.

    The SSE standard ignores unknown fields, so ``error: {...}`` followed by
    ``data: [DONE]`` would read as an empty stream. Here the field becomes the event's
    data as ``{"error": ...}``, which the SDK raises as an ``APIError`` (the path a
    ``data: {"error": ...}`` line already takes).
    """

    def decode(self, line: str) -> Any:
        # called for every line of every stream: the common case goes straight to the
        # SDK's decode, without building a super() proxy
        if not line.startswith("error:"):
            return _sse_decode(self, line)
        raw = line[len("error:") :].strip()
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        if not isinstance(value, dict):
            value = {"message": str(value) or "error event without a message"}
        if "message" not in value:
            value = {**value, "message": json.dumps(value)}
        self._data.append(json.dumps({"error": value}))
        return None


class _Client(openai.AsyncOpenAI):
    def _make_sse_decoder(self) -> Any:
        return _ErrorFieldDecoder()


class _AzureClient(openai.AsyncAzureOpenAI):
    def _make_sse_decoder(self) -> Any:
        return _ErrorFieldDecoder()


def build_http_client(
    max_connections: int,
    connect_timeout_s: float,
    pool_connections: int = POOL_CONNECTIONS,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> httpx2.AsyncClient:
    """The HTTP client of one provider: ``max_connections`` in all, connect and read
    timeouts in s.

    The connections are split into pools of at most ``pool_connections``
    (:class:`~chainrun.providers.pool.ShardedTransport`: each request goes to the pool
    with the fewest requests in flight), so that httpcore's per-request walk over its
    pool stays short with 1,000 calls in flight. Not when the environment names an HTTP
    proxy (``HTTP_PROXY``, ...; ``urllib.request.getproxies()``): httpx honours those
    only on its own transport, so that client keeps one pool, as before.

    Idle connections are kept for less than servers commonly do (5 s), so that the
    client rarely reuses one the server is closing. The read timeout
    (:data:`READ_TIMEOUT_S` unless given) is only a backstop: the step deadline bounds a
    call.
    """
    timeout = httpx2.Timeout(read_timeout_s, connect=connect_timeout_s)
    if pool_connections < max_connections and not urllib.request.getproxies():
        transport = ShardedTransport(
            max_connections, pool_connections, keepalive_expiry=KEEPALIVE_EXPIRY_S
        )
        return openai.DefaultAsyncHttpxClient(transport=transport, timeout=timeout)
    return openai.DefaultAsyncHttpxClient(
        limits=httpx2.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        ),
        timeout=timeout,
    )


def build_client(
    *,
    base_url: str | None,
    api_key: str | None,
    http_client: httpx2.AsyncClient | None = None,
    azure: AzureTarget | None = None,
    timeout_s: float | None = None,
) -> openai.AsyncOpenAI:
    """An SDK client with ``max_retries=0``.

    Args:
        base_url: an OpenAI-compatible ``.../v1`` URL (ignored when ``azure`` is given).
        api_key: the key (:func:`read_api_key`); None = a server that needs none, or
            Azure with an Entra ID token.
        http_client: the HTTP client to use (its pool and timeouts); None = the SDK's.
        azure: build an ``AsyncAzureOpenAI`` for this resource instead.
        timeout_s: the SDK's per-request timeout in s (None: the HTTP client's).

    Raises:
        ConfigError: Azure without an API key or an Entra ID token.
    """
    extra: dict[str, Any] = {}
    if http_client is not None:
        extra["http_client"] = http_client
    if timeout_s is not None:
        extra["timeout"] = timeout_s
    if azure is None:
        return _Client(base_url=base_url, api_key=api_key or NO_KEY, max_retries=0, **extra)
    if api_key is None and azure.entra_token is None:
        raise ConfigError("azure provider: needs an API key or an Entra ID token")
    auth: dict[str, Any] = (
        {"api_key": api_key} if api_key is not None else {"azure_ad_token": azure.entra_token}
    )
    return _AzureClient(
        azure_endpoint=azure.endpoint,
        api_version=azure.api_version,
        azure_deployment=azure.deployment,
        max_retries=0,
        **auth,
        **extra,
    )


#: The longest server pushback believed, in s (one day): a larger value is read as a
#: broken header and ignored rather than stalling a step for it.
MAX_RETRY_AFTER_S = 86_400.0


def _pushback_s(value: float) -> float | None:
    """``value`` (s) when it is a wait a server could mean: finite, not negative, at most
    :data:`MAX_RETRY_AFTER_S`; else None (ignored)."""
    if not math.isfinite(value) or value < 0 or value > MAX_RETRY_AFTER_S:
        return None
    return value


def retry_after_s(headers: Any, *, now: datetime | None = None) -> float | None:
    """The server's pushback from response headers, in s; None when it sent none we can use.

    Read in this order: OpenAI's ``retry-after-ms`` (milliseconds), then ``Retry-After``
    in either of RFC 9110 §10.2.3's forms: delay-seconds (``"30"``) or an HTTP-date
    (``"Wed, 21 Oct 2026 07:28:00 GMT"``, counted from ``now``, default the current UTC
    time; a date already past is a wait of 0). Negative, ``nan``, infinite or absurd
    values (beyond :data:`MAX_RETRY_AFTER_S`) are ignored.
    """
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            wait = _pushback_s(float(ms) / 1000.0)
        except ValueError:
            wait = None
        if wait is not None:
            return wait
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return _pushback_s(float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110's IMF-fixdate is always GMT
        when = when.replace(tzinfo=UTC)
    current = now or datetime.now(UTC)
    return _pushback_s(max(0.0, (when - current).total_seconds()))


_CONTEXT_RE = re.compile(
    r"context (?:size|length|window)|maximum context|too many tokens|exceeds? the (?:available )?"
    r"context",
    re.I,
)
_ACCEPTED_RE = re.compile(
    r"(?:supported values|valid values|allowed values|must be one of|expected one of)"
    r"(?: are| is)?:?\s*(.*)",
    re.I | re.S,
)


def accepted_values(message: str) -> tuple[str, ...]:
    """The values an error message says are accepted ("Supported values are: 'none',
    'low', 'medium', and 'high'." gives ('none', 'low', 'medium', 'high')); () if none."""
    m = _ACCEPTED_RE.search(message)
    if not m:
        return ()
    return tuple(a or b for a, b in re.findall(r"'([^']*)'|\"([^\"]*)\"", m.group(1)))


def sent_value(params: dict[str, Any] | None, param: str) -> Any:
    """The value sent for ``param`` (a top-level name, or a dotted/indexed path), or None."""
    value: Any = params
    for part in re.findall(r"[^.\[\]]+", param):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _stream_error(name: str, e: openai.APIError) -> StreamError:
    """An error the server reported inside a 200 stream, its message and code kept."""
    return stream_error_from_body(name, e.body, e.message)


def stream_error_from_body(name: str, body: Any, message: str) -> StreamError:
    """The error a server reported inside a 200 stream (``{"error": body}``), its message
    and code kept; ``message``: the text when ``body`` names none.

    Returns:
        :class:`ContextLengthExceeded` when the message says the prompt does not fit
        (or the code is ``context_length_exceeded``), else :class:`StreamError`.
    """
    body = body if isinstance(body, dict) else {}
    message = str(body.get("message") or message)
    code = body.get("code")
    text = f"{name}: stream error" + (f" {code}" if code is not None else "") + f": {message}"
    if code == "context_length_exceeded" or _CONTEXT_RE.search(message):
        return ContextLengthExceeded(text, code)
    return StreamError(text, code)


def status_error(
    name: str,
    status: int,
    message: str,
    body: Any,
    headers: Any,
    *,
    params: dict[str, Any] | None = None,
) -> ProviderStatusError:
    """The chainrun error for an HTTP error status, whichever client read it.

    Args:
        name: the provider's name, for the message.
        status: the HTTP status (4xx or 5xx).
        message: the error's text as the ``openai`` SDK words it (``Error code: 429 -
            slow down``: :func:`sdk_status_message`).
        body: the server's error object (the ``error`` member of a JSON body, else the
            body), where ``param``, ``code`` and ``message`` are read.
        headers: the response headers (a mapping with case-insensitive ``get``), for
            ``retry_after_s``.
        params: the request's parameters as sent (to name the value a 400 refused).

    Returns:
        :class:`PromptTooLong` for a 400 saying the prompt exceeds the model's context,
        :class:`RequestRejected` for another 400 naming a parameter and for 401/403/404,
        else :class:`ProviderStatusError` with ``retry_after_s`` from the headers.
    """
    text = f"{name}: HTTP {status}: {message}"
    error = body if isinstance(body, dict) else {}
    if status == 400 and (error.get("code") == "context_length_exceeded"
                          or _CONTEXT_RE.search(str(error.get("message") or message))):
        return PromptTooLong(text, status)
    param = error.get("param")
    param = param if isinstance(param, str) and param else None
    if (status == 400 and param is not None) or status in (401, 403, 404):
        code = error.get("code")
        return RequestRejected(
            text, status, param=param,
            value=sent_value(params, param) if param else None,
            accepted=accepted_values(str(error.get("message") or message)),
            code=None if code is None else str(code), provider=name,
        )  # fmt: skip
    return ProviderStatusError(text, status=status, retry_after_s=retry_after_s(headers))


def sdk_status_message(status: int, raw: bytes) -> tuple[str, Any]:
    """(message, body) of an HTTP error response as the ``openai`` SDK makes them
    (``_make_status_error_from_response`` and ``_make_status_error`` of openai 3.57):
    the message is ``Error code: STATUS``, plus `` - MESSAGE`` when the body is JSON
    with a text ``message`` (in its ``error`` member, or at the top); the body is the
    JSON's ``error`` member (or the whole JSON), else the body's text."""
    message = f"Error code: {status}"
    text = raw.decode("utf-8", "replace").strip()
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        return message, text
    body = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    said = body.get("message") if isinstance(body, dict) else None
    if isinstance(said, str) and said:
        message += f" - {said}"
    return message, body


def map_openai_error(
    e: BaseException,
    *,
    name: str,
    where: str,
    streaming: bool = False,
    params: dict[str, Any] | None = None,
) -> ProviderError:
    """The chainrun error for an ``openai`` (or ``httpx2``) exception.

    Args:
        e: what the SDK raised.
        name: the provider's name (``providers.NAME``) for the message.
        where: the server (a URL) for the message.
        streaming: ``e`` was raised while reading a stream that had started (the
            server was reached: a broken connection is then no "cannot reach").
        params: the request's parameters as sent (to name the value a 400 refused).

    Returns:
        :class:`ProviderTimeout` (the HTTP client timed out, before or during the
        stream), :class:`ProviderUnavailable`
        (cannot connect), :class:`RequestRejected` (HTTP 400 naming a parameter, or
        401/403/404), :class:`ProviderStatusError` (any other HTTP error status, with
        ``retry_after_s`` from its headers), :class:`StreamError` (an error the server
        reported inside the stream; :class:`ContextLengthExceeded` when the prompt does
        not fit), :class:`ProviderConnectionLost` (the connection broke after the stream
        started), or :class:`ProviderError` (anything else the SDK raised).
    """
    if (
        streaming
        and isinstance(e, openai.APIError)
        and not isinstance(e, openai.APIConnectionError | openai.APIStatusError)
    ):
        return _stream_error(name, e)
    if streaming and not isinstance(e, openai.APIStatusError):
        detail = str(e) if isinstance(e, openai.APIError) else f"{type(e).__name__}: {e}"
        if connection_broke(e):
            return ProviderConnectionLost(f"{name}: connection lost mid-stream: {detail}")
        if read_timed_out(e):
            return ProviderTimeout(f"{name}: read timed out mid-stream: {detail}")
        return ProviderError(f"{name}: stream failed: {detail}")
    if isinstance(e, openai.APITimeoutError):
        return ProviderTimeout(f"{name}: request timed out ({e})")
    if isinstance(e, openai.APIConnectionError):
        return ProviderUnavailable(f"cannot reach provider {name!r} at {where}")
    if isinstance(e, openai.APIStatusError):
        return status_error(
            name, e.status_code, e.message, e.body, e.response.headers, params=params
        )
    if isinstance(e, openai.APIError):
        return ProviderError(f"{name}: stream failed: {e}")
    return ProviderError(f"{name}: stream failed: {type(e).__name__}: {e}")


def connection_broke(e: BaseException) -> bool:
    """True when ``e`` (or what caused it) is the connection itself failing: reset,
    closed by the server mid-body (httpx's ``NetworkError``, ``RemoteProtocolError``)."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, httpx2.NetworkError | httpx2.RemoteProtocolError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def read_timed_out(e: BaseException) -> bool:
    """True when ``e`` (or what caused it) is the HTTP client's own timeout (httpx's
    ``TimeoutException``: no bytes within the read timeout)."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, httpx2.TimeoutException):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def stale_connection(e: BaseException) -> bool:
    """True when ``e`` came from reusing a keep-alive connection the server had closed."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, httpx2.RemoteProtocolError) and "without sending" in str(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def server_address(url: str) -> str:
    """``host:port`` of ``url`` (the scheme's port when it names none): what the log's
    ``server.address`` holds (OpenTelemetry GenAI semantic conventions)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


class OpenAIClientProvider:
    """What every provider over the ``openai`` SDK shares: the client and its lifecycle.

    Subclasses add the wire format (:class:`~chainrun.providers.openai_compat.
    OpenAICompatProvider` for Chat Completions, :class:`~chainrun.providers.responses.
    ResponsesProvider` for the Responses API).

    Args:
        name: the provider's name in the config.
        base_url: e.g. ``http://127.0.0.1:8080/v1``; None = the OpenAI default
            (ignored for Azure, whose URLs come from ``azure.endpoint``).
        api_key_env: name of the environment variable holding the key (never the key).
        max_connections: HTTP connections at most (all pools together).
        connect_timeout_s: connect timeout in s.
        pool_connections: connections per pool at most (:func:`build_http_client`).
        http_client: an HTTP client to use instead (not closed by :meth:`aclose`).
        azure: an Azure OpenAI resource to call instead of ``base_url``.
        read_timeout_s: s without a byte before a read gives up (a backstop:
            :data:`READ_TIMEOUT_S`).

    Raises:
        ConfigError: ``api_key_env`` names a variable that is not set; Azure without
            a key or an Entra ID token.
    """

    def __init__(
        self,
        name: str,
        base_url: str | None,
        api_key_env: str | None = None,
        max_connections: int = 100,
        connect_timeout_s: float = 5.0,
        http_client: httpx2.AsyncClient | None = None,
        *,
        azure: AzureTarget | None = None,
        pool_connections: int = POOL_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.name = name
        #: prompt-cache affinity (:mod:`chainrun.providers.affinity`): ``key`` sends
        #: ``prompt_cache_key``, ``slot`` names a llama-server slot, ``off`` neither
        self.affinity: AffinityMode = "off"
        #: the ``prompt_cache_key`` to send instead of the request's conversation id
        self.affinity_key: str | None = None
        #: mode ``slot``: the conversations' slots (None until the slot count is known)
        self.slot_table: SlotTable | None = None
        #: where the server may put a thought (:mod:`chainrun.providers.think`); the
        #: config's ``reasoning_in_content`` (``auto`` unless set)
        self.reasoning_in_content: ReasoningInContent = "auto"
        key = read_api_key(api_key_env, field=f"providers.{name}.api_key_env")
        if azure is not None and key is None and azure.entra_token is None:
            raise ConfigError(
                f"providers.{name}: kind 'azure' needs api_key_env or entra_token_env"
            )
        self.base_url = base_url
        self.azure = azure
        url = azure.endpoint if azure is not None else (base_url or "https://api.openai.com/v1")
        self.where = url
        self.server_address: str | None = server_address(url)
        self.max_connections = max_connections
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._owns_http = http_client is None
        self._http = http_client or build_http_client(
            max_connections, connect_timeout_s, pool_connections, read_timeout_s
        )
        self.client = build_client(
            base_url=base_url, api_key=key, http_client=self._http, azure=azure
        )

    def repoint(self, base_url: str) -> None:
        """Send every later request to ``base_url`` (an OpenAI-compatible ``.../v1`` URL),
        keeping the connection pools: a server that moved (the embedded local model
        started again on another port). Requests in flight finish where they went.

        Raises:
            ValueError: an Azure provider (its URLs are built from its endpoint).
        """
        if self.azure is not None:
            raise ValueError(f"provider {self.name!r}: an Azure provider cannot be repointed")
        self.base_url = self.where = base_url
        self.server_address = server_address(base_url)
        self.client.base_url = base_url  # the SDK joins every request's path to it

    def _error(
        self,
        e: BaseException,
        *,
        streaming: bool = False,
        params: dict[str, Any] | None = None,
    ) -> ProviderError:
        return map_openai_error(
            e, name=self.name, where=self.where, streaming=streaming, params=params
        )

    async def _send(self, create: Callable[..., Awaitable[Any]], params: dict[str, Any]) -> Any:
        """``await create(**params)``; once more if a pooled keep-alive connection was stale.

        A server may close an idle or much-used keep-alive connection (llama.cpp's
        HTTP server caps requests per connection) just as the client reuses it; the
        request then fails with "Server disconnected without sending a response"
        before the server saw it. Sending it again on a fresh connection is safe and
        is what browsers do; any other failure is not retried here (hedging decides).

        Raises:
            ProviderError: mapped by :func:`map_openai_error`.
        """
        try:
            try:
                return await create(**params)
            except openai.APIConnectionError as e:
                if not stale_connection(e):
                    raise
                return await create(**params)
        except openai.APIError as e:
            raise self._error(e, params=params) from e

    def prompt_cache_key(self, request: ChatRequest) -> str | None:
        """The ``prompt_cache_key`` to send with ``request`` (None: none): in mode
        ``key``, the configured key, else the request's conversation."""
        if self.affinity != "key":
            return None
        return self.affinity_key or request.cache_key

    async def server_slots(self) -> int | None:
        """A llama-server's slot count (``total_slots`` of ``GET /props`` at the server's
        root, beside ``/v1``); None when the server does not say (not a llama-server,
        an error, no answer within the connect timeout + 5 s)."""
        root = (self.base_url or "").rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        try:
            r = await self._http.get(root + "/props", timeout=self._connect_timeout_s + 5.0)
            n = r.json().get("total_slots") if r.status_code == 200 else None
        except (httpx2.HTTPError, ValueError, AttributeError):
            return None
        return n if isinstance(n, int) and n >= 1 else None

    async def check(self) -> None:
        """Fail fast when the server cannot be reached, or is not an OpenAI-compatible API
        at all (``GET .../models``).

        Not OpenAI-compatible: the answer is not JSON (a static file server's HTML page,
        with any status), or a 2xx JSON body without the ``data`` list of a model list.
        An HTTP error *with* a JSON body (no models endpoint, a key refused for it) is
        left for the first real call to judge, and so is anything an Azure resource
        answers (its URLs are built from the endpoint, not a hand-written base_url).

        Raises:
            ProviderUnavailable: cannot connect (refused, DNS, connect timeout), no answer
                within ``connect_timeout_s`` + 5 s, or the server is not an
                OpenAI-compatible API.
        """
        timeout_s = self._connect_timeout_s + 5.0
        try:
            raw = await self.client.models.with_raw_response.list(timeout=timeout_s)
        except openai.APITimeoutError:
            # accepted the connection, then said nothing: name the check and the URL
            raise ProviderUnavailable(
                f"provider {self.name!r} at {self.where} did not answer the startup check "
                f"(GET /models) within {timeout_s:g} s: the server accepts connections but "
                "does not respond"
            ) from None
        except openai.APIConnectionError as e:
            raise self._error(e) from e
        except openai.APIStatusError as e:
            if self.azure is None and _json_body(e.response) is None:
                raise ProviderUnavailable(self._not_openai(e.response)) from None
            return
        except openai.APIError:
            return
        if self.azure is not None:
            return
        body = _json_body(raw.http_response)
        if not (isinstance(body, dict) and isinstance(body.get("data"), list)):
            raise ProviderUnavailable(self._not_openai(raw.http_response))

    def _not_openai(self, response: httpx2.Response) -> str:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        return (
            f"provider {self.name!r} at {self.where} is not an OpenAI-compatible API (GET "
            f"/models answered HTTP {response.status_code} with {kind}, not a JSON model "
            "list); check its base_url (it usually ends in /v1)"
        )

    async def aclose(self) -> None:
        """Close the HTTP client (when this provider built it)."""
        if self._owns_http:
            await self._http.aclose()
