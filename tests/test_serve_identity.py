"""The identity serve reads (chainrun.serve.identity): a gateway's header taken as it
comes; a signed token checked for its algorithm, signature, expiry and subject."""

from __future__ import annotations

import pytest

from chainrun.serve.identity import IdentityRefused, IdentitySource, sign_token

KEY = b"shop-secret"
NOW = 1_800_000_000.0


def test_the_gateway_header_is_the_user_id() -> None:
    got = IdentitySource("X-Shopper").identity({"x-shopper": " u-42 "})
    assert (got.user_id, dict(got.claims)) == ("u-42", {})
    with pytest.raises(IdentityRefused, match="X-Shopper: missing"):
        IdentitySource("X-Shopper").identity({})


def test_a_header_sent_twice_is_refused() -> None:
    """A gateway that adds its header beside the shopper's own (instead of replacing it)
    would otherwise let the first, the shopper's, win."""
    from starlette.datastructures import Headers

    twice = Headers(raw=[(b"x-shopper", b"u-bob"), (b"x-shopper", b"u-ann")])
    for key in (None, KEY):
        with pytest.raises(IdentityRefused, match="X-Shopper: sent more than once"):
            IdentitySource("X-Shopper", key).identity(twice, now_s=NOW)
    once = Headers(raw=[(b"x-shopper", b"u-ann")])
    assert IdentitySource("X-Shopper").identity(once).user_id == "u-ann"


def test_a_signed_token_gives_the_subject_and_its_claims() -> None:
    token = sign_token({"sub": "u-7", "exp": NOW + 60, "tier": "gold"}, KEY)
    got = IdentitySource("X-Shopper", KEY).identity({"x-shopper": token}, now_s=NOW)
    assert (got.user_id, dict(got.claims)) == ("u-7", {"tier": "gold"})


@pytest.mark.parametrize(("claims", "key", "why"), [
    ({"sub": "u-7", "exp": NOW + 60}, b"another key", "signature does not match"),
    ({"sub": "u-7", "exp": NOW - 1}, KEY, "expired"),
    ({"sub": "u-7"}, KEY, "no exp"),
    ({"exp": NOW + 60}, KEY, "no sub"),
    ({"sub": 42, "exp": NOW + 60}, KEY, "a sub that is not a string"),
    ({"sub": "u-7", "exp": "tomorrow"}, KEY, "an exp that is not a number"),
    ({"sub": "u-7", "exp": NOW + 60, "nbf": NOW + 30}, KEY, "not valid yet"),
])  # fmt: skip
def test_a_token_that_does_not_check_out_is_refused(
    claims: dict[str, object], key: bytes, why: str
) -> None:
    token = sign_token(claims, key)
    with pytest.raises(IdentityRefused, match=why):
        IdentitySource("X-Shopper", KEY).identity({"x-shopper": token}, now_s=NOW)


def test_an_unsigned_or_other_algorithm_token_is_refused() -> None:
    good = sign_token({"sub": "u-7", "exp": NOW + 60}, KEY)
    _, body, sig = good.split(".")
    none_head = "eyJhbGciOiJub25lIn0"  # {"alg":"none"}
    for token in (f"{none_head}.{body}.", f"{none_head}.{body}.{sig}", "u-7", "a.b.c"):
        with pytest.raises(IdentityRefused):
            IdentitySource("X-Shopper", KEY).identity({"x-shopper": token}, now_s=NOW)
