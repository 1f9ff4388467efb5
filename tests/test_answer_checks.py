"""The answer's checks as one list (chainrun.checks.stream): a check of this module's own,
registered by name, runs on the stream and on an unstreamed answer with no code
elsewhere; the loop check (chainrun.checks.loops) stops a repeating answer on the stream
(its model call cancelled), keeps the whole sentences before the repetition and logs
why; an answer that does not repeat passes unchanged."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import reply_by_step
from serve_helpers import chat, serving

from chainrun.chain import Chain
from chainrun.checks.holdback import HoldBack, Redaction, WindowVerdict
from chainrun.checks.loops import DEFAULT_LOOP_TEXT, LoopCheck, find_repeat
from chainrun.checks.stream import (
    CheckList,
    StreamCheck,
    StreamFigures,
    apply_redactions,
    compose_redactions,
    register_check,
)
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.evals.assertions import NoRepeat, TurnView
from chainrun.events import StepFinished, TokenDelta, TurnFinished
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply

# -- a check of this module's own ------------------------------------------------------------


class Darn(StreamCheck):
    """Shows "darn" as "[mild]" and blocks "heck"; logs what it saw."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.message = str(values.get("message"))
        self.calls = 0
        self.finals = 0
        self.shown: list[str] = []

    async def check(self, text: str, final: bool) -> WindowVerdict:
        self.calls += 1
        self.finals += final
        if "heck" in text:
            return WindowVerdict(False, "darn: heck")
        at = text.find("darn")
        redactions = (Redaction(at, at + 4, "[mild]"),) if at >= 0 else ()
        return WindowVerdict(True, redactions=redactions)

    def released(self, piece: str) -> None:
        self.shown.append(piece)

    def finish(self, figures: StreamFigures) -> dict[str, Any]:
        return {"status": "blocked" if figures.blocked_by == "darn" else "passed",
                "calls": self.calls, "finals": self.finals, "streamed": figures.streamed,
                "message": self.message, "released": "".join(self.shown)}  # fmt: skip

    def on_block(self) -> tuple[str | None, bool]:
        return "Let us keep it polite.", False


register_check("darn", Darn)


async def run(
    text: str | FakeReply, compose: dict[str, Any] | None = None
) -> tuple[TurnFinished, str, StepFinished, FakeProvider, Store]:
    reply = text if isinstance(text, FakeReply) else FakeReply(text, gap_s=0.001)
    # no stop sequence: the default chain's compose stops at its first ". "
    cfg = config_from_dict({"order": ["compose"], "steps": {"compose": {
        "prompt": "{message}", "stop": [], **(compose or {})}}})  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step({"compose": reply}))
    store = Store.open(":memory:")
    shown: list[str] = []
    finished: StepFinished | None = None
    done: TurnFinished | None = None
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        async for ev in chain.stream_turn("any rain jackets?"):
            if isinstance(ev, TokenDelta):
                shown.append(ev.text)
            elif isinstance(ev, StepFinished) and ev.step == "compose":
                finished = ev
            elif isinstance(ev, TurnFinished):
                done = ev
    assert done is not None and finished is not None
    return done, "".join(shown), finished, fake, store


@pytest.mark.parametrize("stream", [True, False])
async def test_a_registered_check_runs_on_the_answer_with_no_code_elsewhere(
    stream: bool,
) -> None:
    text = "Darn good question. The Storm Shell keeps darn rain out. Try it today."
    done, shown, finished, _, store = await run(
        text, {"stream": stream, "checks": ["darn", "loop"], "grounding": {"enabled": False}}
    )
    assert done.status == "ok"
    # "Darn" is capitalised: only the lower-case ones are this check's
    assert done.output == text.replace(" darn ", " [mild] ")
    if stream:
        assert shown == done.output
    doc = finished.detail["darn"]  # type: ignore[index]
    assert doc["status"] == "passed" and doc["streamed"] is stream
    assert doc["message"] == "any rain jackets?"  # made from the turn's values
    # whole, once, when unstreamed; on the stream, the end only when text was held
    assert (doc["finals"], doc["calls"]) == (1, 1) if not stream else doc["calls"] > 1
    if stream:
        assert doc["released"] == done.output  # told what reached the shopper
    assert finished.detail["checks"] == ["darn", "loop"]  # type: ignore[index]
    turn = store.turns(done.run_id or 0)[0]
    assert turn.verdicts["compose"]["darn"]["status"] == "passed"
    store.close()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_registered_check_blocks_with_its_own_text(stream: bool) -> None:
    text = "Well heck, that jacket is sold out. " + " ".join(f"w{i}" for i in range(200))
    done, shown, _, fake, store = await run(
        text, {"stream": stream, "checks": ["darn"], "grounding": {"enabled": False}}
    )
    assert done.status == "refused" and done.output == "Let us keep it polite."
    assert "heck" not in shown
    assert done.verdicts["compose"]["darn"]["status"] == "blocked"
    if stream:
        assert fake.closed_early == 1  # the stream was stopped at the block
    store.close()


