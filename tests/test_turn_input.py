"""The library's turn entry points: bad arguments are refused before anything runs (one
rule with ``chainrun serve``), a closed chain refuses turns, and a text UTF-8 cannot carry
(a lone surrogate) never loses a turn from the log."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.conversations.turn_input import MAX_MESSAGE_CHARS
from chainrun.errors import ChainClosed, UserInputError
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply


@pytest.fixture
def file_store(tmp_path: Path) -> Store:
    """A log file (its writes go through the writer thread, as in production)."""
    s = Store.open(tmp_path / "log.db")
    yield s
    s.close()


def n_turns(store: Store) -> int:
    return int(store.db.execute("select count(*) from turns").fetchone()[0])


@pytest.mark.parametrize(
    ("message", "kwargs", "expected"),
    [
        (None, {}, "message: expected a string, got NoneType"),
        (b"bytes", {}, "message: expected a string, got bytes"),
        ("", {}, "message: expected a non-empty string"),
        ("   \n", {}, "message: expected a non-empty string"),
        ("x" * (MAX_MESSAGE_CHARS + 1), {}, f"message: expected at most {MAX_MESSAGE_CHARS}"),
        ("a\ud800b", {}, "message: a lone UTF-16 surrogate (U+D800) at character 1"),
        ("a cut emoji \ud83d", {}, "message: a lone UTF-16 surrogate (U+D83D)"),
        ("ok", {"conversation_id": "c\udfff"}, "conversation_id: a lone UTF-16 surrogate"),
        ("ok", {"request_id": 7}, "request_id: expected a string, got int"),
    ],
)
async def test_bad_turn_input_is_refused_before_anything_runs(
    config: ChainConfig, file_store: Store, fake: FakeProvider, message: object,
    kwargs: dict[str, object], expected: str,
) -> None:  # fmt: skip
    async with Chain(config, store=file_store, providers={"local": fake}) as chain:
        with pytest.raises(UserInputError, match=re.escape(expected)):
            await chain.run_turn(message, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(UserInputError):
            async for _ in chain.stream_turn(message, **kwargs):  # type: ignore[arg-type]
                pass
        await chain.flush()  # nothing queued that could fail
        assert chain.run_id is None  # no run was even created
    assert fake.requests == [] and n_turns(file_store) == 0


async def test_the_longest_message_is_accepted(config: ChainConfig, fake: FakeProvider) -> None:
    async with Chain(config, providers={"local": fake}) as chain:
        done = await chain.run_turn("x" * (MAX_MESSAGE_CHARS - 3) + " \u00e9\U0001f600")
    assert done.status == "ok"


async def test_a_closed_chain_refuses_turns(
    config: ChainConfig, file_store: Store, fake: FakeProvider
) -> None:
    async with Chain(config, store=file_store, providers={"local": fake}) as chain:
        done = await chain.run_turn("hello")
    run = file_store.get_run(done.run_id)
    assert run.status == "complete"
    with pytest.raises(ChainClosed, match="the chain is closed"):
        await chain.run_turn("after close")
    with pytest.raises(ChainClosed):
        async for _ in chain.stream_turn("after close"):
            pass
    with pytest.raises(ChainClosed):
        await chain.ensure_run()
    with pytest.raises(ChainClosed):
        await chain.open()
    with pytest.raises(RuntimeError):  # ChainClosed is a RuntimeError too
        await chain.run_turn("after close")
    await chain.aclose()  # closing again does nothing
    await chain.flush()
    assert n_turns(file_store) == 1 and file_store.get_run(done.run_id).status == "complete"


async def test_a_model_streaming_a_lone_surrogate_is_logged(
    config: ChainConfig, file_store: Store
) -> None:
    """A provider can stream a ``"\\ud800"`` JSON escape: the turn is answered and logged
    (the surrogate stored as U+FFFD), and the commit of the other turns is not lost."""
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("half an emoji \ud83d here", ttft_s=0.001),
        "critique": FakeReply("odd \udc00 note", ttft_s=0.001),
    }))  # fmt: skip
    async with Chain(config, store=file_store, providers={"local": fake}) as chain:
        first = await chain.run_turn("hello")
        second = await chain.run_turn("again")
        await chain.flush()  # raised UnicodeEncodeError before the fix
    assert first.status == second.status == "ok"
    assert first.output == "half an emoji \ud83d here"  # the caller gets what the model sent
    turns = file_store.turns(first.run_id)
    assert [t.id for t in turns] == [first.turn_id, second.turn_id]
    assert turns[0].output == "half an emoji \ufffd here"
    logged = file_store.turn(first.turn_id)
    assert logged is not None
    assert [s.step for s in logged.steps] == [s.step for s in file_store.turn(second.turn_id).steps]
    assert len(logged.calls) == 3  # compose, validate, critique
    assert any("odd \ufffd note" == (s.output or "") for s in logged.steps)
    assert file_store.get_run(first.run_id).status == "complete"


def test_a_replay_file_breaking_the_message_rule_names_its_line(tmp_path: Path) -> None:
    """The replay loader applies the turn's rule up front (file and line named), rather
    than stopping the replay half way at that turn."""
    from chainrun.errors import InputFileError
    from chainrun.replay.run import load_requests

    p = tmp_path / "r.jsonl"
    p.write_text('{"id": "a", "message": "fine"}\n'
                 '{"id": "b", "message": "cut \\ud83d"}\n')  # fmt: skip
    with pytest.raises(InputFileError, match=r"r\.jsonl:2: field 'message': a lone UTF-16"):
        load_requests(p)
    p.write_text(json.dumps({"id": "c", "message": "x" * (MAX_MESSAGE_CHARS + 1)}) + "\n")
    with pytest.raises(InputFileError, match=r"r\.jsonl:1: field 'message': expected at most"):
        load_requests(p)
