"""The hold-back engine: nothing flagged reaches the consumer, even split across chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from chainrun.checks import PatternCheck, PatternChecker
from chainrun.checks.holdback import (
    HoldBack,
    OutputBlocked,
    WindowVerdict,
    exposure_bound,
    window_check,
)


class Source:
    """An async token source that records whether it was closed."""

    def __init__(self, tokens: list[str], delay_s: float = 0.0) -> None:
        self.tokens = tokens
        self.delay_s = delay_s
        self.sent = 0
        self.closed = False

    def __aiter__(self) -> Source:
        return self

    async def __anext__(self) -> str:
        if self.sent >= len(self.tokens):
            raise StopAsyncIteration
        await asyncio.sleep(self.delay_s)
        self.sent += 1
        return self.tokens[self.sent - 1]

    async def aclose(self) -> None:
        self.closed = True


def phrase_check(phrase: str, delay_s: float = 0.0):  # type: ignore[no-untyped-def]
    seen: list[str] = []

    async def check(text: str) -> WindowVerdict:
        seen.append(text)
        await asyncio.sleep(delay_s)
        return WindowVerdict(phrase not in text, f"says {phrase!r}" if phrase in text else None)

    return check, seen


async def consume(gen: AsyncGenerator[str, None], out: list[str]) -> None:
    async for piece in gen:
        out.append(piece)


@pytest.mark.parametrize("window", [2, 3, 4, 8])
async def test_a_phrase_split_across_chunks_and_windows_never_reaches_the_consumer(
    window: int,
) -> None:
    # "forbidden" arrives in three chunks, at every possible offset relative to the windows
    for lead in range(window + 2):
        tokens = [f"w{i} " for i in range(lead)] + ["for", "bid", "den", " and", " more"]
        check, _ = phrase_check("forbidden", delay_s=0.001)
        src = Source(tokens, delay_s=0.0005)
        out: list[str] = []
        with pytest.raises(OutputBlocked) as info:
            await consume(HoldBack(check, window).stream(src), out)
        shown = "".join(out)
        assert "for" not in shown and "bid" not in shown, (window, lead, shown)
        assert info.value.released_text == shown
        assert src.closed


async def test_a_clean_stream_is_released_whole_and_in_order() -> None:
    tokens = [f"t{i} " for i in range(23)]
    check, seen = phrase_check("forbidden")
    hb = HoldBack(check, 4)
    out: list[str] = []
    await consume(hb.stream(Source(tokens)), out)
    assert "".join(out) == "".join(tokens)
    assert hb.stats.tokens_released == 23 and hb.stats.checks == len(seen) >= 5
    assert hb.stats.max_held_tokens <= 2 * 4 + 1


async def test_the_last_c_tokens_wait_for_a_check_of_what_follows() -> None:
    """Released text always trails what was read by at least c tokens until the end."""
    c = 3
    tokens = [f"{i} " for i in range(12)]
    src = Source(tokens, delay_s=0.001)
    check, _ = phrase_check("never")
    released_counts: list[tuple[int, int]] = []
    hb = HoldBack(check, c)
    async for _piece in hb.stream(src):
        released_counts.append((hb.stats.tokens_released, src.sent))
    *middle, last = released_counts
    assert all(sent - released >= c for released, sent in middle)
    assert last[0] == 12


async def test_slow_checks_cover_more_text_and_do_not_pause_reading() -> None:
    check, seen = phrase_check("never", delay_s=0.02)
    src = Source([f"{i} " for i in range(40)], delay_s=0.001)
    out: list[str] = []
    await consume(HoldBack(check, 2).stream(src), out)
    assert "".join(out) == "".join(f"{i} " for i in range(40))
    assert len(seen) < 20  # fewer checks than windows of 2: each covered what piled up


async def test_pattern_checks_run_on_every_window_and_redact_before_release() -> None:
    checker = PatternChecker(
        [PatternCheck.builtin("card", "block"), PatternCheck.builtin("email", "redact")]
    )
    tokens = ["write ", "to ", "a.b", "@shop", ".example", ".com ", "today ", "ok"]
    out: list[str] = []
    await consume(HoldBack(window_check(checker), 4).stream(Source(tokens)), out)
    assert "".join(out) == "write to [email] today ok"

    card = ["pay ", "with ", "4111 ", "1111 ", "1111 ", "1111", " thanks"]
    out = []
    with pytest.raises(OutputBlocked, match="pattern: card"):
        await consume(HoldBack(window_check(checker), 4).stream(Source(card)), out)
    assert "4111" not in "".join(out)


async def test_model_check_is_not_called_when_a_pattern_blocks() -> None:
    calls: list[str] = []

    async def model(text: str) -> WindowVerdict:
        calls.append(text)
        return WindowVerdict(True)

    check = window_check(PatternChecker([PatternCheck.builtin("card", "block")]), model)
    assert not (await check("card 4111111111111111")).ok
    assert calls == []
    assert (await check("hello")).ok and calls == ["hello"]


async def test_closing_the_consumer_closes_the_source() -> None:
    check, _ = phrase_check("never")
    src = Source([f"{i} " for i in range(100)], delay_s=0.001)
    gen = HoldBack(check, 2).stream(src)
    await anext(gen)
    await gen.aclose()
    assert src.closed and src.sent < 100


def test_exposure_bound() -> None:
    figures = exposure_bound(8, 65.0, 300.0)
    assert figures["exposure_tokens"] == 0
    assert figures["added_delay_ms"] == pytest.approx(1000 * 8 / 65 + 300, abs=0.1)
    assert figures["exposure_without_holdback_tokens"] == 8 + 20  # 65 tok/s x 0.3 s = 19.5
    assert exposure_bound(8, 65.0, 300.0, phrase_tokens=12)["exposure_tokens"] == 4
    with pytest.raises(ValueError):
        exposure_bound(0, 65.0, 300.0)
