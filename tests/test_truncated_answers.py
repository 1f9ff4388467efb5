"""An answer cut at the token cap is visible in the turn, and a step can fail on it.

The lab's Responses route ends a capped answer the way the API does: the terminal event
``response.incomplete`` with ``incomplete_details.reason = "max_output_tokens"``. It was
logged with finish reason ``length`` but ``truncated = 0``, and the turn was ``ok`` with
the cut-off text and nothing to say so. Read through the real ``openai`` client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer, Scenario
from chainrun.log.store import Store


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer(Scenario(name="long", n_tokens=16, per_token_ms=1)) as lab:
        yield lab


def chain_config(lab: LabServer, **answer: Any) -> Any:
    return config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"lab": {"base_url": lab.base_url, "api": "responses"}},
        "steps": {"answer": {"provider": "lab", "prompt": "{message}", "max_output_tokens": 4,
                             "on_failure": "closed", **answer}},
    })  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
async def test_a_capped_answer_is_truncated_in_the_turn(lab: LabServer, stream: bool) -> None:
    with Store.open(":memory:") as store:
        async with Chain(chain_config(lab, stream=stream), store=store) as chain:
            done = await chain.run_turn("tell me everything about linen")
            await chain.flush()
            logged = store.turn(done.turn_id or 0)
    assert logged is not None
    (call,) = logged.calls
    assert call.finish_reason == "length" and not call.truncated  # the call is complete
    (step,) = logged.steps
    assert step.truncated and step.status == "ok"
    # the default keeps the cut answer, and says so in the turn
    assert done.status == "ok" and done.output and done.truncated
    assert logged.turn.truncated and logged.turn.status == "ok"


async def test_a_step_can_fail_on_a_capped_answer(lab: LabServer) -> None:
    with Store.open(":memory:") as store:
        async with Chain(chain_config(lab, on_truncated="fail"), store=store) as chain:
            done = await chain.run_turn("tell me everything about linen")
            await chain.flush()
            logged = store.turn(done.turn_id or 0)
    assert logged is not None
    (step,) = logged.steps
    assert step.error_type == "length" and step.truncated
    assert done.status != "ok"  # the step's on_failure (closed) decides


async def test_a_complete_answer_is_not_truncated(lab: LabServer) -> None:
    with Store.open(":memory:") as store:
        async with Chain(chain_config(lab, max_output_tokens=100), store=store) as chain:
            done = await chain.run_turn("hi")
            await chain.flush()
            logged = store.turn(done.turn_id or 0)
    assert logged is not None and not done.truncated and not logged.turn.truncated
    assert logged.calls[0].finish_reason == "stop"
