"""Idempotency keys at the front desk (chainrun.desk.keys), as the IETF draft and Stripe
have them, and the tools' keys unique across logs.

Each test names the fault it was written for (main b3856ca): a failed or stopped turn
replayed forever under its key; a keyed request refused before its turn made its retry
wait 120 s for a 409; a keyed turn whose process was killed on a SQLite log did the
same; two callers with a constant key shared a turn; two logs handed a shop's tool the
same key for two different turns.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_confirm_actions import cart_fake, confirm_config, turn
from test_tool_steps import RUNS, cart_call, rounds_script, tool_config

from chainrun.chain import Chain
from chainrun.errors import ProviderUnavailable, UserInputError
from chainrun.events import StepStarted, TurnFinished
from chainrun.identity import Identity
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply


@pytest.fixture(autouse=True)
def _fresh_runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


#: how long a retry may take here (the wait it used to make was 120 s)
QUICK_S = 10.0


async def finished(chain: Chain, message: str, **kw: Any) -> TurnFinished:
    """The turn's TurnFinished, also when the chain raises after it (a provider down)."""
    done = None
    try:
        async for ev in chain.stream_turn(message, **kw):
            if isinstance(ev, TurnFinished):
                done = ev
    except ProviderUnavailable:
        pass
    assert done is not None
    return done


async def test_a_turn_that_failed_before_acting_does_not_pin_its_key(tmp_path: Path) -> None:
    """The model server is down for the first request (ProviderUnavailable: the turn ends
    ``error``, nothing acted): the retry with the same key runs the turn and answers. It
    used to get the failed turn again, forever."""
    fake = FakeProvider(name="local", script=lambda req: FakeReply(
        error=ProviderUnavailable("the model server answered 503")))  # fmt: skip
    store = Store.open(tmp_path / "log.db")
    async with Chain(tool_config(), store=store, providers={"local": fake}, quiet=True) as chain:
        failed = await finished(chain, "hello", conversation_id="c1", idempotency_key="k-1")
        fake.script = rounds_script(FakeReply("Hello! How can I help?", gap_s=0.001))
        retried = await asyncio.wait_for(finished(chain, "hello", conversation_id="c1",
                                                  idempotency_key="k-1"), QUICK_S)  # fmt: skip
        again = await finished(chain, "hello", conversation_id="c1", idempotency_key="k-1")
    store.close()
    assert failed.status == "error" and not failed.repeated
    assert retried.status == "ok" and not retried.repeated
    assert retried.output == "Hello! How can I help?"
    # once a turn answered, the key is pinned: its retry is that turn
    assert again.repeated and again.turn_id == retried.turn_id


async def test_a_turn_stopped_before_acting_does_not_pin_its_key(tmp_path: Path) -> None:
    """The caller stops a keyed turn while its model call runs (the turn ends
    ``cancelled``, nothing acted): the retry with the same key runs the turn and
    answers. It used to get the stopped turn again, forever."""
    fake = FakeProvider(name="local", script=lambda req: FakeReply("late", ttft_s=600))
    store = Store.open(tmp_path / "log.db")
    async with Chain(tool_config(), store=store, providers={"local": fake}, quiet=True) as chain:
        events = chain.stream_turn("hello", conversation_id="c1", idempotency_key="k-5")
        async for ev in events:  # the key is taken, the turn runs
            if isinstance(ev, StepStarted):
                break
        await events.aclose()  # the caller stops it
        fake.script = rounds_script(FakeReply("Hello! How can I help?", gap_s=0.001))
        retried = await asyncio.wait_for(finished(chain, "hello", conversation_id="c1",
                                                  idempotency_key="k-5"), QUICK_S)  # fmt: skip
    with Store.open(tmp_path / "log.db", create=False) as log:
        statuses = [r["status"] for r in log.log.query("select status from turns order by id")]
    store.close()
    assert statuses[0] == "cancelled"
    assert retried.status == "ok" and not retried.repeated
    assert retried.output == "Hello! How can I help?"


async def test_a_keyed_request_refused_before_its_turn_releases_its_key(tmp_path: Path) -> None:
    """A confirm of an unknown action id is refused (400) before the turn runs: its key is
    given up, so the retry is refused the same way at once, and the right request with
    the key runs. It used to wait 120 s and get 409 (the key claimed, never released)."""
    store = Store.open(tmp_path / "log.db")
    async with Chain(confirm_config(), store=store, providers={"local": cart_fake()},
                     quiet=True) as chain:  # fmt: skip
        asked, _ = await turn(chain, "put 2 of JKT-12 in my cart", conversation_id="c1")
        (action,) = asked.pending_actions
        for _ in range(2):
            with pytest.raises(UserInputError, match="no action 'nosuch'"):
                await asyncio.wait_for(turn(chain, "yes", conversation_id="c1",
                                            confirm="nosuch", idempotency_key="k-2"),
                                       QUICK_S)  # fmt: skip
        done = await asyncio.wait_for(turn(chain, "yes", conversation_id="c1",
                                           confirm=action.id, idempotency_key="k-3"), QUICK_S)
    store.close()
    assert done[0].status == "ok" and len(RUNS) == 1


