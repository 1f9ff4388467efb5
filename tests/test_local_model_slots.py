"""On the real local model: a conversation's answer step keeps its llama-server slot.

Two conversations take turns (A, B, A, B), each turn's answer followed by a check; with
the provider in mode ``slot`` the answer step of each conversation names its own slot,
the checks others, so each conversation's second prompt finds its first prompt in the
slot's cache: the server reports it cached (``cached_input_tokens``), all but the few
tokens it recomputes. The slot count comes from the server's ``GET /props``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from local_servers import local_server_in

from chainrun import Chain
from chainrun.config import config_from_dict
from chainrun.log.store import Store
from chainrun.providers.config import ProviderConfig
from chainrun.providers.factory import open_provider
from chainrun.runtime import local_model

pytestmark = pytest.mark.local_model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_model.LocalServer]:
    # a server of this install already running is used and left running
    with local_server_in(tmp_path_factory.mktemp("chainrun-home")) as server:
        yield server


def test_the_provider_reads_the_servers_slots(server: local_model.LocalServer) -> None:
    async def slots() -> int | None:
        p = await open_provider("local", ProviderConfig(base_url=server.base_url,
                                                        prompt_cache="slot"))  # fmt: skip
        try:
            return p.slot_table.slots if p.slot_table else None  # type: ignore[attr-defined]
        finally:
            await p.aclose()

    assert asyncio.run(slots()) == local_model.DEFAULT_SLOTS


def test_each_conversations_answer_finds_its_prompt_cached(
    server: local_model.LocalServer, tmp_path: object
) -> None:
    cfg = config_from_dict({
        "order": ["compose", "check"], "answer_step": "compose",
        "providers": {"local": {"base_url": server.base_url, "prompt_cache": "slot"}},
        "steps": {
            "compose": {"prompt": "{history}A shop's catalogue: rain jackets, boots, scarves, "
                                  "wool coats, linen trousers, white sneakers.\n"
                                  "Shopper: {message}\nStylist:",
                        "stream": True, "max_output_tokens": 16, "temperature": 0.0,
                        "stop": ["\n"], "deadline_s": 240.0},
            "check": {"prompt": "Review this reply to a shopper: {answer}\nReview:",
                      "max_output_tokens": 8, "temperature": 0.0, "deadline_s": 240.0,
                      "on_failure": "open"},
        },
    })  # fmt: skip

    async def turns() -> list[tuple[str, int, int | None, int | None]]:
        with Store.open(":memory:") as store:
            async with Chain(cfg, store=store, quiet=True) as chain:
                for cid, message in (("A", "Do you have rain jackets for cycling?"),
                                     ("B", "I need warm boots for the winter."),
                                     ("A", "Which one is the lightest?"),
                                     ("B", "Do they come in brown?")):  # fmt: skip
                    done = await chain.run_turn(message, conversation_id=cid)
                    assert done.status == "ok", done
                await chain.flush()
                rid = chain.run_id
            assert rid is not None
            by_turn = {t.id: t for t in store.turns(rid)}
            return [(by_turn[c.turn_id].conversation_id or "", by_turn[c.turn_id].turn_index or 0,
                     c.input_tokens, c.cached_input_tokens)
                    for c in store.calls(rid) if c.step == "compose"]  # fmt: skip

    calls = asyncio.run(turns())
    first = {cid: inp for cid, i, inp, _ in calls if i == 1}
    for cid, index, _inp, cached in calls:
        if index == 2:
            assert first[cid] is not None and cached is not None
            # the whole first prompt but the few tokens the server evaluates again
            assert cached >= first[cid] - 8, (cid, cached, first[cid], calls)
