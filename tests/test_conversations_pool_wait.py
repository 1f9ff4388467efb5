"""A shared log's claim and history read wait out a pool with no connection to give (a
pooler restarting), not a database the writer says is down; on the virtual-time loop."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from psycopg_pool import PoolTimeout
from virtual_time import run_virtual, vloop

from chainrun.conversations.source import POOL_RETRY_S, pool_patient


def _store(outage: float | None = None) -> Any:
    return SimpleNamespace(writer=SimpleNamespace(outage_since=outage))


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


def test_a_database_down_or_another_error_is_not_waited_for() -> None:
    async def main() -> list[int]:
        counts = []
        for store, error in ((_store(outage=1.0), PoolTimeout("no connection")),
                             (_store(), ConnectionError("refused"))):  # fmt: skip
            tries = 0

            async def attempt(left: float, error: Exception = error) -> str:
                nonlocal tries
                tries += 1
                raise error

            with pytest.raises(type(error)):
                await pool_patient(store, 10.0, attempt)
            counts.append(tries)
        return counts

    assert run_virtual(main) == [1, 1]