_KILLED = textwrap.dedent('''
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from test_tool_steps import tool_config
    from chainrun.chain import Chain
    from chainrun.log.store import Store
    from chainrun.providers.fake import FakeProvider, FakeReply

    async def main():
        fake = FakeProvider(name="local", script=lambda req: FakeReply("late", ttft_s=600))
        async with Chain(tool_config(), store=Store.open({db!r}), providers={{"local": fake}},
                         quiet=True) as chain:
            async for ev in chain.stream_turn("hello", conversation_id="c1",
                                              idempotency_key="k-4"):
                print(type(ev).__name__, flush=True)

    asyncio.run(main())
''')


def _killed_while_keyed(db: Path) -> None:
    """Run :data:`_KILLED` on ``db`` and SIGKILL it once its keyed turn runs."""
    script = _KILLED.format(tests=str(Path(__file__).parent), db=str(db))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[1])  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "StepStarted"  # the key is taken, the turn runs
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def test_a_keyed_turn_whose_process_was_killed_is_lost_on_sqlite(tmp_path: Path) -> None:
    """A process on a SQLite log takes a key and is killed (SIGKILL) while its turn runs:
    the log's next open logs that turn ``lost`` from the key's claim, and the retry gets it
    at once. It used to wait 120 s for a 409 (and serve's parent said no turn was lost)."""
    db = tmp_path / "log.db"
    _killed_while_keyed(db)
    fake = FakeProvider(name="local", script=rounds_script(FakeReply("hi", gap_s=0.001)))
    store = Store.open(db)  # marks the killed run interrupted, its keyed turn lost
    async with Chain(tool_config(), store=store, providers={"local": fake}, quiet=True) as chain:
        retried = await asyncio.wait_for(finished(chain, "hello", conversation_id="c1",
                                                  idempotency_key="k-4"), QUICK_S)  # fmt: skip
    store.close()
    assert retried.repeated and retried.status == "lost"
    with Store.open(db, create=False) as log:
        logged = log.turn(retried.turn_id or 0)
    assert logged is not None
    lost = logged.turn
    assert lost.status == "lost" and lost.input == "hello" and lost.conversation_id == "c1"
    assert lost.error_type == "process_ended" and lost.id == retried.turn_id


async def test_two_callers_with_a_constant_key_never_share_a_turn(tmp_path: Path) -> None:
    """Two shoppers whose clients send the same key (``1``) with the same message and no
    conversation: each gets a turn of their own. Bob used to get Ann's turn, her answer."""
    fake = FakeProvider(name="local", script=lambda req: FakeReply(
        f"answer {len(fake.requests)}", gap_s=0.001))  # fmt: skip
    store = Store.open(tmp_path / "log.db")
    async with Chain(tool_config(), store=store, providers={"local": fake}, quiet=True) as chain:
        ann = await finished(chain, "where is my order?", idempotency_key="1",
                             user=Identity("u-ann"))  # fmt: skip
        bob = await finished(chain, "where is my order?", idempotency_key="1",
                             user=Identity("u-bob"))  # fmt: skip
        ann_again = await finished(chain, "where is my order?", idempotency_key="1",
                                   user=Identity("u-ann"))  # fmt: skip
    store.close()
    assert not bob.repeated and bob.turn_id != ann.turn_id
    assert bob.conversation_id != ann.conversation_id
    assert ann_again.repeated and ann_again.turn_id == ann.turn_id  # her own retry: hers


async def test_the_tools_keys_do_not_repeat_across_logs(tmp_path: Path) -> None:
    """Two serve processes on their own SQLite files (or a log made again after a
    redeploy) each run a turn that adds to the shop's cart: the cart service gets two
    different keys. Both used to be ``1:answer:1:0``, and the second add was dropped as a
    repeat of the first."""
    for name in ("a.db", "b.db"):
        fake = FakeProvider(name="local", script=rounds_script(
            cart_call({"sku": "JKT-12", "qty": 1}), FakeReply("Added.", gap_s=0.001)))
        store = Store.open(tmp_path / name)
        async with Chain(tool_config(), store=store, providers={"local": fake},
                         quiet=True) as chain:  # fmt: skip
            done = await finished(chain, "one JKT-12 please")
        store.close()
        assert done.turn_id == 1 and done.status == "ok"
    assert len(RUNS) == 2 and RUNS[0]["key"] != RUNS[1]["key"]
    assert all(r["key"].endswith(":answer:1:0") for r in RUNS)
