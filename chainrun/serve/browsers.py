"""What a browser may do with ``chainrun serve`` and ``chainrun review``: the ASGI
middleware between the network and the routes.

A page on another origin can make a shopper's browser send requests to the server (a
form post needs no permission), and a DNS name the attacker controls can be pointed at
a loopback address (DNS rebinding) so that the page's own origin is the server. Three
checks close that:

- :class:`RequireJSON`: every request with a body (any method but GET, HEAD and
  OPTIONS) must say ``Content-Type: application/json``; anything else is answered 415
  (``unsupported_media_type``) before the body is read. An HTML form can only send
  ``application/x-www-form-urlencoded``, ``multipart/form-data`` or ``text/plain``,
  and a script on another origin that sets ``application/json`` makes the browser ask
  first (a CORS preflight, Fetch standard section 3.2.3 "CORS-safelisted request
  header"), which the server answers only for the origins it was given.
- :class:`CheckedHost`: the ``Host`` header must name the server (:func:`allowed_hosts`:
  the bound address, its loopback names, and the names configured); anything else is
  answered 400 (``invalid_host``), so a rebound name reaches nothing.
- CORS (:func:`cors`, Starlette's ``CORSMiddleware``): off unless origins are given
  (``serve --cors-origin``); then those origins may call the server from a page: the
  preflight is answered for ``Authorization``, ``Content-Type``, ``Idempotency-Key``,
  the identity and conversation headers, and every response (a stream too) carries
  ``Access-Control-Allow-Origin`` and exposes ``x-request-id`` and ``Retry-After``.

And :class:`RequestId`: every response carries ``x-request-id`` (32 hex digits, new
per request; a turn's request id in the log is the same), as OpenAI's API does.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Iterable, Sequence

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chainrun.serve.errors import error_response

__all__ = ["CheckedHost", "RequestId", "RequireJSON", "allowed_hosts", "cors", "is_loopback",
           "request_id"]

#: methods that carry no body: not checked by :class:`RequireJSON`
BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: the header every response carries its request id in
REQUEST_ID_HEADER = "x-request-id"
#: names of the loopback interface a loopback-bound server answers to
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: addresses that bind every interface: the Host is then not checked unless names are given
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")


def request_id(scope: Scope) -> str | None:
    """The request id :class:`RequestId` gave this request (None: the app runs without it)."""
    state = scope.get("state")
    return state.get("request_id") if isinstance(state, dict) else None


class RequestId:
    """Pure ASGI: a new request id per HTTP request, kept in the request's state
    (``request.state.request_id``, :func:`request_id`) and sent as ``x-request-id`` on
    its response, whatever answers it (a route, a refusal of the middleware, an error)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if REQUEST_ID_HEADER not in headers:
                    headers[REQUEST_ID_HEADER] = rid
            await send(message)

        await self.app(scope, receive, send_with_id)


class RequireJSON:
    """Pure ASGI: a request with a body must be ``application/json`` (see the module
    text); else 415 ``unsupported_media_type`` in the one error shape, its body unread."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in BODILESS_METHODS:
            given = Headers(scope=scope).get("content-type", "")
            media = given.partition(";")[0].strip().lower()
            if media != "application/json":
                said = f"got {given!r}" if given else "got none"
                response = error_response(
                    415, f"Content-Type: expected application/json, {said}",
                    param="Content-Type", code="unsupported_media_type",
                )  # fmt: skip
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def host_name(header: str) -> str:
    """The name of a ``Host`` header without its port, lower-cased (``[::1]:8000`` ->
    ``::1``; RFC 9110 section 7.2)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def allowed_hosts(bound: str, names: Iterable[str] = ()) -> tuple[str, ...] | None:
    """The ``Host`` names a server bound to ``bound`` answers to: ``names`` (each a host
    name or address, ``*.example.com`` for its subdomains), the bound address, and for
    a loopback address the loopback names (:data:`LOOPBACK_NAMES`). None (any Host) for
    a wildcard address (:data:`WILDCARD_ADDRESSES`) with no ``names``: the server is
    then reached by names it cannot know, and beyond loopback it needs a bearer token."""
    given = tuple(host_name(n) if not n.startswith("*.") else n.lower() for n in names)
    if bound in WILDCARD_ADDRESSES:
        return given or None
    own = [host_name(f"[{bound}]" if ":" in bound else bound)]
    if is_loopback(bound):
        own.extend(LOOPBACK_NAMES)
    return tuple(dict.fromkeys((*own, *given)))


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CheckedHost:
    """Pure ASGI: the ``Host`` header must be one of ``hosts`` (see
    :func:`allowed_hosts`); else 400 ``invalid_host`` in the one error shape."""

    def __init__(self, app: ASGIApp, hosts: Sequence[str]) -> None:
        self.app = app
        self.exact = frozenset(h for h in hosts if not h.startswith("*."))
        self.suffixes = tuple(h[1:] for h in hosts if h.startswith("*."))
        self.shown = ", ".join(hosts)

    def allows(self, header: str) -> bool:
        name = host_name(header)
        return name in self.exact or (bool(name) and name.endswith(self.suffixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            given = Headers(scope=scope).get("host", "")
            if not self.allows(given):
                response = error_response(
                    400, f"Host: {given!r} is not a name this server answers to "
                    f"(expected one of {self.shown})", param="Host", code="invalid_host",
                )  # fmt: skip
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def cors(origins: Sequence[str], headers: Iterable[str] = ()) -> Middleware:
    """Starlette's ``CORSMiddleware`` for ``origins`` (each ``scheme://host[:port]``, as
    a browser sends ``Origin``; ``*`` for any): GET and POST, the request headers
    ``Authorization``, ``Content-Type``, ``Idempotency-Key`` and ``headers`` (the
    identity and conversation headers), ``x-request-id`` and ``Retry-After`` exposed;
    no cookies (the server takes none). A preflight from another origin is answered 400.

    Raises:
        ValueError: an origin that is not ``*`` nor ``scheme://host[:port]``.
    """
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if origin != "*" and (not sep or scheme not in ("http", "https") or not rest
                              or "/" in rest):  # fmt: skip
            raise ValueError(f"{origin!r}: expected scheme://host[:port] (as a browser "
                             "sends Origin, no path) or *")  # fmt: skip
    allowed = ["Authorization", "Content-Type", "Idempotency-Key", *headers]
    return Middleware(
        CORSMiddleware, allow_origins=list(origins), allow_methods=["GET", "POST"],
        allow_headers=list(dict.fromkeys(allowed)),
        expose_headers=[REQUEST_ID_HEADER, "Retry-After"], max_age=600,
    )  # fmt: skip