def test_checks_name_known_checks_once() -> None:
    with pytest.raises(ConfigError, match=r"steps\.compose: checks\[1\]: 'nope' is no check"):
        config_from_dict({"steps": {"compose": {"checks": ["loop", "nope"]}}})
    with pytest.raises(ConfigError, match=r"checks\[1\]: 'loop' is listed twice"):
        config_from_dict({"steps": {"compose": {"checks": ["loop", "loop"]}}})
    with pytest.raises(ConfigError, match=r"'grounding' is listed but grounding\.enabled"):
        config_from_dict({"steps": {"compose": {"checks": ["grounding"],
                                                "grounding": {"enabled": False}}}})
    with pytest.raises(ConfigError, match=r"steps\.validate\.checks: only the answer step"):
        config_from_dict({"steps": {"validate": {"checks": ["loop"]}}})
    # today's keys make the list: the default chain's answer step
    compose = config_from_dict({}).steps["compose"]
    assert compose.check_names() == ["grounding", "loop"]  # type: ignore[attr-defined]
    both = config_from_dict({"steps": {"compose": {"output_check": {}}}}).steps["compose"]
    assert both.check_names() == ["output_check", "grounding", "loop"]  # type: ignore[attr-defined]


async def test_the_output_check_before_grounding_is_one_list_in_order() -> None:
    """A redaction of the first check is what the next one sees: the grounding check
    judges the text with the e-mail already masked, and both verdicts are logged."""
    text = "Write to help@shop.example for sizes. We reply within a day."
    done, shown, finished, _, store = await run(
        text, {"output_check": {"email": "redact", "window_tokens": 3}}
    )
    assert done.status == "ok"
    assert shown == done.output == text.replace("help@shop.example", "[email]")
    detail = finished.detail or {}
    assert detail["checks"] == ["output_check", "grounding", "loop"]
    assert detail["output_check"]["redactions"] == 1 and detail["grounding"]["claims"] == 0
    store.close()


# -- the loop check ------------------------------------------------------------------------

LOOP = "I'm a shop assistant. " * 400  # 1600 words: the fake's "token cap"


async def test_a_repeating_answer_is_stopped_on_the_stream() -> None:
    done, shown, finished, fake, store = await run(LOOP.strip())
    assert done.status == "ok"
    assert shown == done.output == "I'm a shop assistant."  # one whole sentence
    # the call was cancelled long before the cap: the fake saw its stream closed
    assert fake.closed_early == 1 and fake.finished == 0
    call = store.calls(done.run_id or 0)[0]
    assert call.n_chunks < 20  # of 1600
    doc = (finished.detail or {})["loop"]
    assert doc["status"] == "stopped" and doc["kind"] == "sentence"
    assert doc["reason"] == "loop: \"I'm a shop assistant.\" said again"
    assert doc["call_cancelled"] and doc["tokens_in"] < 20 and not doc["replaced"]
    turn = store.turns(done.run_id or 0)[0]
    assert turn.status == "ok" and turn.verdicts["compose"]["loop"]["kind"] == "sentence"
    # the eval assertion agrees: what reached the shopper repeats nothing
    assert NoRepeat().check(TurnView(message="m", answer=LOOP)).passed is False
    assert NoRepeat().check(TurnView(message="m", answer=done.output)).passed
    store.close()


