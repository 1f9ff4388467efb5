"""The shopper's identity on ``chainrun serve``, taken only from a source the shop controls.

``chainrun serve --identity-header NAME`` reads the caller's identity from the request
header ``NAME`` on ``/chat`` and ``/v1/chat/completions``, in one of three modes (said
in one line when serve starts):

- **a header set by the shop's gateway** (no key, no JWKS): the header's value is the
  user id, trusted as it comes. serve must then be unreachable except through the
  gateway, which sets the header on every request (replacing any the shopper sent):
  bind serve to loopback (the default ``--host 127.0.0.1``) on the gateway's machine, or
  to a private network only the gateway reaches.
- **a token signed with the shop's secret** (``CHAINRUN_SERVE_IDENTITY_KEY``): a JSON Web
  Token (RFC 7519) signed with HS256 under that key, which must be at least 32 bytes (RFC
  7518 section 3.2: a key of at least the hash's 256 bits). An empty or shorter key, or a
  PEM key (a public key belongs in a JWKS), refuses to start.
- **a token from an identity provider** (``--identity-jwks URL_OR_FILE``): signed with
  RS256 or ES256 by a key of the provider's JSON Web Key Set (RFC 7517), as Auth0,
  Keycloak, Amazon Cognito and Microsoft Entra publish one. A URL is fetched at start and
  kept; a token whose key id is not in it fetches it again (a provider rotating its keys),
  at most every :data:`MIN_REFRESH_S`; a file is read again when it changes.

A token is checked as RFC 8725 (JWT best current practice) asks: the algorithm from an
allow-list (``none`` never), the signature, ``exp`` required, ``nbf`` and ``iat`` when
present, with ``--identity-leeway-s`` of clock skew (default :data:`LEEWAY_S`); ``iss``
and ``aud`` when configured (``--identity-issuer``, ``--identity-audience``); every
registered claim of its type (a NumericDate a finite number, ``sub`` a string); a
``crit`` header parameter refused; JSON's non-standard ``Infinity`` and ``NaN`` refused.
``sub`` is the user id; the other unregistered claims are the identity's ``claims``. The
checking is joserfc's (a maintained JOSE implementation); the rules above it are here.

With identity configured, a request without the header or with a value that does not
check out is answered 401 (one line saying which); a JWKS that cannot be fetched while
no key is held is 503. The identity reaches every tool (``context.user``) and the log
(``turns.user_id``), and a conversation is bound to the identity that started it: the
front desk (:mod:`chainrun.desk`) answers another identity 403 before anything runs.
Without ``--identity-header`` nothing is bound or checked: whoever knows a conversation
id can continue it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from joserfc import jwt
from joserfc.errors import InvalidPayloadError, JoseError
from joserfc.jwk import KeySet, OctKey
from joserfc.jwt import ClaimsOption

from chainrun.identity import Identity
from chainrun.serve.settings import LEEWAY_S

__all__ = [
    "JWKS_ALGORITHMS",
    "LEEWAY_S",
    "MIN_KEY_BYTES",
    "IdentityRefused",
    "IdentitySource",
    "IdentityUnavailable",
    "JwksKeys",
    "TokenRules",
    "TokenVerifier",
]

#: the shortest HS256 key taken, in bytes (RFC 7518 section 3.2: at least 256 bits)
MIN_KEY_BYTES = 32
#: the algorithms of an identity provider's keys (RFC 7518: RSASSA-PKCS1-v1_5 with
#: SHA-256, ECDSA P-256 with SHA-256)
JWKS_ALGORITHMS = ("RS256", "ES256")
#: s a held JWKS is used before it is fetched again
REFRESH_S = 300.0
#: s between two fetches at least (a token with an unknown key id cannot make serve
#: fetch the provider's keys on every request)
MIN_REFRESH_S = 30.0
#: s a JWKS fetch may take
FETCH_TIMEOUT_S = 5.0
#: s between ``/readyz``'s tries to fetch an identity provider's keys while none are held
CHECK_EVERY_S = 2.0
#: RFC 7519 section 4.1's registered claims and what each must be
_NUMERIC_DATES = ("exp", "nbf", "iat")
_STRINGS = ("iss", "sub", "jti")
_REGISTERED = (*_NUMERIC_DATES, *_STRINGS, "aud")


class IdentityRefused(ValueError):
    """A request whose identity header is missing or does not check out (answered 401)."""


class IdentityUnavailable(ConnectionError):
    """The identity provider's keys could not be had (answered 503): nothing held and
    the JWKS could not be fetched."""


class _StrictJSON(json.JSONDecoder):
    """JSON as RFC 8259 has it: ``Infinity``, ``-Infinity`` and ``NaN`` refused."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        def refuse(name: str) -> Any:
            raise ValueError(f"{name} is not JSON")

        super().__init__(*args, **{**kwargs, "parse_constant": refuse})


