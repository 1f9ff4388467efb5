"""Payment card numbers: network prefixes and lengths plus Luhn, measured on number-like
text (false positives) beside published test card numbers (true positives).

Luhn alone passes one digit string in ten: a 13-digit millisecond timestamp in a message
or an answer was read as a card and blocked the turn.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from chainrun.checks import PatternCheck, PatternChecker, luhn_valid
from chainrun.checks.patterns import CARD_NETWORKS, card_network, ean13_valid

#: Test card numbers published for testing by payment processors (Stripe's "Testing"
#: page and PayPal Braintree's sandbox test cards), with their network.
PUBLISHED_TEST_CARDS = {
    "4242424242424242": "visa", "4000056655665556": "visa", "4111111111111111": "visa",
    "4012888888881881": "visa", "4222222222222": "visa",
    "5555555555554444": "mastercard", "2223003122003222": "mastercard",
    "5200828282828210": "mastercard", "5105105105105100": "mastercard",
    "378282246310005": "american_express", "371449635398431": "american_express",
    "378734493671000": "american_express",
    "6011111111111117": "discover", "6011000990139424": "discover",
    "6011981111111113": "discover",
    "3056930009020004": "diners_club", "36227206271667": "diners_club",
    "30569309025904": "diners_club", "38520000023237": "diners_club",
    "3566002020360505": "jcb", "3530111333300000": "jcb",
    "6200000000000005": "unionpay", "6205500000000000004": "unionpay",
    "6304000000000000": "maestro",
}  # fmt: skip


def checker() -> PatternChecker:
    return PatternChecker([PatternCheck.builtin("card", "block")])


def flagged(text: str) -> bool:
    return checker().check(text).blocked


def _luhn_only(text: str) -> bool:
    """What the check did before: any 13-19 digit run passing Luhn."""
    digits = "".join(ch for ch in text if ch.isdigit())
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _ean13(rng: random.Random, prefix: str) -> str:
    body = prefix + "".join(rng.choice("0123456789") for _ in range(12 - len(prefix)))
    check = (10 - sum(int(d) * (3 if i % 2 else 1) for i, d in enumerate(body)) % 10) % 10
    return body + str(check)


def number_like_texts() -> dict[str, list[str]]:
    """Number-like text a shop's chat carries, by kind (seeded: the same every run)."""
    rng = random.Random(27)
    # millisecond timestamps 2001-09 .. 2040 (13 digits), in messages and answers
    stamps = [str(rng.randrange(1_000_000_000_000, 2_210_000_000_000)) for _ in range(5000)]
    orders = [
        "".join(rng.choice("0123456789") for _ in range(rng.randint(13, 19)))
        for _ in range(5000)
    ]
    phones = [
        f"+{cc} {rng.randint(10, 999)} {rng.randint(1_000_000, 99_999_999)}"
        for cc in (1, 33, 44, 49, 61, 81, 86, 91)
        for _ in range(250)
    ]
    # EAN-13 product codes with GS1 prefixes (40-44 Germany, 50 UK, 45/49 Japan, 30-37
    # France, 00-13 USA/Canada, 978/979 books, 69 China, 76 Switzerland, 80-83 Italy)
    prefixes = ["40", "41", "42", "43", "44", "45", "49", "50", "30", "37", "00", "06", "978",
                "979", "69", "76", "80", "83"]  # fmt: skip
    eans = [_ean13(rng, rng.choice(prefixes)) for _ in range(5000)]
    return {
        "ms timestamps": [f"logged at {s}" for s in stamps],
        "order numbers": [f"your order {o} ships today" for o in orders],
        "phone numbers": [f"call {p}" for p in phones],
        "EAN-13 codes": [f"EAN {e}" for e in eans],
    }


def rate(check: Callable[[str], bool], texts: list[str]) -> float:
    return sum(1 for t in texts if check(t)) / len(texts)


def test_published_test_cards_are_all_found() -> None:
    assert {n: card_network(n) for n in PUBLISHED_TEST_CARDS} == PUBLISHED_TEST_CARDS
    c = checker()
    for number in PUBLISHED_TEST_CARDS:
        grouped = " ".join(number[i : i + 4] for i in range(0, len(number), 4))
        for text in (f"my card is {number}", f"card: {grouped}.", grouped.replace(" ", "-")):
            assert c.check(text).blocked, text


def test_false_positives_on_number_like_text_vs_luhn_alone() -> None:
    texts = number_like_texts()
    now = {kind: rate(flagged, t) for kind, t in texts.items()}
    before = {kind: rate(_luhn_only, t) for kind, t in texts.items()}
    # Luhn alone flags about one in ten of them
    assert before["ms timestamps"] > 0.08 and before["order numbers"] > 0.08
    # no timestamp of these years, phone number or product code is a card number
    assert now["ms timestamps"] == 0.0, now
    assert now["phone numbers"] == 0.0, now
    assert now["EAN-13 codes"] == 0.0, now
    # a random 13-19 digit order number: a network prefix and length (about 1 in 5 here)
    # times Luhn's 1 in 10
    assert now["order numbers"] < 0.03, now
    assert now["order numbers"] < before["order numbers"] / 4, (now, before)


@pytest.mark.parametrize(
    "text",
    ["order 1733061600123 placed", "ts=1764600000000", "call +49 30 12345678",
     "EAN 4006381333931", "ISBN 9783161484100", "tracking 1Z9999999999999999"],
)
def test_number_like_text_is_not_a_card(text: str) -> None:
    assert not flagged(text), text


def test_luhn_valid_numbers_outside_every_network_are_not_cards() -> None:
    def luhn_valid_numbers() -> Iterator[str]:
        rng = random.Random(3)
        while True:
            s = "".join(rng.choice("0123456789") for _ in range(16))
            if luhn_valid(s):
                yield s

    it = luhn_valid_numbers()
    numbers = [next(it) for _ in range(2000)]
    for n in numbers:
        expected = any(net.issued(n) for net in CARD_NETWORKS) and not ean13_valid(n)
        assert (card_network(n) is not None) is expected, n
    assert any(card_network(n) is None for n in numbers)


def test_ean13_check_digit() -> None:
    assert ean13_valid("4006381333931")  # GS1's worked example
    assert not ean13_valid("4006381333932")
    assert not ean13_valid("400638133393")
