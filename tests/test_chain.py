"""The chain on the in-process fake provider: events, logging, fail open/closed, early close."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from cli_runner import chainrun
from conftest import model_classify_config, reply_by_step

from chainrun.analysis.summary import latency_summary
from chainrun.answer_json import parse_json_object
from chainrun.chain import REFUSAL, Chain
from chainrun.classify.base import DEFAULT_LABELS
from chainrun.config import LLM_CLASSIFY_STEP, ChainConfig, config_from_dict
from chainrun.errors import ProviderStatusError, ProviderUnavailable
from chainrun.events import AnswerDone, StepStarted, TokenDelta, TurnFinished
from chainrun.hedging import BreakerRegistry
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply, words_in_sentences
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.steps.llm import parse_label


async def collect(chain: Chain, message: str) -> list:
    events = []
    async with contextlib.aclosing(chain.stream_turn(message)) as it:
        async for ev in it:
            events.append(ev)
    return events


async def test_turn_runs_every_step_and_logs_every_call(config, store, fake) -> None:
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        events = await collect(chain, "waterproof jacket under 100?")
    kinds = [type(e) for e in events]
    assert kinds[0] is StepStarted and kinds[-1] is TurnFinished
    started = [e.step for e in events if isinstance(e, StepStarted)]
    # classify (no model call) routes the turn: it runs first, then the catalogue search
    # (a product question: the policy step is skipped), then the answer and its checks
    assert started == ["classify", "retrieve", "compose", "validate", "critique"]
    deltas = "".join(e.text for e in events if isinstance(e, TokenDelta))
    done = events[-1]
    assert (
        done.status == "ok" and done.output == deltas == "Try the Storm Shell, light and dry."
    )
    assert done.label == "product_search"
    assert done.verdicts["validate"] == {"ok": True, "reason": "fine"}
    calls = store.calls(done.run_id)
    assert [c.step for c in calls] == ["compose", "validate", "critique"]
    for c in calls:
        assert c.ttft_ms > 0 and c.duration_ms >= c.ttft_ms
        assert len(c.chunk_gaps_ms) == c.n_chunks - 1
        # the timer's time between tokens (text chunks only) is logged with the call
        assert c.time_between_tokens_ms is not None and c.time_between_tokens_ms >= 0
        assert c.output_tokens > 0 and c.outcome == "not_fired" and c.attempt == 1
        assert c.finish_reason == "stop" and c.truncated == 0
    assert store.get_run(done.run_id).status == "complete"
    assert store.get_run(done.run_id).kind == "live"


async def test_closed_step_failure_refuses_turn_and_skips_the_rest(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(error=ProviderStatusError("boom", status=500)),
    }))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("hello")
    assert done.status == "refused" and done.output == REFUSAL
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["compose"].status == "failed_closed"
    assert steps["compose"].error_type == "http_500"
    assert steps["validate"].status == "skipped"


async def test_open_step_failure_continues_unchecked(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "validate": FakeReply(error=ProviderStatusError("slow down", status=429)),
    }))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("hello")
    assert done.status == "ok"
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["validate"].status == "failed_open"
    assert steps["critique"].status == "ok"


async def test_truncated_stream_is_not_success(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("cut off here", finish_reason=None),
    }))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("hello")
    # not a success; its words had reached the shopper, so the turn is cut (they stay
    # the answer), not refused
    assert done.status == "cut" and done.error_type == "truncated"
    assert done.output == "cut off here"
    call = next(c for c in store.calls(done.run_id) if c.step == "compose")
    assert call.truncated == 1 and call.finish_reason is None
    assert call.error_type == "truncated"


async def test_stream_without_usage_records_unknown_tokens(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("no usage here", usage=False),
    }))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("hello")
    call = next(c for c in store.calls(done.run_id) if c.step == "compose")
    assert call.output_tokens is None and call.input_tokens is None
    assert call.reasoning_tokens is None and call.ttft_ms > 0


async def test_closing_the_iterator_early_cancels_and_still_logs(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(words_in_sentences(200), ttft_s=0.001, gap_s=0.01),
    }))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        it = chain.stream_turn("hello")
        n = 0
        async for ev in it:
            if isinstance(ev, TokenDelta):
                n += 1
                if n == 3:
                    break
        await it.aclose()
        run_id = chain.run_id
    assert fake.closed_early >= 1
    turns = store.turns(run_id)
    assert turns[0].status == "cancelled"
    compose = next(c for c in store.calls(run_id) if c.step == "compose")
    assert compose.n_chunks < 100 and compose.truncated == 1
    # the shopper saw answer tokens: their wait for the first one is known (it was "-")
    assert turns[0].answer_ttft_ms is not None and turns[0].answer_ttft_ms >= compose.ttft_ms
    assert turns[0].answer_done_ms is None


async def test_cancelled_task_logs_cancelled_turn(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("slow", ttft_s=5.0),
    }))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        task = asyncio.create_task(chain.run_turn("hello"))
        for _ in range(1000):  # until compose's call is in flight (classify, retrieve done)
            if fake.requests:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        run_id = chain.run_id
    assert store.turns(run_id)[0].status == "cancelled"
    assert store.turns(run_id)[0].answer_ttft_ms is None  # no answer token was shown
    assert fake.closed_early >= 1


async def test_a_turn_cancelled_after_its_answer_was_done_stays_answered(config, tmp_path) -> None:
    """A stop after ``answer_done`` (the shopper has the whole answer) cuts only the checks
    still running: the turn stays ``ok`` with its answer times, those steps ``cancelled``
    (said by ``chainrun show``; their cut times stay out of the step percentiles)."""
    store = Store.open(tmp_path / "log.db")
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("Try the Storm Shell.", ttft_s=0.001, gap_s=0.001),
        "validate": FakeReply('{"ok": true, "reason": "fine"}', ttft_s=5.0),
        "critique": FakeReply('{"ok": true, "reason": "fine"}', ttft_s=5.0),
    }))  # fmt: skip
    answered = asyncio.Event()

    async def turn() -> None:
        async with contextlib.aclosing(chain.stream_turn("hello")) as it:
            async for ev in it:
                if isinstance(ev, AnswerDone):
                    answered.set()

    async with Chain(config, store=store, providers={"local": fake}) as chain:
        task = asyncio.create_task(turn())
        await asyncio.wait_for(answered.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        run_id = chain.run_id
    (logged,) = store.turns(run_id)
    assert logged.status == "ok" and logged.output == "Try the Storm Shell."
    assert logged.answer_done_ms is not None and logged.answer_ttft_ms is not None
    steps = {s.step: s.status for s in store.steps(run_id)}
    assert steps["compose"] == "ok"
    assert steps["validate"] == steps["critique"] == "cancelled"
    summary = latency_summary(store, run_id)
    assert summary["turns"]["n_completed"] == 1 and summary["answer_done"]["n"] == 1
    assert summary["steps"]["compose"]["n"] == 1 and summary["steps"]["validate"]["n"] == 0
    store.close()
    shown = chainrun("show", str(run_id), "--db", str(tmp_path / "log.db"))
    assert shown.returncode == 0, shown.output
    assert f"turn {logged.id}" in shown.stdout and " ok " in shown.stdout
    assert "validate, critique cancelled after the answer was done" in shown.stdout


async def test_unreachable_provider_raises_unavailable(store) -> None:
    cfg = config_from_dict({"providers": {"local": {"base_url": "http://127.0.0.1:9/v1",
                                                    "connect_timeout_s": 1.0}}})  # fmt: skip
    chain = Chain(cfg, store=store)
    with pytest.raises(ProviderUnavailable, match="cannot reach provider 'local'"):
        async with chain:
            await chain.run_turn("hello")
    assert chain.run_id is None and store.list_runs() == []  # checked before any run exists


async def test_provider_lost_mid_run_marks_the_run_failed(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(error=ProviderUnavailable("cannot reach provider 'local'")),
    }))  # fmt: skip
    chain = Chain(config, store=store, providers={"local": fake})
    with pytest.raises(ProviderUnavailable):
        async with chain:
            await chain.run_turn("hello")
    assert store.get_run(chain.run_id).status == "failed"
    assert store.turns(chain.run_id)[0].status == "error"


async def test_hedged_step_copy_wins_and_loser_is_closed(store) -> None:
    cfg: ChainConfig = config_from_dict({
        "providers": {"backup": {"base_url": "http://127.0.0.1:1/v1"}},
        "steps": {"classify": {**LLM_CLASSIFY_STEP,  # classified by the model
                               "hedge": {"delay_ms": 20, "max_attempts": 2,
                                         "targets": ["backup"], "max_extra_load": 1.0}}},
    })  # fmt: skip
    slow = FakeProvider(name="local", script=reply_by_step({
        "classify": FakeReply("sizing", ttft_s=2.0),
    }))  # fmt: skip
    fast = FakeProvider(name="backup", script=FakeReply("styling", ttft_s=0.001))
    async with Chain(cfg, store=store, providers={"local": slow, "backup": fast}) as chain:
        done = await chain.run_turn("hello")
    assert done.label == "styling"
    calls = [c for c in store.calls(done.run_id) if c.step == "classify"]
    by_attempt = {c.attempt: c for c in calls}
    assert by_attempt[1].outcome == "cancelled" and by_attempt[1].target == "local"
    assert by_attempt[2].outcome == "duplicate" and by_attempt[2].target == "backup"
    assert by_attempt[2].started_offset_ms >= 19
    assert by_attempt[1].output_tokens is None  # cost of a cancelled loser: unknown, not 0
    assert slow.closed_early == 1
    step = next(s for s in store.steps(done.run_id) if s.step == "classify")
    assert step.hedge_fired == 1 and step.hedge_won == 1


def test_parsers() -> None:
    assert parse_label("Label: Order_Status.", DEFAULT_LABELS) == "order_status"
    assert parse_label("no idea", DEFAULT_LABELS) == "other"
    assert parse_json_object('```json\n{"ok": false, "reason": "x"}\n```') == {
        "ok": False,
        "reason": "x",
    }
    assert parse_json_object("not json {") is None


async def test_provider_never_gets_the_key_in_the_log(store, monkeypatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-secret-123")
    cfg = config_from_dict({"providers": {"local": {"base_url": "http://127.0.0.1:9/v1",
                                                    "api_key_env": "MY_KEY"}}})  # fmt: skip
    p = OpenAICompatProvider("local", "http://127.0.0.1:9/v1", "MY_KEY")
    await p.aclose()
    store.create_run("live", cfg.snapshot())
    dump = json.dumps(list(store.db["runs"].rows))
    assert "sk-secret-123" not in dump


async def test_a_steps_breaker_settings_are_its_own(store) -> None:
    """A step's [hedge] breaker_* settings hold for its targets (they were once ignored:
    the chain shared one default registry); steps with the same settings share breakers."""
    hedge = {"delay_ms": 20, "max_attempts": 2, "targets": ["backup"], "max_extra_load": 1.0}
    cfg: ChainConfig = model_classify_config({
        "providers": {"backup": {"base_url": "http://127.0.0.1:1/v1"}},
        "steps": {"classify": {"hedge": {**hedge, "breaker_failures": 1,
                                         "breaker_cooldown_s": 600.0}},
                  "validate": {"hedge": hedge}, "critique": {"hedge": hedge}},
    })  # fmt: skip
    down = FakeProvider(name="backup", script=FakeReply(error=ConnectionError("refused")))
    slow = FakeProvider(name="local", script=reply_by_step({
        "classify": FakeReply("sizing", ttft_s=0.2),
        "validate": FakeReply('{"ok": true, "reason": "x"}', ttft_s=0.2),
    }))  # fmt: skip
    async with Chain(cfg, store=store, providers={"local": slow, "backup": down}) as chain:
        classify = chain.steps["classify"].call.hedger.breakers  # type: ignore[attr-defined]
        validate = chain.steps["validate"].call.hedger.breakers  # type: ignore[attr-defined]
        critique = chain.steps["critique"].call.hedger.breakers  # type: ignore[attr-defined]
        assert (classify.failures, classify.cooldown_s) == (1, 600.0)
        assert validate is critique and validate is not classify
        assert validate.failures == BreakerRegistry().failures
        done = await chain.run_turn("hello")
    copies = {c.step for c in store.calls(done.run_id) if c.target == "backup"}
    assert {"classify", "validate"} <= copies  # both sent a copy that failed
    # ... and the failed copy did not cancel the healthy primary (another target)
    assert done.label == "sizing" and done.verdicts["validate"]["ok"] is True
    # one failed copy opens the backup for classify (failures = 1), not for the others
    assert classify.get("backup").state == "open"
    assert validate.get("backup").state == "closed"
