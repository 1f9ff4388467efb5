"""A conversation on a PostgreSQL log two processes share, while the database's connection
goes away for a moment (a pooler's restart: every connection closed, new ones refused for
1.5 s; here a TCP relay in front of the test server, cut and opened again).

A turn that starts then on the process that did not answer the earlier turns waits the
outage out (``[log] outage_wait_s``): its index is the next one and its history complete.
It went on from that process's memory at once before (index 1, no history) whenever the
log's writer had counted the outage. An outage longer than the wait still lets the turn
go on from memory, said in one line. Needs ``CHAINRUN_TEST_POSTGRES``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from log_backends import BACKENDS, log_target, need_pg, pg_schema
from tcp_relay import Relay

from chainrun.conversations.history import HistorySettings
from chainrun.conversations.memory import TurnStart
from chainrun.conversations.source import ConversationSource, log_claim, log_loader
from chainrun.log.migrations import utc_now
from chainrun.log.rows import TurnLog, TurnRow
from chainrun.log.store import Store

CUT_S = 1.5


@contextmanager
def relayed_log() -> Iterator[tuple[str, Relay]]:
    """A new schema on the test server, and its URL through a relay of its own."""
    with pg_schema(need_pg()) as url:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        relay = Relay(parts.hostname, parts.port)
        user = f"{parts.username}@" if parts.username else ""
        with relay:
            yield urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{relay.port}")), relay


class Process:
    """What one ``serve`` worker holds of the log: its store, live run and conversations
    (the chain's pieces: the log's loader and counter, as ``Chain`` opens them)."""

    def __init__(self, store: Store, run_id: int, outage_wait_s: float) -> None:
        self.store, self.run_id = store, run_id
        self.source = ConversationSource(HistorySettings())
        claim = log_claim(store, outage_wait_s=outage_wait_s)
        assert claim is not None
        self.source.use_log(log_loader(store, timeout_s=10.0, outage_wait_s=outage_wait_s),
                            claim)  # fmt: skip

    async def turn(self, conversation_id: str, message: str) -> tuple[int, list[str]]:
        """A turn answered and logged: its index and the messages of its history."""
        start = TurnStart(self.run_id, message, utc_now())
        place = await self.source.begin(conversation_id, start=start)
        answer = f"answer to {message}"
        await self.store.alog_turn(self.run_id, TurnLog(
            TurnRow(input=message, output=answer, conversation_id=conversation_id,
                    turn_index=place.turn_index, started_at=utc_now()), [], []))  # fmt: skip
        self.source.end(place, message, answer)
        return place.turn_index, [t.message for t in place.history.turns]


@asynccontextmanager
async def process(url: str, outage_wait_s: float = 5.0) -> AsyncIterator[Process]:
    with Store.open(url) as store:
        yield Process(store, await store.acreate_run("live", "{}"), outage_wait_s)


async def writer_in_outage(p: Process) -> None:
    """``p`` logs the rows of a turn it answered just before the cut (the writer of a
    busy process always has some): its writer meets the cut and counts the outage."""
    row = TurnRow(input="just before", output="an answer", conversation_id="another",
                  turn_index=1, started_at=utc_now())  # fmt: skip
    await p.store.alog_turn(p.run_id, TurnLog(row, [], []))
    assert p.store.writer is not None
    for _ in range(200):
        if p.store.writer.outage_since is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the writer did not see the database go away")


async def test_a_turn_that_starts_during_a_short_outage_waits_it_out() -> None:
    with relayed_log() as (url, relay):
        async with process(url) as a, process(url) as b:
            assert [await a.turn("conv", f"message {k}") for k in (1, 2)] == [
                (1, []), (2, ["message 1"])]  # fmt: skip
            await a.store.flush()
            relay.cut()
            asyncio.get_running_loop().call_later(CUT_S, relay.open)
            await writer_in_outage(b)
            third = await b.turn("conv", "message 3")  # b has never seen "conv"
            assert relay.relayed > 0
            fourth = await a.turn("conv", "message 4")  # and back to the first process
            await a.store.flush()
            await b.store.flush()
            logged = sorted((t.turn_index, t.input) for t in a.store.turns(
                [a.run_id, b.run_id]) if t.conversation_id == "conv")  # fmt: skip
    assert third == (3, ["message 1", "message 2"])
    assert fourth == (4, ["message 1", "message 2", "message 3"])
    assert logged == [(k, f"message {k}") for k in (1, 2, 3, 4)]


async def test_the_writers_back_line_counts_the_outage_from_its_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The writer has nothing to write while the log is away (the process's turn waits
    the outage out at its claim): it meets its broken connection only once the server
    is back, and its line said ``the database is back after 0.1 s`` of a 1.5 s outage.
    The claim's failures mark the outage's start, so the line says its length."""
    caplog.set_level(logging.WARNING, logger="chainrun.log.writer")
    with relayed_log() as (url, relay):
        async with process(url) as a:
            await a.turn("conv", "message 1")
            await a.store.flush()
            relay.cut()
            loop = asyncio.get_running_loop()
            cut_at = loop.time()
            loop.call_later(CUT_S, relay.open)
            assert await a.turn("conv", "message 2") == (2, ["message 1"])  # waited it out
            await a.store.flush()
            whole = loop.time() - cut_at
    (back,) = [r.getMessage() for r in caplog.records if "is back after" in r.getMessage()]
    outage_s = float(back.split("is back after ")[1].split(" s")[0])
    assert CUT_S - 0.3 <= outage_s <= whole + 0.1, back


async def test_an_outage_longer_than_the_wait_goes_on_from_memory_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="chainrun.conversations")
    with relayed_log() as (url, relay):
        async with process(url) as a, process(url, outage_wait_s=0.5) as b:
            await a.turn("conv", "message 1")
            await a.store.flush()
            relay.cut()
            await writer_in_outage(b)
            third = await b.turn("conv", "message 2")
            still_cut = relay._listener is None  # it went on while the log was away
            relay.open()
            await b.store.flush()
    assert still_cut and third == (1, [])  # from b's memory, which never saw "conv"
    said = [r.getMessage() for r in caplog.records]
    claims = [m for m in said if "conversation conv took its turn index from this "
              "process's memory" in m]  # fmt: skip
    assert len(claims) == 1 and "has not answered the log's writer" in claims[0], said


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_claim_tried_again_with_its_token_gets_its_own_index(
    tmp_path: Path, backend: str
) -> None:
    """A try whose commit reached the database but whose answer was lost, tried again
    with the same token, gets the index it took; another claim takes the next one."""
    with log_target(backend, tmp_path) as target, Store.open(target) as s:
        got = [s.claim_turn_index("c", token=t) for t in ("t1", "t1", "t2", None, None)]
        assert got == [1, 1, 2, 3, 4]