async def test_the_whole_sentences_before_a_loop_are_kept_without_grounding() -> None:
    """The loop check holds a sentence that begins like an earlier one (the grounding
    check, off here, is not what keeps the repeat from the shopper)."""
    text = "Good question. The Storm Shell is light. " + "It keeps you dry. " * 300
    done, shown, finished, fake, store = await run(text, {"grounding": {"enabled": False}})
    assert done.status == "ok"
    assert shown == done.output == "Good question. The Storm Shell is light. It keeps you dry."
    assert fake.closed_early == 1
    assert (finished.detail or {})["loop"]["kind"] == "sentence"
    store.close()


async def test_a_cycle_that_never_ends_a_sentence_says_so_plainly() -> None:
    done, shown, finished, fake, store = await run(" ".join(["shop"] * 1000))
    assert done.status == "ok" and shown == done.output == DEFAULT_LOOP_TEXT
    assert fake.closed_early == 1
    doc = (finished.detail or {})["loop"]
    assert doc["kind"] == "cycle" and doc["replaced"] and doc["tokens_in"] < 30
    store.close()


async def test_an_answer_that_does_not_repeat_passes_unchanged() -> None:
    text = ("The Storm Shell is light and packs small. It keeps the rain out on the "
            "commute. The City Drizzle is lighter still, and it packs into its pocket.")
    for stream in (True, False):
        done, shown, finished, fake, store = await run(text, {"stream": stream})
        assert done.status == "ok" and done.output == text
        assert shown == (text if stream else "")
        assert "loop" not in (finished.detail or {}) and fake.closed_early == 0
        assert "loop" not in done.verdicts.get("compose", {})
        store.close()


async def test_an_unstreamed_repeating_answer_is_cut_to_its_first_sentences() -> None:
    done, _, finished, _, store = await run("Hello there. " + LOOP, {"stream": False})
    assert done.status == "ok" and done.output == "Hello there. I'm a shop assistant."
    doc = (finished.detail or {})["loop"]
    assert doc["streamed"] is False and doc["call_cancelled"] is False
    store.close()


async def test_chat_carries_the_loop_verdict(tmp_path) -> None:
    cfg = config_from_dict({"order": ["compose"],
                            "steps": {"compose": {"prompt": "{message}", "stop": []}}})
    fake = FakeProvider(name="local", script=reply_by_step({"compose": FakeReply(LOOP)}))
    store = Store.open(":memory:")
    factory = lambda: Chain(cfg, store=store, providers={"local": fake}, kind="live",  # noqa: E731
                            quiet=True)  # fmt: skip
    async with serving(factory) as (url, _), httpx.AsyncClient(base_url=url) as client:
        events = await chat(client, "who are you?")
    checks = [d for e, d in events if e == "check"]
    assert [(d["step"], d["check"], d["status"]) for d in checks] == [
        ("compose", "loop", "stopped")]
    assert checks[0]["reason"].startswith("loop:")
    assert [e for e, _ in events].index("check") > [e for e, _ in events].index("step")
    turn = events[-1][1]
    assert turn["status"] == "ok" and turn["output"] == "I'm a shop assistant."
    assert fake.closed_early == 1
    store.close()


REAL = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "tools_local_model.json"


async def test_the_embedded_models_own_loops_are_stopped_early() -> None:
    """The embedded model's answers of the tools benchmark (all eight streamed to the
    token cap, ``finish_reason`` "length", most one line repeated): streamed token by
    token through the loop check, 7 of 8 are stopped, each after at most 30 of its 40 to
    51 tokens, keeping the first copy; the eighth counts up ("TSH-2", "TSH-3", ...), no
    verbatim repeat, and passes unchanged."""
    answers = json.loads(REAL.read_text())["results"]["answers"]
    assert len(answers) == 8 and all(a["finish_reason"] == "length" for a in answers)
    stopped = 0
    for a in answers:
        tokens = re.findall(r"\S+\s*|\s+", a["text"])

        async def source(tokens: list[str] = tokens):
            for t in tokens:
                yield t

        engine = HoldBack(CheckList([("loop", LoopCheck())]), 0)
        shown = "".join([p async for p in engine.stream(source())])
        if engine.stats.stopped is None:
            assert shown == a["text"] and "TSH-3" in shown
            continue
        stopped += 1
        assert engine.stats.tokens_in <= 30 and engine.stats.tokens_in < len(tokens) * 0.75
        first = a["text"].strip().splitlines()[0]
        assert shown.strip().startswith(first) and shown.count(first) == 1
    assert stopped == 7


