"""Replicas of a model server behind one provider (chainrun.providers.replicas).

On the latency lab (real HTTP, the real ``openai`` client): three labs are three
replicas. Under ``affinity`` a conversation's calls stay on its home replica, the one
rendezvous hashing ranks first; under ``round_robin`` they do not; a hedge copy goes to
the next replica of the ranking; a replica stopped mid-conversation: its conversations
move once, to the next replica of their ranking, every turn is answered, and the move
is counted and in the call rows' ``server_address``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_runner import chainrun

from chainrun import Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.openai_client import server_address
from chainrun.providers.replicas import ReplicaPool, rendezvous_order

CONVERSATIONS = [f"conv-{i}" for i in range(6)]


@pytest.fixture
def labs() -> Iterator[list[LabServer]]:
    servers = [LabServer("fast", n_tokens=4, per_token_ms=1, record_bodies=True)
               for _ in range(3)]  # fmt: skip
    try:
        for s in servers:
            s.start()
        yield servers
    finally:
        for s in servers:
            s.stop()


def _config(labs: list[LabServer], policy: str = "affinity", **compose: Any) -> Any:
    return config_from_dict({
        "order": ["compose", "validate"], "answer_step": "compose",
        "providers": {"pool": {"replicas": [lab.base_url for lab in labs],
                               "replica_policy": policy}},
        "steps": {
            "compose": {"provider": "pool", "system": "You sell shoes.",
                        "prompt": "{history}Shopper: {message}\nStylist:", "stream": True,
                        **compose},
            "validate": {"provider": "pool", "prompt": "Check: {message} {answer}",
                         "on_failure": "open"},
        },
    })  # fmt: skip


def _message(cid: str, turn: int) -> str:
    return f"{cid} asks question {turn}?"


def _compose_replica(labs: list[LabServer], cid: str, turn: int,
                     stopped: dict[int, list[dict[str, Any]]] | None = None) -> list[int]:
    """The labs (by index) that got compose requests of ``cid``'s turn ``turn``
    (``stopped``: the requests of labs no longer running, by index)."""
    text = _message(cid, turn)
    seen = [(stopped or {}).get(i) or lab.requests() for i, lab in enumerate(labs)]
    return [i for i, requests in enumerate(seen) for r in requests
            if "Check:" not in str(r["messages"])
            and str(r["messages"][-1]["content"]).rsplit("Shopper: ", 1)[-1]
            .startswith(f"{text}\nStylist:")]


def _pool(chain: Chain) -> ReplicaPool:
    pool = chain._providers["pool"]
    assert isinstance(pool, ReplicaPool)
    return pool


async def _turns(chain: Chain, turns: list[int], cids: list[str] = CONVERSATIONS) -> None:
    for turn in turns:
        for cid in cids:
            done = await chain.run_turn(_message(cid, turn), conversation_id=cid)
            assert done.status == "ok", done


def test_rendezvous_order_is_stable_and_moves_only_the_removed_replicas_keys() -> None:
    names = [f"http://127.0.0.1:{8000 + i}/v1" for i in range(4)]
    homes = {k: rendezvous_order(k, names)[0] for k in (f"c{i}" for i in range(400))}
    assert homes == {k: rendezvous_order(k, names)[0] for k in homes}  # deterministic
    assert set(Counter(homes.values())) == {0, 1, 2, 3}
    assert min(Counter(homes.values()).values()) > 60  # spread: 100 each expected
    # without replica 2: only its keys move, each to its second choice
    rest = names[:2] + names[3:]
    for k, home in homes.items():
        new = names.index(rest[rendezvous_order(k, rest)[0]])
        if home != 2:
            assert new == home
        else:
            assert new == rendezvous_order(k, names)[1]


def test_affinity_keeps_each_conversation_on_its_home_replica(
    labs: list[LabServer], tmp_path: Path
) -> None:
    async def go(store: Store) -> int:
        async with Chain(_config(labs), quiet=True, store=store) as chain:
            await _turns(chain, [1, 2, 3])
            pool = _pool(chain)
            assert pool.moves == 0 and pool.failovers == 0
            for cid in CONVERSATIONS:
                home = pool.ranking(cid)[0]
                for turn in (1, 2, 3):
                    assert _compose_replica(labs, cid, turn) == [home], (cid, turn)
            await chain.flush()
            assert chain.run_id is not None
            return chain.run_id

    db = str(tmp_path / "log.db")
    with Store.open(db) as store:
        run_id = asyncio.run(go(store))
    # the six conversations are not all on one replica
    used = [lab for lab in labs if lab.requests()]
    assert len(used) >= 2
    # show's calls by server: a row per replica and step
    shown = chainrun("show", str(run_id), "--db", db)
    assert shown.returncode == 0, shown.output
    table = shown.output.split("calls by server")[1]
    for lab in used:
        assert server_address(lab.base_url) in table


@pytest.mark.parametrize("policy", ["round_robin", "random"])
def test_round_robin_and_random_spread_a_conversation_over_replicas(
    labs: list[LabServer], policy: str
) -> None:
    cids = CONVERSATIONS[:5]  # 10 calls a round: round-robin does not come back in step

    async def go() -> None:
        async with Chain(_config(labs, policy), quiet=True) as chain:
            await _turns(chain, [1, 2, 3], cids)

    asyncio.run(go())
    spread = [len({i for t in (1, 2, 3) for i in _compose_replica(labs, cid, t)})
              for cid in cids]  # fmt: skip
    assert max(spread) > 1, spread


def test_a_hedge_copy_goes_to_the_next_replica_of_the_ranking() -> None:
    with LabServer("lognormal", median_ms=300, sigma=0, n_tokens=4, per_token_ms=1,
                   record_bodies=True) as a, \
         LabServer("lognormal", median_ms=300, sigma=0, n_tokens=4, per_token_ms=1,
                   record_bodies=True) as b, \
         LabServer("lognormal", median_ms=300, sigma=0, n_tokens=4, per_token_ms=1,
                   record_bodies=True) as c:  # fmt: skip
        labs = [a, b, c]
        cfg = _config(labs, hedge={"delay_ms": 50, "max_attempts": 2})

        async def go() -> list[int]:
            async with Chain(cfg, quiet=True) as chain:
                done = await chain.run_turn(_message("conv-h", 1), conversation_id="conv-h")
                assert done.status == "ok"
                return _pool(chain).ranking("conv-h")

        ranking = asyncio.run(go())
        by_attempt = {r["attempt"]: i for i, lab in enumerate(labs) for r in lab.requests()
                      if "Check:" not in str(r["messages"])}  # fmt: skip
        assert by_attempt == {"1": ranking[0], "2": ranking[1]}


def test_a_stopped_replicas_conversations_move_once_and_every_turn_is_answered(
    labs: list[LabServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="chainrun.providers.replicas")
    stopped: dict[int, list[dict[str, Any]]] = {}
    addresses = [server_address(lab.base_url) for lab in labs]

    async def go(store: Store) -> tuple[dict[str, int], dict[str, int], int]:
        async with Chain(_config(labs), quiet=True, store=store) as chain:
            pool = _pool(chain)
            await _turns(chain, [1])
            home = {cid: pool.ranking(cid)[0] for cid in CONVERSATIONS}
            victim = Counter(home.values()).most_common(1)[0][0]
            stopped[victim] = labs[victim].requests()
            labs[victim].stop()  # mid-conversation: turn 1 was answered there
            await _turns(chain, [2, 3, 4])  # each asserted ok
            after = {cid: pool.ranking(cid)[1] if h == victim else h for cid, h in home.items()}
            await chain.flush()
            assert pool.moves == sum(1 for h in home.values() if h == victim)
            return home, after, victim

    with Store.open(str(tmp_path / "log.db")) as store:
        home, after, victim = asyncio.run(go(store))
        rows = store.log.query(
            "select c.server_address, t.conversation_id, t.turn_index, c.step"
            " from calls c join turns t on t.id = c.turn_id where c.step = 'compose'"
        )
    moved = [cid for cid, h in home.items() if h == victim]
    assert moved
    said = [r.getMessage() for r in caplog.records if "moved from replica" in r.getMessage()]
    # each moved conversation once, none of the others
    assert len(said) == len(moved), said
    assert all(any(cid in m for m in said) for cid in moved)
    for cid in CONVERSATIONS:
        for turn in (2, 3, 4):
            sent = _compose_replica(labs, cid, turn, stopped)
            assert sent == [after[cid]], (cid, turn, sent)
    # the log row of each compose call names the replica that answered it
    for row in rows:
        cid, turn = row["conversation_id"], row["turn_index"]
        expected = home[cid] if turn == 1 else after[cid]
        assert row["server_address"] == addresses[expected], row


def test_a_replica_pool_config_names_its_bad_field() -> None:
    with pytest.raises(ConfigError, match=r"replicas\[1\]"):
        config_from_dict({"providers": {"p": {"replicas": ["http://a:1/v1", "ftp://b"]}}})
    with pytest.raises(ConfigError, match="replicas and base_url"):
        config_from_dict({"providers": {"p": {"replicas": ["http://a:1/v1"],
                                              "base_url": "http://a:1/v1"}}})  # fmt: skip


def test_two_processes_slot_tables_give_a_new_conversation_the_same_slot() -> None:
    from chainrun.providers.affinity import SlotTable

    a, b = SlotTable(8), SlotTable(8)  # two serve workers, one replica
    cids = [f"conv-{i}" for i in range(5)]
    # (these five ids put different slots first: where two ids share a first slot, the
    # second takes its next choice, and the order of arrival decides which that is)
    names = [f"slot-{i}" for i in range(8)]
    assert len({rendezvous_order(c, names)[0] for c in cids}) == len(cids)
    slots_a = {}
    for cid in cids:
        slots_a[cid] = a.acquire(cid, owner=True)
        a.release(slots_a[cid])  # type: ignore[arg-type]
    # the other worker meets the same conversations (their next turns) in another order
    for cid in reversed(cids):
        s = b.acquire(cid, owner=True)
        b.release(s)  # type: ignore[arg-type]
        assert s == slots_a[cid], cid
    # and not every first conversation on slot 0
    assert len(set(slots_a.values())) == len(cids)


def test_serve_workers_send_a_conversation_to_the_same_replica(
    labs: list[LabServer], tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    import httpx
    from serve_helpers import kill_with_workers, workers_ready

    root = Path(__file__).resolve().parents[1]
    cfg = tmp_path / "chainrun.toml"
    urls = ", ".join(f'"{lab.base_url}"' for lab in labs)
    cfg.write_text(
        'order = ["compose"]\nanswer_step = "compose"\n\n'
        f"[providers.pool]\nreplicas = [{urls}]\n\n"
        '[steps.compose]\nprovider = "pool"\nstream = true\n'
        'prompt = "{history}Shopper: {message}\\nStylist:"\n',
        encoding="utf-8",
    )
    db = tmp_path / "log.db"
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("CHAINRUN_SERVE_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--config", str(cfg),
         "--db", str(db), "--workers", "2"],
        cwd=root, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("chainrun serve: http://"), first
        base = first.split()[2].rstrip("/")
        assert workers_ready(base, 2)
        for turn in (1, 2, 3):
            for cid in CONVERSATIONS:
                # a new connection a turn: the kernel spreads them over the two workers
                with httpx.Client(base_url=base, timeout=60) as client:
                    r = client.post("/chat", json={"message": _message(cid, turn),
                                                   "conversation_id": cid})  # fmt: skip
                    assert r.status_code == 200 and "event: turn" in r.text, r.text[-300:]
    finally:
        kill_with_workers(proc.pid)
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
    with Store.open(str(db), create=False) as store:
        runs = store.log.query("select run_id, count(*) as n from turns group by run_id")
    assert len(runs) == 2, runs  # both workers answered turns
    names = [lab.base_url for lab in labs]
    for cid in CONVERSATIONS:
        home = rendezvous_order(cid, names)[0]
        for turn in (1, 2, 3):
            assert _compose_replica(labs, cid, turn) == [home], (cid, turn)


class _Replica:
    """A replica for the pool's bookkeeping alone: one chunk a call, or refused."""

    def __init__(self, i: int) -> None:
        self.where = self.base_url = f"http://127.0.0.1:{9000 + i}/v1"
        self.server_address = f"127.0.0.1:{9000 + i}"
        self.reasoning_in_content = "off"
        self.refuse = False

    async def chunks(self, request: Any) -> Any:
        from chainrun.errors import ProviderUnavailable
        from chainrun.timing import make_chunk

        if self.refuse:
            raise ProviderUnavailable(f"{self.where}: connection refused")
        yield make_chunk("hi", None, None, "stop", None, None, None, None, 0, None)


