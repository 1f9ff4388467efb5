"""The identity serve reads (chainrun.serve.identity): a gateway's header taken as it
comes; a token checked by joserfc under the rules of RFC 8725: an HS256 key of at least
32 bytes, or an identity provider's RS256 / ES256 keys from a JWKS (a file or a URL,
fetched again when a token names a key it lacks), ``iss`` and ``aud`` when configured, a
small clock-skew leeway, every registered claim of its type, ``crit`` refused.

Every token here is made by joserfc with keys made in the test. Before, the check was a
hand-written HS256 only: an empty ``CHAINRUN_SERVE_IDENTITY_KEY`` silently trusted the
raw header, any key was taken (one character, a PEM public key), a token a second past
``exp`` (clock skew) was refused, ``exp`` Infinity or NaN, a non-numeric ``nbf`` and a
``crit`` header were accepted, and an identity provider's RS256/ES256 tokens could not
be checked at all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey, RSAKey
from starlette.datastructures import Headers

from chainrun.serve.identity import (
    IdentityRefused,
    IdentitySource,
    IdentityUnavailable,
    JwksKeys,
    TokenRules,
    TokenVerifier,
)

KEY = "a-shop-secret-of-at-least-32-bytes!"
NOW = 1_800_000_000.0
ISS = "https://id.example-shop.test/realms/shop"
AUD = "chainrun-shop"
RSA = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
EC = ECKey.generate_key("P-256", parameters={"kid": "ec-1"})


def jwks(*keys: Any) -> dict[str, Any]:
    """A JSON Web Key Set of the public halves of ``keys``, as a provider publishes it."""
    return {"keys": [k.as_dict(private=False) for k in keys]}


def token(claims: dict[str, Any], key: Any = RSA, alg: str = "RS256", **head: Any) -> str:
    return jwt.encode({"alg": alg, "kid": key.kid, **head}, claims, key)


def hs256(claims_json: str, head: dict[str, Any] | None = None, key: str = KEY) -> str:
    """An HS256 token of a payload given as JSON text (to send what no JWT library would
    write: ``Infinity``, ``NaN``)."""
    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signed = f"{b64(json.dumps(head or {'alg': 'HS256'}).encode())}.{b64(claims_json.encode())}"
    mac = hmac.new(key.encode(), signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{b64(mac)}"


def from_provider(path: Path, rules: TokenRules | None = None) -> IdentitySource:
    path.write_text(json.dumps(jwks(RSA, EC)))
    keys = JwksKeys(str(path))
    keys.load()
    return IdentitySource("Authorization-Id",
                          TokenVerifier.from_jwks(keys, rules or TokenRules(ISS, AUD)))


async def who(source: IdentitySource, value: str, now: float = NOW) -> Any:
    return await source.identity(Headers({"authorization-id": value}), now_s=now)


async def test_the_gateway_header_is_the_user_id() -> None:
    got = await IdentitySource("X-Shopper").identity({"x-shopper": " u-42 "})
    assert (got.user_id, dict(got.claims)) == ("u-42", {})
    with pytest.raises(IdentityRefused, match="X-Shopper: missing"):
        await IdentitySource("X-Shopper").identity({})


async def test_a_header_sent_twice_is_refused() -> None:
    """A gateway that adds its header beside the shopper's own (instead of replacing it)
    would otherwise let the first, the shopper's, win."""
    twice = Headers(raw=[(b"x-shopper", b"u-bob"), (b"x-shopper", b"u-ann")])
    for verifier in (None, TokenVerifier.hs256(KEY)):
        with pytest.raises(IdentityRefused, match="X-Shopper: sent more than once"):
            await IdentitySource("X-Shopper", verifier).identity(twice, now_s=NOW)


@pytest.mark.parametrize(("key", "alg"), [(RSA, "RS256"), (EC, "ES256")])
async def test_a_providers_token_is_taken_with_its_issuer_and_audience(
    tmp_path: Path, key: Any, alg: str
) -> None:
    source = from_provider(tmp_path / "jwks.json")
    claims = {"sub": "u-7", "iss": ISS, "aud": AUD, "exp": NOW + 60, "iat": NOW,
              "tier": "gold"}  # fmt: skip
    got = await who(source, token(claims, key, alg))
    assert (got.user_id, dict(got.claims)) == ("u-7", {"tier": "gold"})
    # an audience list holding ours is taken too (Keycloak sends one)
    listed = await who(source, token({**claims, "aud": ["account", AUD]}, key, alg))
    assert listed.user_id == "u-7"
    for wrong, why in (({"iss": "https://elsewhere.test/"}, "iss"), ({"aud": "other-api"}, "aud"),
                       ({"iss": None}, "iss"), ({"aud": None}, "aud")):  # fmt: skip
        bad = {k: v for k, v in {**claims, **wrong}.items() if v is not None}
        with pytest.raises(IdentityRefused, match=why):
            await who(source, token(bad, key, alg))
    # signed by a key that is not the provider's, or with the shop's HS256 key
    stranger = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
    with pytest.raises(IdentityRefused):
        await who(source, token(claims, stranger, "RS256"))
    with pytest.raises(IdentityRefused):
        await who(source, jwt.encode({"alg": "HS256"}, claims, OctKey.import_key(KEY)))


