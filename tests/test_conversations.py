"""Conversations: history rendering and budget, token counting, the OpenAI messages
thread, the chain's conversation memory, the standalone query rules, the shop policy."""

from __future__ import annotations

import asyncio
import json
import math

import httpx2
import pytest

from chainrun.conversations import (
    ConversationMemory,
    HistorySettings,
    HistoryTurn,
    cut_to_budget,
    read_thread,
    render_history,
)
from chainrun.conversations.tokens import (
    EstimateCounter,
    ServerTokenizer,
    counter_for,
    estimate_tokens,
    server_root,
)
from chainrun.errors import ConfigError
from chainrun.retrieval.filters import parse_query
from chainrun.retrieval.followup import is_follow_up, price_order, standalone_query
from chainrun.shop_policy import load_policy, policy_text

RAIN = HistoryTurn("Do you have rain jackets?", "Yes: the City Drizzle (44.95 EUR).")


# -- history ---------------------------------------------------------------------------
def test_render_history_is_a_transcript_then_a_blank_line() -> None:
    s = HistorySettings()
    text = render_history([RAIN, HistoryTurn("And\n\nboots?", "")], s)
    assert text == (
        "Shopper: Do you have rain jackets?\nStylist: Yes: the City Drizzle (44.95 EUR).\n"
        "Shopper: And boots?\nStylist: (no answer)\n\n"
    )
    assert render_history([], s) == ""


async def test_budget_keeps_the_newest_whole_turns() -> None:
    turns = [HistoryTurn(f"message {i}", "x" * 40) for i in range(6)]

    async def count(text: str) -> int:
        return 10  # every rendered turn costs 10 tokens

    kept = await cut_to_budget(turns, HistorySettings(max_turns=4, max_tokens=1000), count)
    assert [t.message for t in kept] == ["message 2", "message 3", "message 4", "message 5"]
    kept = await cut_to_budget(turns, HistorySettings(max_turns=10, max_tokens=25), count)
    assert [t.message for t in kept] == ["message 4", "message 5"]  # 30 > 25: a third is cut
    assert await cut_to_budget(turns, HistorySettings(max_turns=0), count) == ()
    assert await cut_to_budget(turns, HistorySettings(max_tokens=5), count) == ()


async def test_budget_never_keeps_an_older_turn_after_dropping_a_newer_one() -> None:
    turns = [HistoryTurn("short", "a"), HistoryTurn("long " * 50, "b"), HistoryTurn("new", "c")]
    counter = EstimateCounter()
    kept = await cut_to_budget(turns, HistorySettings(max_tokens=30), counter.count)
    assert [t.message for t in kept] == ["new"]


def test_history_settings_refuse_unknown_keys() -> None:
    with pytest.raises(ValueError, match="max_turn"):
        HistorySettings.model_validate({"max_turn": 3})


# -- token counting ----------------------------------------------------------------------
def test_estimate_is_four_characters_a_token_rounded_up() -> None:
    assert [estimate_tokens(t) for t in ("", "a", "abcd", "abcde")] == [0, 1, 1, 2]
    assert server_root("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080"


def test_the_estimate_counts_scripts_that_are_not_english() -> None:
    """Four characters a token kept 2.6 times a Japanese budget's tokens; the estimate
    counts an ideograph, a hangul syllable or an emoji one token, a kana half a token,
    a letter of another alphabet 0.45 (weights from benchmarks/token_estimate.py)."""
    assert estimate_tokens("注文番号") == 4
    assert estimate_tokens("ありがとう") == 3  # 5 kana
    assert estimate_tokens("주문") == 2
    assert estimate_tokens("👍👍") == 2 and estimate_tokens("☔️") == 1  # VS16 adds nothing
    assert estimate_tokens("заказ") == 3  # 5 x 0.45, rounded up
    assert estimate_tokens("Größe M") == math.ceil(5 / 4 + 2)
    japanese = "注文番号1042がまだ届いていません。" * 40
    assert estimate_tokens(japanese) >= 0.6 * len(japanese)


async def test_server_tokenizer_counts_with_the_server_and_caches() -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/tokenize"
        content = json.loads(request.content)["content"]
        seen.append(content)
        return httpx2.Response(200, json={"tokens": list(range(len(content.split())))})

    tok = ServerTokenizer("http://srv:8080", transport=httpx2.MockTransport(handler))
    try:
        assert await tok.probe()
        assert await tok.count("one two three four five") == 5
        assert await tok.count("one two three four five") == 5
        assert seen == ["probe", "one two three four five"]  # the second count was cached
    finally:
        await tok.aclose()


async def test_server_without_tokenize_falls_back_to_the_estimate() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(404, json={"error": "not found"})

    tok = ServerTokenizer("http://srv", transport=httpx2.MockTransport(handler))
    try:
        assert not await tok.probe()
        assert await tok.count("abcdefgh") == 2 and tok.failures == 1
    finally:
        await tok.aclose()
    assert (await counter_for(None)).method == "estimate"
    assert (await counter_for("http://srv/v1", "estimate")).method == "estimate"


# -- the OpenAI messages thread -----------------------------------------------------------
def test_thread_pairs_user_and_assistant_messages() -> None:
    thread = read_thread([
        {"role": "system", "content": "Be a pirate."},
        {"role": "assistant", "content": "Welcome!"},  # before any user message: dropped
        {"role": "user", "content": "Do you have rain jackets?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Yes, several."}]},
        {"role": "user", "content": "hello?"},
        {"role": "user", "content": "Which of those is cheapest?"},
        {"role": "assistant", "content": "The"},  # a prefill after the last user message
    ])  # fmt: skip
    assert thread.message == "Which of those is cheapest?"
    assert thread.history == (
        HistoryTurn("Do you have rain jackets?", "Yes, several."),
        HistoryTurn("hello?", ""),
    )
    assert thread.ignored == 1 and thread.turn_index == 3
    assert read_thread([{"role": "system", "content": "x"}]).message is None