@dataclass(frozen=True)
class TokenRules:
    """What a token must say besides its signature.

    Attributes:
        issuer: the ``iss`` it must carry (None: not checked).
        audience: the ``aud`` it must carry, or hold in its list (None: not checked).
        leeway_s: s of clock skew allowed on ``exp``, ``nbf``, ``iat``.

    Raises:
        ValueError: a negative or non-finite leeway, or an empty issuer or audience.
    """

    issuer: str | None = None
    audience: str | None = None
    leeway_s: float = LEEWAY_S

    def __post_init__(self) -> None:
        if not math.isfinite(self.leeway_s) or self.leeway_s < 0:
            raise ValueError(f"leeway: expected a number of seconds >= 0, got {self.leeway_s}")
        for name, value in (("issuer", self.issuer), ("audience", self.audience)):
            if value is not None and not value.strip():
                raise ValueError(f"{name}: expected a non-empty value")

    def check(self, claims: Mapping[str, Any], now_s: float) -> None:
        """Check ``claims`` at ``now_s`` (s since the epoch).

        Raises:
            IdentityRefused: a registered claim of the wrong type, no ``exp``, expired,
                not valid yet, issued in the future, or the wrong ``iss`` / ``aud``.
        """
        for name in _NUMERIC_DATES:
            value = claims.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, int | float) or not math.isfinite(value)):  # fmt: skip
                raise IdentityRefused(f"the token's {name} is not a number of seconds "
                                      "since the epoch")  # fmt: skip
        for name in _STRINGS:
            if name in claims and not isinstance(claims[name], str):
                raise IdentityRefused(f"the token's {name} is not a string")
        aud = claims.get("aud")
        if aud is not None and not (isinstance(aud, str) or (
                isinstance(aud, list) and all(isinstance(a, str) for a in aud))):  # fmt: skip
            raise IdentityRefused("the token's aud is neither a string nor a list of strings")
        options: dict[str, ClaimsOption] = {"exp": {"essential": True},
                                            "sub": {"essential": True}}  # fmt: skip
        if self.issuer:
            options["iss"] = {"essential": True, "value": self.issuer}
        if self.audience:
            options["aud"] = {"essential": True, "value": self.audience}
        registry = jwt.JWTClaimsRegistry(now=int(now_s), leeway=math.ceil(self.leeway_s),
                                         **options)  # fmt: skip
        try:
            registry.validate(dict(claims))
        except JoseError as e:
            raise IdentityRefused(_said(e)) from None


def _said(error: JoseError) -> str:
    """joserfc's error as one line for the 401."""
    if isinstance(error, InvalidPayloadError):
        return "the token's payload is not valid JSON (Infinity and NaN are not JSON)"
    text = getattr(error, "description", None) or getattr(error, "error", None) or str(error)
    return f"the token: {text}"


