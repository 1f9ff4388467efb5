"""The shopper's identity on ``chainrun serve``, taken only from a source the shop controls.

``chainrun serve --identity-header NAME`` reads the caller's identity from the request
header ``NAME`` on ``/chat`` and ``/v1/chat/completions``, in one of two ways:

- **a header set by the shop's gateway** (``CHAINRUN_SERVE_IDENTITY_KEY`` unset): the
  header's value is the user id. serve trusts it as it comes, so it must be unreachable
  except through the gateway, which sets the header on every request (replacing any the
  shopper sent): bind serve to loopback (the default ``--host 127.0.0.1``) on the
  gateway's machine, or to a private network only the gateway reaches.
- **a signed token** (``CHAINRUN_SERVE_IDENTITY_KEY`` set, the shared secret): the
  header's value is a JSON Web Token signed with HMAC-SHA256 (``alg`` ``HS256``; RFC 7519
  on RFC 7515's compact serialisation) under that key, as any JWT library writes it
  (PyJWT: ``jwt.encode({"sub": "u-42", "exp": ...}, key, "HS256")``). ``sub`` is the
  user id, ``exp`` (seconds since the epoch) is required and must be in the future,
  ``nbf`` when given must be past; the other claims are the identity's ``claims``. The
  shopper may hold the token: without the key it cannot be made or changed.

With identity configured, a request without the header or with a value that does not
check out is answered 401 (one line saying which); the identity reaches every tool
(``context.user``) and the log (``turns.user_id``), and a conversation is bound to the
identity that started it: another identity is answered 403 before anything runs, read
or is logged (:class:`~chainrun.errors.ConversationForbidden`). Without
``--identity-header`` nothing is bound or checked, as before: whoever knows a
conversation id can continue it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from chainrun.actions.identity import Identity
from chainrun.serve.errors import error_response

__all__ = ["IdentityRefused", "IdentitySource", "caller", "sign_token"]

#: the registered claims that are not the identity's own ``claims`` (RFC 7519 4.1)
_REGISTERED = ("sub", "exp", "nbf", "iat")


class IdentityRefused(ValueError):
    """A request whose identity header is missing or does not check out (answered 401)."""


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise IdentityRefused("not base64url") from None


def sign_token(claims: Mapping[str, Any], key: bytes) -> str:
    """An HS256 JSON Web Token of ``claims`` under ``key`` (what a shop's login service
    would issue; any JWT library writes the same)."""
    head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(dict(claims), separators=(",", ":")).encode())
    signed = f"{head}.{body}".encode("ascii")
    return f"{head}.{body}.{_b64url(hmac.new(key, signed, hashlib.sha256).digest())}"


@dataclass(frozen=True)
class IdentitySource:
    """Where serve reads the caller's identity (see the module docstring).

    Attributes:
        header: the request header holding it (case ignored).
        key: the HS256 key of a signed token; None: the header's value is the user id
            (set by the shop's gateway).

    Raises:
        ValueError: an empty header name, or an empty key.
    """

    header: str
    key: bytes | None = None

    def __post_init__(self) -> None:
        if not self.header.strip():
            raise ValueError("identity header: expected a header name")
        if self.key is not None and not self.key:
            raise ValueError("identity key: expected a non-empty secret")

    def identity(self, headers: Mapping[str, str], now_s: float | None = None) -> Identity:
        """The caller's identity from request ``headers``; ``now_s``: seconds since the
        epoch to check ``exp`` / ``nbf`` against (default: now).

        Raises:
            IdentityRefused: the header is missing or sent more than once (a gateway that
                adds its header beside the shopper's instead of replacing it), or (a
                token) malformed, not HS256, wrongly signed, expired, not yet valid or
                without a ``sub``.
        """
        getlist = getattr(headers, "getlist", None)  # starlette's Headers keeps repeats
        if getlist is not None and len(getlist(self.header.lower())) > 1:
            raise IdentityRefused(f"{self.header}: sent more than once (the gateway must "
                                  "replace the header, not add a second one)")  # fmt: skip
        value = headers.get(self.header.lower())
        if value is None or not value.strip():
            raise IdentityRefused(f"{self.header}: missing (this server needs the caller's "
                                  "identity)")  # fmt: skip
        if self.key is None:
            return self._checked(value.strip(), {})
        try:
            claims = self._verified(value.strip(), time.time() if now_s is None else now_s)
        except IdentityRefused as e:
            raise IdentityRefused(f"{self.header}: {e}") from None
        extra = {k: v for k, v in claims.items() if k not in _REGISTERED}
        return self._checked(claims["sub"], extra)

    def _checked(self, user_id: Any, claims: dict[str, Any]) -> Identity:
        try:
            return Identity(user_id, claims)
        except ValueError as e:
            raise IdentityRefused(f"{self.header}: {e}") from None

    def _verified(self, token: str, now_s: float) -> dict[str, Any]:
        assert self.key is not None
        parts = token.split(".")
        if len(parts) != 3:
            raise IdentityRefused("expected a signed token (header.payload.signature)")
        try:
            head = json.loads(_unb64url(parts[0]))
            claims = json.loads(_unb64url(parts[1]))
        except (ValueError, UnicodeDecodeError):
            raise IdentityRefused("the token's header or payload is not JSON") from None
        if not isinstance(head, dict) or head.get("alg") != "HS256":
            raise IdentityRefused("expected a token signed with HS256")
        signed = f"{parts[0]}.{parts[1]}".encode("ascii")
        expected = hmac.new(self.key, signed, hashlib.sha256).digest()
        if not hmac.compare_digest(expected, _unb64url(parts[2])):
            raise IdentityRefused("the token's signature does not match the key")
        if not isinstance(claims, dict):
            raise IdentityRefused("the token's payload is not a JSON object")
        exp = claims.get("exp")
        if isinstance(exp, bool) or not isinstance(exp, int | float):
            what = "has no exp" if exp is None else "has an exp that is not a number"
            raise IdentityRefused(f"the token {what} (seconds since the epoch)")
        if exp <= now_s:
            raise IdentityRefused("the token has expired")
        nbf = claims.get("nbf")
        if isinstance(nbf, int | float) and not isinstance(nbf, bool) and nbf > now_s:
            raise IdentityRefused("the token is not valid yet (nbf)")
        if not isinstance(claims.get("sub"), str):
            what = "has no sub" if claims.get("sub") is None else "has a sub that is not a string"
            raise IdentityRefused(f"the token {what} (the user id)")
        return claims


async def caller(
    request: Request, conversation_id: str | None
) -> tuple[Identity | None, Response | None]:
    """The request's identity (None: serve takes none) or the response refusing it: 401
    when the identity header does not check out, 403 when ``conversation_id`` is bound to
    another identity in the log (said once, nothing of the conversation in it)."""
    source: IdentitySource | None = getattr(request.app.state, "identity", None)
    if source is None:
        return None, None
    try:
        user = source.identity(request.headers)
    except IdentityRefused as e:
        return None, error_response(401, str(e), param=source.header, code="invalid_identity")
    runner = request.app.state.serve.runner
    store = runner.chain.store if runner is not None else None
    if conversation_id is not None and store is not None:
        owner = await store.off_loop(store.conversation_owner, conversation_id)
        if owner is not None and owner != user.user_id:
            return None, error_response(403, "this conversation belongs to another user",
                                        code="conversation_forbidden")  # fmt: skip
    return user, None