# -- the pieces ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "kept"),
    [
        ("I'm a shop assistant. I'm a shop assistant.", "sentence", "I'm a shop assistant."),
        ("Hi! The coat is warm. It is light. the COAT is warm!", "sentence", "Hi! The coat is "
         "warm. It is light."),
        ("Sure. and then " * 1 + "and then " * 6, "cycle", "Sure."),
        ("Yes. " + "very " * 9 + "good.", "cycle", "Yes."),
    ],
)
def test_find_repeat(text: str, kind: str, kept: str) -> None:
    found = find_repeat(text)
    assert found is not None and found.kind == kind
    assert text[: found.cut].strip() == kept


@pytest.mark.parametrize(
    "text",
    [
        "Yes. Yes. Thanks! Thanks!",  # short sentences said twice: natural
        "It is very very good, really really light and so so warm.",
        "- [JKT-005] Women's City Drizzle Packable Rain Jacket (yellow) | €49.95\n"
        "- [JKT-009] Men's City Drizzle Packable Rain Jacket (yellow) | €49.95\n"
        "- [JKT-010] Kids' City Drizzle Packable Rain Jacket (yellow) | €39.95\n",
        "The linen shirt runs true to size. The linen shirt pairs well with chinos.",
    ],
)
def test_natural_repetition_is_no_loop(text: str) -> None:
    assert find_repeat(text) is None


async def test_the_loop_check_on_the_engine_releases_whole_sentences_then_stops() -> None:
    closed: list[bool] = []

    async def source():  # one word a token
        try:
            for i in range(1000):
                yield ("Hello there. " if i == 0 else "") + "A fine day. "
        finally:
            closed.append(True)

    engine = HoldBack(CheckList([("loop", LoopCheck())]), 0)
    pieces = [p async for p in engine.stream(source())]
    assert "".join(pieces) == "Hello there. A fine day."
    assert closed == [True] and engine.stats.tokens_in < 5
    assert engine.stats.stopped is not None and engine.stats.stopped.startswith("loop:")


def test_redactions_compose_in_order() -> None:
    text = "call 0123 or mail a@b.c today"
    first = [Redaction(5, 9, "[phone]")]
    then_text = apply_redactions(text, first)
    assert then_text == "call [phone] or mail a@b.c today"
    # a drop over the first's replacement swallows it; one after it is moved back
    then = [Redaction(0, 13, ""), Redaction(21, 26, "[email]")]
    both = compose_redactions(text, first, then)
    assert apply_redactions(text, both) == apply_redactions(then_text, then)
    assert apply_redactions(text, both) == "or mail [email] today"
    # one inside the first's replacement widens to cover it whole
    inner = [Redaction(6, 8, "P")]
    assert apply_redactions(text, compose_redactions(text, first, inner)) == \
        apply_redactions(then_text, inner)  # fmt: skip


async def test_a_check_after_a_stop_does_not_run() -> None:
    seen: list[str] = []

    class Spy(StreamCheck):
        async def check(self, text: str, final: bool) -> WindowVerdict:
            seen.append(text)
            return WindowVerdict(True)

    checks = CheckList([("loop", LoopCheck()), ("spy", Spy())])
    verdict = await checks("Hi there friend. Hi there friend. ", final=False)
    assert verdict.stop and checks.stopped_by == "loop" and seen == []
    assert apply_redactions("Hi there friend. Hi there friend. ", verdict.redactions) == \
        "Hi there friend."  # fmt: skip


@pytest.mark.parametrize("text", [
    "Good question. The Storm Shell is light. It keeps you dry. It keeps you dry.",
    "Sure. " + "and then " * 8, "Nice. " + "rain " * 12 + "done.",
    "A fine coat. I'm a shop assistant, here. I'm a shop assistant, here.",
])  # fmt: skip
def test_the_no_repeat_assertion_fails_what_the_loop_check_stops(text: str) -> None:
    found = find_repeat(text)
    assert found is not None
    assert not NoRepeat().check(TurnView(message="m", answer=text)).passed
    kept = text[: found.cut]
    assert NoRepeat().check(TurnView(message="m", answer=kept)).passed