@pytest.mark.parametrize(("skew_s", "taken"), [(30, True), (600, False)])
async def test_thirty_seconds_of_clock_skew_are_taken_ten_minutes_are_not(
    tmp_path: Path, skew_s: float, taken: bool
) -> None:
    """The issuer's clock ahead of serve's (``nbf``, ``iat`` in serve's future) or behind
    it (``exp`` in serve's past) by 30 s: taken within the 60 s leeway; by 10 minutes:
    refused."""
    source = from_provider(tmp_path / "jwks.json")
    base = {"sub": "u-7", "iss": ISS, "aud": AUD}
    for claims in ({**base, "exp": NOW - skew_s},
                   {**base, "exp": NOW + 3600, "nbf": NOW + skew_s, "iat": NOW + skew_s}):
        if taken:
            assert (await who(source, token(claims))).user_id == "u-7"
        else:
            with pytest.raises(IdentityRefused):
                await who(source, token(claims))


@pytest.mark.parametrize(("payload", "head", "why"), [
    ('{"sub": "u-7", "exp": Infinity}', None, "not valid JSON"),
    ('{"sub": "u-7", "exp": NaN}', None, "not valid JSON"),
    ('{"sub": "u-7", "exp": 1800000060, "nbf": "soon"}', None, "nbf"),
    ('{"sub": "u-7", "exp": true}', None, "exp"),
    ('{"sub": "u-7", "exp": 1800000060, "iat": [1]}', None, "iat"),
    ('{"sub": 42, "exp": 1800000060}', None, "sub"),
    ('{"exp": 1800000060}', None, "sub"),
    ('{"sub": "u-7"}', None, "exp"),
    ('{"sub": "u-7", "exp": 1800000060, "aud": 7}', None, "aud"),
    ('{"sub": "u-7", "exp": 1800000060}', {"alg": "HS256", "crit": ["x-new"], "x-new": 1},
     "x-new"),
    ('{"sub": "u-7", "exp": 1800000060}', {"alg": "none"}, "'none' is not allowed"),
    ('{"sub": "u-7", "exp": 1799999000}', None, "expire"),
])  # fmt: skip
async def test_a_token_whose_claims_or_header_do_not_check_out_is_refused(
    payload: str, head: dict[str, Any] | None, why: str
) -> None:
    source = IdentitySource("Authorization-Id", TokenVerifier.hs256(KEY))
    assert (await who(source, hs256('{"sub": "u-7", "exp": 1800000060}'))).user_id == "u-7"
    with pytest.raises(IdentityRefused, match=why):
        await who(source, hs256(payload, head))


@pytest.mark.parametrize(("secret", "why"), [
    ("", "empty"), ("k" * 16, "16 bytes"), ("x", "1 bytes"),
    ("-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA...", "PEM"),
])  # fmt: skip
def test_an_empty_or_weak_key_is_refused(secret: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        TokenVerifier.hs256(secret)


@pytest.mark.parametrize(("secret", "said"), [
    ("", "CHAINRUN_SERVE_IDENTITY_KEY: the key is empty"),
    ("k" * 16, "CHAINRUN_SERVE_IDENTITY_KEY: the key is 16 bytes; HS256 needs at least 32"),
])  # fmt: skip
def test_serve_with_an_empty_or_short_key_refuses_to_start_in_one_line(
    tmp_path: Path, secret: str, said: str
) -> None:
    """``serve --identity-header`` with an empty key (a compose file's unset variable) or
    a 16-byte one: exit 2 and one line, no server (it used to serve, trusting the raw
    header when empty)."""
    env = {**os.environ, "CHAINRUN_SERVE_IDENTITY_KEY": secret}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "chainrun", "serve", "--identity-header", "X-Shopper",
             "--port", "0", "--db", str(tmp_path / "log.db")],
            env=env, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1],
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("serve started with a key it should have refused")
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


async def test_a_jwks_url_is_fetched_again_when_the_provider_rotates_its_keys() -> None:
    """The provider publishes a new key and signs with it: the first token naming it
    makes serve fetch the key set again (at most every MIN_REFRESH_S), and it is taken;
    a provider that cannot be reached while no key is held is IdentityUnavailable."""
    published = {"set": jwks(RSA)}
    fetches: list[str] = []

    def provider(request: httpx2.Request) -> httpx2.Response:
        fetches.append(str(request.url))
        return httpx2.Response(200, json=published["set"])

    url = "https://id.example-shop.test/realms/shop/protocol/openid-connect/certs"
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(provider)) as client:
        keys = JwksKeys(url, client=client)
        source = IdentitySource("Authorization-Id", TokenVerifier.from_jwks(
            keys, TokenRules(ISS, AUD)))  # fmt: skip
        claims = {"sub": "u-9", "iss": ISS, "aud": AUD, "exp": NOW + 60}
        assert (await who(source, token(claims))).user_id == "u-9"
        assert len(fetches) == 1
        published["set"] = jwks(RSA, EC)  # rotation: a new key published
        keys._fetched_at -= 60  # the last fetch is a minute old
        assert (await who(source, token(claims, EC, "ES256"))).user_id == "u-9"
        assert len(fetches) == 2

    def down(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused")

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(down)) as client:
        cold = IdentitySource("Authorization-Id", TokenVerifier.from_jwks(
            JwksKeys(url, client=client)))  # fmt: skip
        with pytest.raises(IdentityUnavailable, match="could not be read"):
            await who(cold, token(claims))
