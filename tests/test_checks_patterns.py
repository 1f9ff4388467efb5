"""Deterministic checks: cards (Luhn), IBANs (mod-97), API keys, e-mail, phone, custom regexes."""

from __future__ import annotations

import random

import pytest

from chainrun.checks import BUILTIN_CHECKS, PatternCheck, PatternChecker, iban_valid, luhn_valid


def checker(**actions: str) -> PatternChecker:
    return PatternChecker(
        [PatternCheck.builtin(n, actions.get(n, "redact")) for n in BUILTIN_CHECKS]  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("digits", "ok"),
    [("4111111111111111", True), ("4111111111111112", False), ("79927398713", True),
     ("79927398710", False), ("378282246310005", True), ("6011111111111117", True)],
)  # fmt: skip
def test_luhn(digits: str, ok: bool) -> None:
    assert luhn_valid(digits) is ok


def test_luhn_matches_an_independent_definition() -> None:
    """Against the textbook form: double every second digit from the right, sum digits."""
    rng = random.Random(7)
    for _ in range(500):
        s = "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 19)))
        total = sum(
            sum(divmod(int(d) * (2 if i % 2 else 1), 10)) for i, d in enumerate(reversed(s))
        )
        assert luhn_valid(s) is (total % 10 == 0)


@pytest.mark.parametrize(
    ("iban", "ok"),
    [("DE89 3704 0044 0532 0130 00", True), ("GB29NWBK60161331926819", True),
     ("NL91ABNA0417164300", True), ("FR1420041010050500013M02606", True),
     ("DE89 3704 0044 0532 0130 01", False), ("GB29NWBK60161331926818", False), ("DE89", False)],
)  # fmt: skip
def test_iban_mod97(iban: str, ok: bool) -> None:
    assert iban_valid(iban) is ok


def test_card_numbers_block_only_when_luhn_valid() -> None:
    c = checker(card="block")
    for text in ("my card is 4111 1111 1111 1111, ok?", "4111-1111-1111-1111", "5500005555555559"):
        result = c.check(text)
        assert result.blocked, text
        assert "4111" not in result.text and "5500" not in result.text
    for text in ("4111 1111 1111 1112", "order 12345678", "size 42, 100 euros, 2026-11-30"):
        assert not c.check(text).findings, text


def test_redaction_replaces_each_kind_and_logs_no_text() -> None:
    text = (
        "IBAN DE89 3704 0044 0532 0130 00 then mail a.b@shop.example.com or call "
        "+33 6 12 34 56 78, key sk-proj-abcdefghijklmnopqrstuvwx12 and AKIAIOSFODNN7EXAMPLE"
    )
    result = checker().check(text)
    assert not result.blocked and result.redacted
    assert result.text == (
        "IBAN [iban] then mail [email] or call [phone], key [api_key] and [api_key]"
    )
    logged = str(result.as_json())
    assert "3704" not in logged and "shop.example" not in logged


def test_a_four_letter_word_after_a_grouped_iban_is_not_part_of_it() -> None:
    result = checker().check("GB29 NWBK 6016 1331 9268 19 then NL91 ABNA 0417 1643 00 okay")
    assert result.text == "[iban] then [iban] okay"


def test_phone_shapes_and_dates() -> None:
    c = checker()
    assert c.check("call 06 12 34 56 78").text == "call [phone]"
    assert c.check("call (555) 123-4567 now").text == "call [phone] now"
    assert not c.check("delivered 01-12-2026 or 2026.11.30").findings


def test_custom_regex_and_bad_regex() -> None:
    c = PatternChecker([PatternCheck.custom("order_id", r"ORD-\d{8}", "redact")])
    assert c.check("about ORD-12345678 please").text == "about [order_id] please"
    with pytest.raises(ValueError, match="invalid regex"):
        PatternCheck.custom("bad", "(", "block")
    with pytest.raises(ValueError, match="empty string"):
        PatternCheck.custom("empty", "x*", "block")
    with pytest.raises(ValueError, match="unknown check"):
        PatternCheck.builtin("passport", "block")


def test_a_card_is_not_also_a_phone_number() -> None:
    result = checker(card="block").check("4111 1111 1111 1111")
    assert [f.check for f in result.findings] == ["card"]


def test_a_catastrophic_custom_regex_times_out_and_fails_closed() -> None:
    """New user: ``(a+)+$``-style patterns held the event loop at 100% CPU for minutes
    (SIGTERM could not stop it). Configured patterns now search under a time bound."""
    import time

    from chainrun.checks.patterns import CUSTOM_REGEX_TIMEOUT_S

    check = PatternCheck.custom("x", r"(a|aa)+$", "block")
    checker = PatternChecker([PatternCheck.builtin("card", "redact"), check])
    text = "a" * 60 + "!"
    t0 = time.perf_counter()
    result = checker.check(text)
    # a guard against the minutes-long hang only; timed_out below is the property
    assert time.perf_counter() - t0 < 600 * CUSTOM_REGEX_TIMEOUT_S
    assert result.blocked and result.text == "[x]"
    (finding,) = result.findings
    assert finding.timed_out and finding.as_json()["timed_out"] is True
    # the same pattern on a text it decides fast still works as a plain check
    assert checker.check("aaaa").blocked and not checker.check("bbb").findings
