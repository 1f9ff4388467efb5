"""A shared log's claim and history read wait out a pool with no connection to give (a
pooler restarting) within their bound, and an outage of the log (the writer retrying, or
the attempt's own connection failing) until it has lasted ``outage_wait_s``; on the
virtual-time loop."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from psycopg_pool import PoolTimeout
from virtual_time import run_virtual, vloop

from chainrun.conversations.source import OUTAGE_POLL_S, POOL_RETRY_S, LogOutage, pool_patient


def _store(outage: float | None = None) -> Any:
    return SimpleNamespace(writer=SimpleNamespace(outage_since=outage,
                                                  note_unreachable=lambda at: None))


def test_a_pool_with_no_connection_is_tried_again_within_the_bound() -> None:
    async def main() -> tuple[str, int, float]:
        tries = 0

        async def attempt(left: float) -> str:
            nonlocal tries
            tries += 1
            if tries < 3:
                raise PoolTimeout("couldn't get a connection after 2.00 sec")
            return "claimed"

        got = await pool_patient(_store(), 10.0, attempt)
        return got, tries, vloop().time()

    got, tries, now = run_virtual(main)
    assert (got, tries) == ("claimed", 3)
    assert now == pytest.approx(2 * POOL_RETRY_S)


def test_without_an_outage_wait_a_database_down_or_another_error_is_not_waited_for() -> None:
    async def main() -> list[int]:
        counts = []
        for store, error, raised in (
            (_store(outage=time.monotonic()), PoolTimeout("no connection"), LogOutage),
            (_store(), ConnectionError("refused"), ConnectionError),
            (_store(), ValueError("a bug"), ValueError),
        ):  # fmt: skip
            tries = 0

            async def attempt(left: float, error: Exception = error) -> str:
                nonlocal tries
                tries += 1
                raise error

            with pytest.raises(raised):
                await pool_patient(store, 10.0, attempt, down=(ConnectionError,))
            counts.append(tries)
        return counts

    # the writer's outage: no attempt at all; a connection refused: one
    assert run_virtual(main) == [0, 1, 1]


def test_a_short_outage_of_the_writer_is_waited_out_before_the_first_attempt() -> None:
    """The writer is in an outage when the claim starts (a pooler restarting) and is back
    1.5 s later: no attempt while it lasts (each would hold a thread for the pool's
    wait), one as soon as the writer is back."""

    async def main() -> tuple[str, list[float]]:
        store = _store(outage=time.monotonic())
        vloop().call_later(1.5, setattr, store.writer, "outage_since", None)
        at: list[float] = []

        async def attempt(left: float) -> str:
            at.append(vloop().time())
            return "claimed"

        return await pool_patient(store, 10.0, attempt, outage_wait_s=5.0), at

    got, at = run_virtual(main)
    assert got == "claimed" and len(at) == 1
    assert 1.5 <= at[0] <= 1.5 + OUTAGE_POLL_S + 1e-9


def test_an_outage_is_waited_out_until_it_has_lasted_the_bound_not_longer() -> None:
    """An outage the writer has been in for 3 s: a call that starts now waits 2 s more
    (5 s from the outage's start), then gives up without an attempt; a second call
    during the same outage gives up at once."""

    async def main() -> tuple[float, float, int]:
        store = _store(outage=time.monotonic() - 3.0)
        tries = 0

        async def attempt(left: float) -> str:
            nonlocal tries
            tries += 1
            return "claimed"

        with pytest.raises(LogOutage, match="has not answered the log's writer"):
            await pool_patient(store, 10.0, attempt, outage_wait_s=5.0)
        first = vloop().time()
        store.writer.outage_since -= first  # the outage's clock went on meanwhile
        with pytest.raises(LogOutage):
            await pool_patient(store, 10.0, attempt, outage_wait_s=5.0)
        return first, vloop().time() - first, tries

    first, second, tries = run_virtual(main)
    assert first == pytest.approx(2.0, abs=0.01) and second == 0.0 and tries == 0


def test_a_connection_that_fails_is_tried_again_for_the_bound() -> None:
    """The writer has seen nothing (it was idle), the attempt's own connection fails:
    tried again every POOL_RETRY_S, and kept if the database answers within the bound;
    given up (the last error raised) once it has failed for the bound."""

    async def main() -> tuple[str, int, int, float]:
        store = _store()
        tries = 0

        async def back_after_a_second(left: float) -> str:
            nonlocal tries
            tries += 1
            if vloop().time() < 1.0:
                raise ConnectionError("server closed the connection unexpectedly")
            return "claimed"

        got = await pool_patient(store, 10.0, back_after_a_second, outage_wait_s=5.0,
                                 down=(ConnectionError,))  # fmt: skip
        recovered, tries = tries, 0
        start = vloop().time()

        async def never(left: float) -> str:
            nonlocal tries
            tries += 1
            raise ConnectionError("connection refused")

        with pytest.raises(ConnectionError, match="refused"):
            await pool_patient(store, 10.0, never, outage_wait_s=5.0, down=(ConnectionError,))
        return got, recovered, tries, vloop().time() - start

    got, recovered, tries, waited = run_virtual(main)
    assert got == "claimed" and recovered == 6  # at 0, 0.2, ..., 1.0
    assert 4.8 <= waited <= 5.0 and tries == int(5.0 / POOL_RETRY_S)


def test_an_outage_the_writer_notices_during_the_attempts_is_waited_out() -> None:
    """The attempt fails on the connection, and the writer says the outage began: the
    call waits for the writer to be back, then tries again."""

    async def main() -> tuple[str, list[float]]:
        store = _store()
        at: list[float] = []

        async def attempt(left: float) -> str:
            at.append(vloop().time())
            if len(at) == 1:
                store.writer.outage_since = time.monotonic()
                asyncio.get_running_loop().call_later(2.0, setattr, store.writer,
                                                      "outage_since", None)  # fmt: skip
                raise ConnectionError("server closed the connection unexpectedly")
            return "claimed"

        return await pool_patient(store, 10.0, attempt, outage_wait_s=5.0,
                                  down=(ConnectionError,)), at  # fmt: skip

    got, at = run_virtual(main)
    assert got == "claimed" and len(at) == 2 and 2.0 <= at[1] <= 2.0 + OUTAGE_POLL_S + 1e-9