class JwksKeys:
    """An identity provider's JSON Web Key Set, from a URL or a file, kept and refreshed
    (see the module text).

    Args:
        source: an ``https://`` (or ``http://``) URL, or a file's path.
        client: the HTTP client for a URL (default: one of this object's, closed by
            :meth:`aclose`).
    """

    def __init__(self, source: str, client: httpx2.AsyncClient | None = None) -> None:
        self.source = source
        self.is_url = source.startswith(("https://", "http://"))
        self._client = client
        self._own_client = client is None
        self._keys: KeySet | None = None
        self._fetched_at = -math.inf  # monotonic s
        self._mtime: float | None = None
        self._lock = asyncio.Lock()

    def load(self) -> KeySet:
        """Read the key set now, blocking (serve's start, before its event loop runs).

        Raises:
            IdentityUnavailable: it cannot be read (the message says why).
            ValueError: what was read is no JWKS with RS256 or ES256 keys.
        """
        try:
            if self.is_url:
                with httpx2.Client(timeout=FETCH_TIMEOUT_S) as client:
                    response = client.get(self.source)
                    response.raise_for_status()
                    raw = response.text
            else:
                self._mtime = os.stat(self.source).st_mtime
                raw = Path(self.source).read_text(encoding="utf-8")
        except (httpx2.HTTPError, OSError) as e:
            raise IdentityUnavailable(f"{self.source} could not be read: {e}") from None
        self._keys = _key_set(raw, self.source)
        self._fetched_at = time.monotonic()
        return self._keys

    @property
    def held(self) -> bool:
        """Whether a key set is held (read at start or fetched since)."""
        return self._keys is not None

    def kids(self) -> set[str]:
        """The key ids held."""
        keys = self._keys
        return {k.kid for k in keys.keys if k.kid} if keys is not None else set()

    async def key_set(self, kid: str | None) -> KeySet:
        """The key set to check a token with key id ``kid`` against: the held one,
        fetched again when stale, or when ``kid`` is not in it and the last fetch is
        :data:`MIN_REFRESH_S` old.

        Raises:
            IdentityUnavailable: none is held and it cannot be fetched.
        """
        now = time.monotonic()
        fetched = self._fetched_at
        stale = now - fetched >= REFRESH_S or self._file_changed()
        unknown = kid is not None and kid not in self.kids()
        if self._keys is not None and not stale and not (unknown and now - fetched
                                                         >= MIN_REFRESH_S):  # fmt: skip
            return self._keys
        async with self._lock:
            if self._keys is not None and self._fetched_at != fetched:
                return self._keys  # another request fetched while this one waited
            try:
                return await self._fetch()
            except (IdentityUnavailable, ValueError):
                if self._keys is None:
                    raise
                self._fetched_at = time.monotonic()  # keep the held keys; try again later
                return self._keys

    def _file_changed(self) -> bool:
        if self.is_url:
            return False
        try:
            return os.stat(self.source).st_mtime != self._mtime
        except OSError:
            return False

    async def _fetch(self) -> KeySet:
        try:
            if self.is_url:
                if self._client is None:
                    self._client = httpx2.AsyncClient(timeout=FETCH_TIMEOUT_S)
                response = await self._client.get(self.source, timeout=FETCH_TIMEOUT_S)
                response.raise_for_status()
                raw = response.text
            else:
                self._mtime = os.stat(self.source).st_mtime
                raw = await asyncio.to_thread(Path(self.source).read_text, encoding="utf-8")
        except (httpx2.HTTPError, OSError) as e:
            raise IdentityUnavailable(f"the identity provider's keys ({self.source}) could "
                                      f"not be read: {e}") from None  # fmt: skip
        self._keys = _key_set(raw, self.source)
        self._fetched_at = time.monotonic()
        return self._keys

    async def aclose(self) -> None:
        """Close the HTTP client this object made."""
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None


