"""On the real local model: ``chainrun local replicas`` starts R llama-servers of the
embedded model that are not the install's server, a replica pool over them keeps a
conversation on one replica (its second turn finds its first prompt cached there), and
stopping them stops those processes only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chainrun import Chain
from chainrun.config import config_from_dict
from chainrun.log.store import Store
from chainrun.providers.replicas import ReplicaPool
from chainrun.runtime import local_model, local_replicas
from chainrun.runtime.processes import pid_exists

pytestmark = pytest.mark.local_model


@pytest.fixture
def replicas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    monkeypatch.setenv("CHAINRUN_HOME", str(tmp_path / "home"))
    started = local_replicas.start(2, slots=2, context=4096)
    try:
        yield started
    finally:
        local_replicas.stop(started)


def test_replicas_are_not_the_installs_server_and_stop_by_their_pids(
    replicas: list[local_replicas.Replica],
) -> None:
    assert len({r.port for r in replicas}) == 2
    assert all(local_model.healthy(r.port) for r in replicas)
    assert local_model.status() is None  # not this install's local model server
    assert [r.pid for r in local_replicas.running()] == [r.pid for r in replicas]
    stopped = local_replicas.stop()
    assert {r.pid for r in stopped} == {r.pid for r in replicas}
    assert not any(pid_exists(r.pid) and local_replicas._is_replica(r.pid) for r in replicas)
    assert local_replicas.running() == []


def test_a_conversations_second_turn_finds_its_prompt_on_its_replica(
    replicas: list[local_replicas.Replica], tmp_path: Path
) -> None:
    cfg = config_from_dict({
        "order": ["compose"], "answer_step": "compose",
        "providers": {"local": {"replicas": [r.base_url for r in replicas],
                                "prompt_cache": "slot", "sampling_fields": True}},
        "steps": {"compose": {"provider": "local", "max_output_tokens": 16,
                              "prompt": "{history}Shopper: {message}\nStylist:"}},
    })  # fmt: skip

    async def go(store: Store) -> tuple[ReplicaPool, list[str]]:
        async with Chain(cfg, quiet=True, store=store) as chain:
            pool = chain._providers["local"]
            assert isinstance(pool, ReplicaPool)
            for message in ("Do you have rain jackets for hiking in the mountains?",
                            "Which of those is the cheapest one?"):  # fmt: skip
                done = await chain.run_turn(message, conversation_id="conv-r")
                assert done.status == "ok", done
            await chain.flush()
            return pool, [r.server_address or "" for r in pool.replicas]

    with Store.open(str(tmp_path / "log.db")) as store:
        pool, addresses = asyncio.run(go(store))
        rows = store.log.query("select server_address, input_tokens, cached_input_tokens "
                               "from calls where step = 'compose' order by id")  # fmt: skip
    home = addresses[pool.ranking("conv-r")[0]]
    assert [r["server_address"] for r in rows] == [home, home]
    second = rows[1]
    assert second["cached_input_tokens"] and second["cached_input_tokens"] >= (
        0.5 * second["input_tokens"]), rows
