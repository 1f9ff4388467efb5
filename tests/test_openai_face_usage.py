"""Unknown is said apart from none on the OpenAI-compatible face, in integers.

The upstream server (the lab, sending these exact bytes) reports prompt and completion
tokens but no ``prompt_tokens_details`` or ``completion_tokens_details``: the log holds
NULL for cached and reasoning tokens. The face's ``usage`` once said 0 with nothing
more, then null (which a strictly typed client cannot parse: OpenAI types the counts as
integers); now 0 with the unknown counts named in ``usage.unreported``, read through the
real ``openai`` client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from serve_helpers import serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import WireFrame
from chainrun.log.store import Store


def _chunk(**fields: Any) -> str:
    body = {"id": "chatcmpl-u1", "object": "chat.completion.chunk", "created": 1733040000,
            "model": "m", **fields}  # fmt: skip
    return f"data: {json.dumps(body)}\n\n"


NO_DETAILS = [
    WireFrame(data=_chunk(choices=[{"index": 0, "delta": {"role": "assistant",
                                                            "content": "It runs small."},
                                    "finish_reason": None}])),
    WireFrame(data=_chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])),
    WireFrame(data=_chunk(choices=[], usage={"prompt_tokens": 12, "completion_tokens": 3,
                                             "total_tokens": 15})),
    WireFrame(data="data: [DONE]\n\n"),
]  # fmt: skip


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer(Scenario(name="no-details", wire=NO_DETAILS)) as lab:
        yield lab


def factory(lab: LabServer, store: Store) -> Any:
    cfg = config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"lab": {"base_url": lab.base_url}},
        "steps": {"answer": {"provider": "lab", "prompt": "{message}", "stream": True}},
    })  # fmt: skip
    return lambda: Chain(cfg, store=store, quiet=True)


@pytest.mark.parametrize("stream", [False, True])
async def test_unreported_token_counts_are_0_and_named_never_null(
    lab: LabServer, stream: bool
) -> None:
    with Store.open(":memory:") as store:
        async with serving(factory(lab, store)) as (url, _):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            async with client:
                messages = [{"role": "user", "content": "does it run small?"}]
                if stream:
                    chunks = [c async for c in await client.chat.completions.create(
                        model="chainrun-shop", messages=messages, stream=True,
                        stream_options={"include_usage": True})]  # fmt: skip
                    usage = next(c.usage for c in chunks if c.usage is not None)
                else:
                    done = await client.chat.completions.create(
                        model="chainrun-shop", messages=messages)
                    usage = done.usage
        (call,) = store.calls(store.latest_run_id() or 0)
    assert call.cached_input_tokens is None and call.reasoning_tokens is None  # the log
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (12, 3, 15)
    # integers, as OpenAI types them (a strictly typed client fails on null); what no call
    # reported is named in the extension field
    assert usage.prompt_tokens_details is not None and usage.completion_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details.reasoning_tokens == 0
    assert usage.model_extra is not None
    assert usage.model_extra["unreported"] == ["completion_tokens_details.reasoning_tokens",
                                               "prompt_tokens_details.cached_tokens"]
