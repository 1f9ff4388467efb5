"""The validate verdict acts: on_reject = flag | refuse | replace, with the streamed
answer held back until the verdict when it can be refused or replaced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import reply_by_step

from chainrun.chain import REFUSAL, Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.events import TokenDelta
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.store import Store

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


async def test_show_prints_each_turns_critique_text_and_verdicts(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    critique = FakeReply("Mention that the \x1b[31mStorm Shell is waterproof.", ttft_s=0.002)
    fake = FakeProvider(name="local", script=reply_by_step({"critique": critique}))
    with Store.open(db) as store:
        async with Chain(config_from_dict({}), store=store, providers={"local": fake}) as chain:
            await chain.run_turn("a rain jacket under 100?")
            run_id = chain.run_id
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
    assert "  ✓ critique: Mention that the \\x1b[31mStorm Shell is waterproof." in lines
    assert '  ✓ validate: ok=true, reason="fine"' in lines