def test_a_hedge_copy_neither_moves_its_conversation_nor_counts_a_move() -> None:
    from chainrun.providers.base import ChatRequest

    fakes = [_Replica(i) for i in range(3)]
    pool = ReplicaPool("pool", fakes)  # type: ignore[arg-type]

    def request(attempt: int) -> ChatRequest:
        return ChatRequest(model="m", messages=[], cache_key="conv-x", cache_owner=True,
                           headers={"x-chainrun-attempt": str(attempt)})  # fmt: skip

    async def call(attempt: int) -> str:
        placement = pool.place(request(attempt))
        async for _ in pool.chunks(request(attempt), placement):
            pass
        return placement.address

    async def go() -> list[str]:
        return [await call(a) for a in (1, 2, 1, 2, 1)]

    home, second = pool.ranking("conv-x")[:2]
    sent = asyncio.run(go())
    assert sent == [fakes[i].server_address for i in (home, second, home, second, home)]
    assert pool.moves == 0
    # the home refuses: the next turn moves, once, and stays there
    fakes[home].refuse = True
    sent = asyncio.run(go())
    third = pool.ranking("conv-x")[2]
    assert sent == [fakes[i].server_address for i in (second, third, second, third, second)]
    assert pool.moves == 1 and pool.failovers == 1