def _key_set(raw: str, source: str) -> KeySet:
    """The RS256 / ES256 verification keys of a JWKS document.

    Raises:
        ValueError: not a JWKS (``{"keys": [...]}``), or no public RSA or P-256 key in it.
    """
    try:
        doc = json.loads(raw, cls=_StrictJSON)
    except ValueError as e:
        raise ValueError(f"{source}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError(f'{source}: expected a JSON Web Key Set ({{"keys": [...]}})')
    usable = [k for k in doc["keys"] if isinstance(k, dict) and k.get("use", "sig") == "sig"
              and (k.get("kty") == "RSA" or (k.get("kty") == "EC" and k.get("crv") == "P-256"))
              and "d" not in k]  # fmt: skip
    if not usable:
        raise ValueError(f"{source}: no public RSA or P-256 signing key in the key set")
    try:
        return KeySet.import_key_set({"keys": usable})
    except (JoseError, ValueError, TypeError) as e:
        raise ValueError(f"{source}: a key could not be read ({e})") from None


@dataclass
class TokenVerifier:
    """Checks a JSON Web Token's signature and claims (see the module text). Build with
    :meth:`hs256` or :meth:`jwks`.

    Attributes:
        rules: what the claims must say.
        algorithms: the algorithms taken (an allow-list).
        key: the HS256 key (None: a JWKS).
        jwks: the identity provider's keys (None: the HS256 key).
    """

    rules: TokenRules
    algorithms: tuple[str, ...]
    key: OctKey | None = None
    jwks: JwksKeys | None = None

    @classmethod
    def hs256(cls, secret: str | bytes, rules: TokenRules | None = None) -> TokenVerifier:
        """Tokens signed with HS256 under the shop's ``secret``.

        Raises:
            ValueError: an empty secret, one shorter than :data:`MIN_KEY_BYTES`, or a PEM
                key (one line saying what to do instead).
        """
        raw = secret.encode() if isinstance(secret, str) else secret
        if not raw.strip():
            raise ValueError("the key is empty (an unset variable in a compose file?): set "
                             f"a random secret of at least {MIN_KEY_BYTES} bytes, or unset "
                             "it to trust a gateway's header")  # fmt: skip
        if raw.lstrip().startswith(b"-----BEGIN"):
            raise ValueError("the key is a PEM key: an identity provider's public keys are "
                             "read from its JWKS (--identity-jwks URL_OR_FILE)")  # fmt: skip
        if len(raw) < MIN_KEY_BYTES:
            raise ValueError(f"the key is {len(raw)} bytes; HS256 needs at least "
                             f"{MIN_KEY_BYTES} (RFC 7518 section 3.2)")  # fmt: skip
        return cls(rules or TokenRules(), ("HS256",), key=OctKey.import_key(raw))

    @classmethod
    def from_jwks(cls, keys: JwksKeys, rules: TokenRules | None = None) -> TokenVerifier:
        """Tokens signed with RS256 or ES256 by a key of ``keys``."""
        return cls(rules or TokenRules(), JWKS_ALGORITHMS, jwks=keys)

    def describe(self) -> str:
        """The mode in one line (said at start)."""
        said = [f"{'/'.join(self.algorithms)} tokens"]
        said.append(f"keys from {self.jwks.source}" if self.jwks is not None
                    else "the shop's key")  # fmt: skip
        if self.rules.issuer:
            said.append(f"iss {self.rules.issuer!r}")
        if self.rules.audience:
            said.append(f"aud {self.rules.audience!r}")
        said.append(f"{self.rules.leeway_s:g} s leeway")
        return ", ".join(said)

    async def claims(self, token: str, now_s: float) -> dict[str, Any]:
        """The token's claims once its signature and claims check out.

        Raises:
            IdentityRefused: it does not (the reason in one line).
            IdentityUnavailable: the provider's keys cannot be had.
        """
        parts = token.split(".")
        if len(parts) != 3:
            raise IdentityRefused("expected a signed token (header.payload.signature)")
        try:
            kid = _kid(parts[0])
            key: Any = self.key if self.jwks is None else await self.jwks.key_set(kid)
            decoded = jwt.decode(token, key, algorithms=list(self.algorithms),
                                 decoder_cls=_StrictJSON)  # fmt: skip
        except JoseError as e:
            raise IdentityRefused(_said(e)) from None
        except ValueError as e:
            raise IdentityRefused(f"the token is not valid JSON ({e})") from None
        if not isinstance(decoded.claims, dict):
            raise IdentityRefused("the token's payload is not a JSON object")
        self.rules.check(decoded.claims, now_s)
        return dict(decoded.claims)

    async def aclose(self) -> None:
        if self.jwks is not None:
            await self.jwks.aclose()


def _kid(head: str) -> str | None:
    """The ``kid`` of a token's header (None: none, or no header to read)."""
    try:
        raw = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
        doc = json.loads(raw, cls=_StrictJSON)
    except (ValueError, TypeError):
        return None
    kid = doc.get("kid") if isinstance(doc, dict) else None
    return kid if isinstance(kid, str) else None


@dataclass
class IdentitySource:
    """Where serve reads the caller's identity (see the module text).

    Attributes:
        header: the request header holding it (case ignored).
        verifier: checks a signed token (None: the header's value is the user id, set
            by the shop's gateway).

    Raises:
        ValueError: an empty header name.
    """

    header: str
    verifier: TokenVerifier | None = None
    #: why a caller's identity cannot be checked now (the identity provider's keys
    #: cannot be had and none are held), as the last request or :meth:`check` found;
    #: None: it can
    unavailable: str | None = field(default=None, init=False)
    _checked_at: float = field(default=-math.inf, init=False)

    def __post_init__(self) -> None:
        if not self.header.strip():
            raise ValueError("identity header: expected a header name")

    async def check(self) -> str | None:
        """Why a caller's identity cannot be checked now, or None (``/readyz``). With an
        identity provider's key set of which none is held (never read, or unreadable
        at the last request), it is fetched again, at most every :data:`CHECK_EVERY_S`
        (a server that is not ready gets no requests to find out it is back)."""
        jwks = self.verifier.jwks if self.verifier is not None else None
        if jwks is None or (self.unavailable is None and jwks.held):
            return self.unavailable
        now = time.monotonic()
        if now - self._checked_at >= CHECK_EVERY_S:
            self._checked_at = now
            try:
                await jwks.key_set(None)
                self.unavailable = None
            except (IdentityUnavailable, ValueError) as e:
                self.unavailable = str(e)
        return self.unavailable

    def describe(self) -> str:
        """The mode serve runs in, in one line (said at start)."""
        if self.verifier is None:
            return (f"identity: the {self.header} header's value as the user id, trusted "
                    "as the shop's gateway sets it (no signature checked)")  # fmt: skip
        return f"identity: {self.header} carries {self.verifier.describe()}"

    async def identity(self, headers: Mapping[str, str], now_s: float | None = None) -> Identity:
        """The caller's identity from request ``headers``; ``now_s``: seconds since the
        epoch to check the token's times against (default: now).

        Raises:
            IdentityRefused: the header is missing or sent more than once (a gateway that
                adds its header beside the shopper's instead of replacing it), or its
                token does not check out.
            IdentityUnavailable: the identity provider's keys cannot be had.
        """
        getlist = getattr(headers, "getlist", None)  # starlette's Headers keeps repeats
        if getlist is not None and len(getlist(self.header.lower())) > 1:
            raise IdentityRefused(f"{self.header}: sent more than once (the gateway must "
                                  "replace the header, not add a second one)")  # fmt: skip
        value = headers.get(self.header.lower())
        if value is None or not value.strip():
            raise IdentityRefused(f"{self.header}: missing (this server needs the caller's "
                                  "identity)")  # fmt: skip
        if self.verifier is None:
            return self._checked(value.strip(), {})
        try:
            claims = await self.verifier.claims(value.strip(),
                                                time.time() if now_s is None else now_s)
        except IdentityRefused as e:
            raise IdentityRefused(f"{self.header}: {e}") from None
        except IdentityUnavailable as e:
            self.unavailable = str(e)
            raise
        self.unavailable = None
        extra = {k: v for k, v in claims.items() if k not in _REGISTERED}
        return self._checked(claims["sub"], extra)

    def _checked(self, user_id: Any, claims: dict[str, Any]) -> Identity:
        try:
            return Identity(user_id, claims)
        except ValueError as e:
            raise IdentityRefused(f"{self.header}: {e}") from None

    async def aclose(self) -> None:
        """Close the JWKS client, if any."""
        if self.verifier is not None:
            await self.verifier.aclose()
