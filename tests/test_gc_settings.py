"""Start-up objects out of every garbage collection (chainrun.runtime.gc_settings): what ``chainrun
serve`` does once its chain is open."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.providers.fake import FakeProvider
from chainrun.runtime.gc_settings import (
    FULL_COLLECTION_EVERY,
    freeze_startup_objects,
    rare_full_collections,
)
from chainrun.serve import ServeState


@pytest.fixture
def unfrozen() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process keeps collecting everything, as before
    gc.set_threshold(*thresholds)


def test_freezing_moves_what_is_alive_out_of_collections(unfrozen: None) -> None:
    kept = [[i] for i in range(1000)]  # tracked containers
    n = freeze_startup_objects()
    assert n == gc.get_freeze_count() >= len(kept)
    made_later = [[i] for i in range(10)]
    assert gc.is_tracked(made_later[0]) and gc.get_freeze_count() == n


async def test_serve_state_freezes_once_the_chain_is_open_only_when_asked(
    unfrozen: None, config: ChainConfig, fake: FakeProvider
) -> None:
    for freeze in (False, True):
        gc.unfreeze()
        state = ServeState(lambda: Chain(config, providers={"local": fake}), freeze_gc=freeze)
        state.start()
        await state.wait_ready()
        assert state.chain is not None
        assert (gc.get_freeze_count() > 0) is freeze
        assert (gc.get_threshold()[2] == FULL_COLLECTION_EVERY) is freeze
        await state.aclose()


def test_rare_full_collections_sets_only_the_third_threshold() -> None:
    before = gc.get_threshold()
    try:
        assert rare_full_collections() == (before[0], before[1], FULL_COLLECTION_EVERY)
        assert rare_full_collections(50)[2] == 50
    finally:
        gc.set_threshold(*before)
