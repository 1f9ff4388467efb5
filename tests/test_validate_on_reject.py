"""The validate verdict acts: on_reject = flag | refuse | replace, with the streamed
answer held back until the verdict when it can be refused or replaced."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import reply_by_step

from chainrun.analysis.summary import latency_summary
from chainrun.chain import REFUSAL, Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.events import TokenDelta
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply

REJECT = FakeReply('{"ok": false, "reason": "invents a discount"}', ttft_s=0.01)
SAFE = "Please ask our staff about current offers."


async def run(on_reject: str, **extra: str) -> tuple[object, list[str]]:
    cfg = config_from_dict({"steps": {"validate": {"on_reject": on_reject, **extra}}})
    fake = FakeProvider(name="local", script=reply_by_step({"validate": REJECT}))
    shown: list[str] = []
    done = None
    async with Chain(cfg, providers={"local": fake}) as chain:
        async for ev in chain.stream_turn("a rain jacket under 100?"):
            if isinstance(ev, TokenDelta):
                shown.append(ev.text)
            done = ev
    return done, shown


async def test_flag_only_records_the_verdict() -> None:
    done, shown = await run("flag")
    assert done.status == "ok" and shown and "".join(shown) == done.output  # type: ignore[attr-defined]
    assert done.verdicts["validate"]["ok"] is False  # type: ignore[attr-defined]


@pytest.mark.parametrize(("on_reject", "output"), [("refuse", REFUSAL), ("replace", SAFE)])
async def test_refuse_and_replace_hold_the_answer_until_the_verdict(
    on_reject: str, output: str
) -> None:
    extra = {"reject_text": SAFE} if on_reject == "replace" else {}
    done, shown = await run(on_reject, **extra)
    assert done.output == output  # type: ignore[attr-defined]
    # a replaced answer says so (not "refused"): in the event and in the log
    assert done.status == {"refuse": "refused", "replace": "replaced"}[on_reject]  # type: ignore[attr-defined]
    assert shown == []  # the rejected answer never reached the user
    assert done.verdicts["validate"]["reason"] == "invents a discount"  # type: ignore[attr-defined]


async def test_an_accepted_answer_is_released_after_the_verdict() -> None:
    cfg = config_from_dict({"steps": {"validate": {"on_reject": "refuse"}}})
    fake = FakeProvider(name="local", script=reply_by_step())
    shown: list[str] = []
    async with Chain(cfg, providers={"local": fake}) as chain:
        async for ev in chain.stream_turn("a rain jacket under 100?"):
            if isinstance(ev, TokenDelta):
                shown.append(ev.text)
            done = ev
    assert done.status == "ok" and "".join(shown) == done.output  # type: ignore[attr-defined]


def test_replace_needs_its_text() -> None:
    with pytest.raises(ConfigError, match=r"steps\.validate.*reject_text"):
        config_from_dict({"steps": {"validate": {"on_reject": "replace"}}})


async def _log_one_turn(db: Path) -> int | None:
    critique = FakeReply("Mention that the \x1b[31mStorm Shell is waterproof.", ttft_s=0.002)
    fake = FakeProvider(name="local", script=reply_by_step({"critique": critique}))
    with Store.open(db) as store:
        async with Chain(config_from_dict({}), store=store, providers={"local": fake}) as chain:
            await chain.run_turn("a rain jacket under 100?")
            return chain.run_id


def test_show_prints_each_turns_critique_text_and_verdicts(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    run_id = asyncio.run(_log_one_turn(db))
    with Store.open(db) as store:  # stored per turn: the step's output and the verdict
        turn = store.turns(run_id or 0)[0]
        critique_row = next(s for s in store.steps(run_id or 0) if s.step == "critique")
    assert turn.verdicts["critique"] == {"text": critique_row.output}
    proc = subprocess.run(
        [sys.executable, "-m", "chainrun", "show", str(run_id), "--db", str(db)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # a critique is text, no pass or fail: marked "·" (a tick is for a verdict that passed)
    assert "  · critique: Mention that the \\x1b[31mStorm Shell is waterproof." in lines
    assert '  ✓ validate: ok=true, reason="fine"' in lines


async def run_verdict(step: dict[str, Any], reply: FakeReply) -> tuple[Any, Any]:
    cfg = config_from_dict({"steps": {"validate": step}})
    fake = FakeProvider(name="local", script=reply_by_step({"validate": reply}))
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"local": fake}) as chain:
            done = await chain.run_turn("a rain jacket under 100?")
        turn = store.turns(done.run_id or 0)[0]
        row = next(s for s in store.steps(done.run_id or 0) if s.step == "validate")
    assert turn.status == done.status and turn.verdicts == done.verdicts
    return done, row


async def test_a_replaced_turn_is_logged_replaced_and_counted_apart() -> None:
    cfg = config_from_dict({"steps": {"validate": {"on_reject": "replace", "reject_text": SAFE}}})
    fake = FakeProvider(name="local", script=reply_by_step({"validate": REJECT}))
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store, providers={"local": fake}) as chain:
            done = await chain.run_turn("a rain jacket under 100?")
        assert store.turns(done.run_id or 0)[0].status == "replaced"
        counts = latency_summary(store, done.run_id or 0)["turns"]
    assert counts["n_replaced"] == 1 and counts["n_refused"] == 0 and counts["n_completed"] == 0


@pytest.mark.parametrize("on_failure", ["open", "closed"])
async def test_a_verdict_breaking_the_configured_schema_is_missing_not_ok(on_failure: str) -> None:
    # jsonschema against the default validate schema: "ok" must be a boolean
    bad = FakeReply('{"ok": "sure", "reason": "fine"}', ttft_s=0.002)
    done, row = await run_verdict({"on_reject": "refuse", "on_failure": on_failure}, bad)
    verdict = done.verdicts["validate"]
    assert verdict["ok"] is None and verdict["missing"] == "unparseable"
    assert "breaks its JSON Schema" in verdict["problem"] and "ok" in verdict["problem"]
    assert row.error_type == "invalid_answer" and row.status == f"failed_{on_failure}"
    assert done.status == {"open": "ok", "closed": "refused"}[on_failure]


async def test_a_configured_schema_is_the_one_checked() -> None:
    schema = {"type": "object", "required": ["ok", "score"],
              "properties": {"ok": {"type": "boolean"}, "score": {"type": "integer"}}}  # fmt: skip
    step = {"on_reject": "refuse", "json_schema": schema, "on_failure": "closed"}
    done, _ = await run_verdict(step, FakeReply('{"ok": false, "score": 2}'))
    assert done.status == "refused" and done.verdicts["validate"] == {"ok": False, "score": 2}
    done, _ = await run_verdict(step, FakeReply('{"ok": true, "reason": "fine"}'))
    assert done.verdicts["validate"]["missing"] == "unparseable"  # no score: breaks it
    assert "score" in done.verdicts["validate"]["problem"]


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("Looks fine to me.", "not a JSON object"),
        ('{"ok": false}', "reason"),  # {"ok": bool, "reason": str} without a json_schema
    ],
)
async def test_without_a_schema_a_validating_step_needs_ok_and_reason(
    reply: str, problem: str
) -> None:
    step = {"on_reject": "refuse", "json_schema": None, "on_failure": "closed"}
    done, _ = await run_verdict(step, FakeReply(reply))
    verdict = done.verdicts["validate"]
    assert verdict["missing"] == "unparseable" and problem in verdict["problem"]
    assert done.status == "refused"  # by on_failure = "closed", not by a verdict


async def test_a_schema_without_ok_leaves_nothing_to_act_on() -> None:
    schema = {"type": "object", "properties": {"score": {"type": "integer"}}}
    step = {"on_reject": "replace", "reject_text": SAFE, "json_schema": schema}
    done, _ = await run_verdict(step, FakeReply('{"score": 1}'))
    assert done.verdicts["validate"]["problem"].endswith("no boolean 'ok' to act on")
    assert done.status == "ok"  # validate fails open by default: logged, not silently ok


async def test_a_timed_out_verdict_is_missing_with_reason_timeout() -> None:
    step = {"on_reject": "refuse", "deadline_s": 0.05}
    done, row = await run_verdict(step, FakeReply('{"ok": true, "reason": "x"}', ttft_s=1.0))
    assert done.verdicts["validate"]["missing"] == "timeout" and row.status == "failed_open"


def test_a_users_json_schema_replaces_the_default_whole() -> None:
    schema = {"type": "object", "properties": {"score": {"type": "integer"}}}
    cfg = config_from_dict({"steps": {"validate": {"json_schema": schema}}})
    assert cfg.steps["validate"].json_schema == schema  # not merged with ok/reason