# -- the chain's conversation memory ------------------------------------------------------
def test_memory_hands_out_indexes_and_keeps_the_latest_turns() -> None:
    loads: list[str] = []

    def load(cid: str, keep: int) -> tuple[list[tuple[int, HistoryTurn]], int]:
        loads.append(cid)
        return [(1, RAIN)], 1

    mem = ConversationMemory(load, keep_turns=2, max_conversations=2)
    history, index = mem.begin("c1")
    assert history == (RAIN,) and index == 2 and loads == ["c1"]
    mem.end("c1", 2, HistoryTurn("cheapest?", "The red one."))
    history, index = mem.begin("c1")
    assert [t.message for t in history] == ["Do you have rain jackets?", "cheapest?"]
    assert index == 3 and loads == ["c1"]  # known now: no second read of the log
    mem.end("c1", 3, HistoryTurn("navy?", "Yes."))
    assert [t.message for t in mem.begin("c1")[0]] == ["cheapest?", "navy?"]  # keep_turns=2
    assert mem.begin("fresh", new=True) == ((), 1) and loads == ["c1"]
    mem.begin("c3", new=True)  # a third conversation: the least recently used (c1) goes
    assert len(mem) == 2
    mem.begin("c1")
    assert loads == ["c1", "c1"]


def test_memory_orders_turns_that_end_out_of_order() -> None:
    mem = ConversationMemory(None, keep_turns=5)
    _, first = mem.begin("c")
    _, second = mem.begin("c")  # starts while the first still runs
    assert (first, second) == (1, 2)
    mem.end("c", second, HistoryTurn("two"))
    mem.end("c", first, HistoryTurn("one"))
    assert [t.message for t in mem.begin("c")[0]] == ["one", "two"]


async def test_memory_reads_an_unknown_conversation_once_without_holding_the_loop() -> None:
    """An asynchronous loader (a PostgreSQL read in a worker thread): two turns of one
    conversation starting together share one read and get consecutive indexes; the
    event loop keeps running meanwhile."""
    loads: list[str] = []
    release = asyncio.Event()

    async def load(cid: str, keep: int) -> tuple[list[tuple[int, HistoryTurn]], int]:
        loads.append(cid)
        await release.wait()
        return [(1, RAIN)], 1

    mem = ConversationMemory(load, keep_turns=2)
    first = asyncio.ensure_future(mem.abegin("c1"))
    second = asyncio.ensure_future(mem.abegin("c1"))
    await asyncio.sleep(0.01)
    assert not first.done() and loads == ["c1"]  # waiting on the read, the loop runs
    release.set()
    assert await first == ((RAIN,), 2) and await second == ((RAIN,), 3)
    assert await mem.abegin("c1") == ((RAIN,), 4) and loads == ["c1"]
    assert await mem.abegin("new", new=True) == ((), 1) and loads == ["c1"]
    with pytest.raises(TypeError, match="abegin"):
        mem.begin("c2")  # a synchronous begin cannot await this loader


# -- the standalone query ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("message", "earlier", "expected"),
    [
        ("Which of those is cheapest?", ["Do you have rain jackets?"],
         "Do you have rain jackets? cheapest"),
        ("Is it available in navy?", ["Do you have rain jackets under 100?", "Which is cheapest?"],
         "Do you have rain jackets under 100? cheapest available in navy"),
        ("What about in size S?", ["Do you have a black wool coat?"],
         "Do you have a black wool coat? in size S"),
        ("And boots?", ["Do you have rain jackets?"], "And boots?"),  # names its own subject
        ("Which of those is cheapest?", [], "Which of those is cheapest?"),  # nothing to carry
        ("Show me linen shirts.", ["What should a man wear to a wedding?"],
         "Show me linen shirts."),
    ],
)  # fmt: skip
def test_standalone_query(message: str, earlier: list[str], expected: str) -> None:
    assert standalone_query(message, earlier) == expected


def test_a_follow_up_query_keeps_the_earlier_filters() -> None:
    query = standalone_query("Which one is cheapest?", ["a rain jacket under 100 euros"])
    parsed = parse_query(query)
    assert parsed.filters.max_price == 100 and "jackets" in parsed.filters.categories
    assert is_follow_up("Which one is cheapest?") and not is_follow_up("rain jackets")


# -- the shop policy --------------------------------------------------------------------
def test_sample_policy_has_a_section_per_non_product_label() -> None:
    policy = load_policy()
    assert set(policy) == {"order_status", "returns", "sizing", "other"}
    text = policy_text(policy, "returns")
    assert text.startswith("Shop policy, Returns, refunds and exchanges:\n")
    assert "30 days" in text and text.endswith("\n\n")
    assert policy_text(policy, "product_search") == "" and policy_text(policy, None) == ""


def test_bad_policy_file_is_one_line_naming_it(tmp_path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text('[returns]\ntitle = "R"\ntexts = "typo"\n')
    with pytest.raises(ConfigError, match=r"p\.toml: returns\.texts: unknown field"):
        load_policy(bad)
    with pytest.raises(ConfigError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "order", "rest"),
    [
        ("Do you have rain jackets? Which of those is cheapest?", "price_asc",
         "Do you have rain jackets? Which of those is ?"),
        ("the most expensive wool coat", "price_desc", "the wool coat"),
        ("a cheaper one, or the priciest?", "price_desc", "a one, or the ?"),  # the last wins
        ("rain jackets", None, "rain jackets"),
    ],
)  # fmt: skip
def test_price_order_words(text: str, order: str | None, rest: str) -> None:
    assert price_order(text) == (order, rest)
