"""What a chunk is: Azure OpenAI's content-filter events are no chunks.

The lab's Azure route sends the bytes of an Azure stream with content filtering on: a
first event with ``choices: []`` and ``prompt_filter_results``, four content chunks (the
last with the finish reason), then, 300 ms later, an event whose choice carries
``content_filter_results`` and no ``delta``, then ``[DONE]``. Counted as chunks they made
6 chunks and a 300 ms "gap" where the model sent 4 content chunks, and that gap fed the
time-per-output-chunk figures. The real ``openai`` client reads it (``AsyncAzureOpenAI``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import WireFrame
from chainrun.providers.base import ChatRequest, ChatStream
from chainrun.providers.openai_client import AzureTarget
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.timing import Chunk, StreamTimer, Usage

_SAFE = {"filtered": False, "severity": "safe"}
_FILTERS = {"hate": _SAFE, "self_harm": _SAFE, "sexual": _SAFE, "violence": _SAFE}


def _event(d: dict[str, Any]) -> str:
    return f"data: {json.dumps(d, separators=(',', ':'))}\n\n"


def _chunk(choice: dict[str, Any]) -> str:
    return _event({"choices": [choice], "created": 1733040000, "id": "chatcmpl-AZ1",
                   "model": "gpt-4o-2024-08-06", "object": "chat.completion.chunk",
                   "system_fingerprint": "fp_az"})  # fmt: skip


AZURE_FILTERED_STREAM = [
    # the prompt's filter results: no choices at all
    WireFrame(data=_event({"choices": [], "created": 0, "id": "", "model": "", "object": "",
                           "prompt_filter_results": [{"prompt_index": 0,
                                                      "content_filter_results": _FILTERS}]})),
    WireFrame(after_ms=40, data=_chunk({"content_filter_results": {}, "delta": {
        "content": "The", "role": "assistant"}, "finish_reason": None, "index": 0})),
    WireFrame(after_ms=20, data=_chunk({"content_filter_results": _FILTERS, "delta": {
        "content": " linen"}, "finish_reason": None, "index": 0})),
    WireFrame(after_ms=20, data=_chunk({"content_filter_results": _FILTERS, "delta": {
        "content": " shirt"}, "finish_reason": None, "index": 0})),
    WireFrame(after_ms=20, data=_chunk({"content_filter_results": _FILTERS, "delta": {
        "content": " runs small."}, "finish_reason": "stop", "index": 0})),
    # the completion's filter annotation, late: a choice with filter results, no delta
    WireFrame(after_ms=300, data=_event({"choices": [{"content_filter_offsets": {
        "check_offset": 0, "start_offset": 0, "end_offset": 26},
        "content_filter_results": _FILTERS, "finish_reason": None, "index": 0}],
        "created": 0, "id": "", "model": "", "object": ""})),
    WireFrame(data="data: [DONE]\n\n"),
]  # fmt: skip


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer(Scenario(name="azure-filter", wire=AZURE_FILTERED_STREAM)) as lab:
        yield lab


async def test_content_filter_events_are_no_chunks(
    lab: LabServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINRUN_TEST_AZURE_KEY", "k-1")
    provider = OpenAICompatProvider(
        "az", None, api_key_env="CHAINRUN_TEST_AZURE_KEY",
        azure=AzureTarget(lab.url, "2024-10-21", "gpt-4o"),
    )  # fmt: skip
    try:
        s = ChatStream(provider, ChatRequest(model="gpt-4o", messages=[
            {"role": "user", "content": "Does the linen shirt run small?"}]))  # fmt: skip
        await s.collect()
        await s.aclose()
    finally:
        await provider.aclose()
    t = s.timer
    assert t.text == "The linen shirt runs small." and t.finish_reason == "stop"
    assert t.n_events == 6  # every SSE event but [DONE]
    assert t.n_chunks == 4 and len(t.chunk_gaps_ms) == 3  # the model's four chunks
    # the late filter annotation's 300 ms is in no gap: it came after the last chunk
    # (a lower bound, which a loaded machine cannot break), and the mean is of the 3 gaps
    assert t.ttft_ms is not None and t.duration_ms is not None
    assert t.duration_ms - (t.ttft_ms + sum(t.chunk_gaps_ms)) >= 250.0, t.chunk_gaps_ms
    assert t.token_chunk_gaps_ms == t.chunk_gaps_ms  # all four chunks carried text
    assert t.time_between_tokens_ms == pytest.approx(sum(t.chunk_gaps_ms) / 3)
    # the filter events' bytes are still counted (on the next chunk, or at the end)
    assert t.nbytes == sum(len(f.data.encode()) for f in AZURE_FILTERED_STREAM[:-1])
    rec = lab.requests()[-1]
    assert rec["route"] == "/openai/deployments/gpt-4o/chat/completions"
    assert rec["completed"]


def test_a_chunk_carries_text_a_finish_reason_or_usage() -> None:
    timer = StreamTimer(t_start=0.0)
    timer.on_chunk(0.010, Chunk(role="assistant", content=None, nbytes=10))  # role only
    timer.on_chunk(0.100, Chunk(content="a", nbytes=5))
    timer.on_chunk(0.110, Chunk(nbytes=7))  # a filter annotation: nothing of the answer
    timer.on_chunk(0.120, Chunk(reasoning="r", nbytes=5))
    timer.on_chunk(0.130, Chunk(finish_reason="stop"))
    timer.on_chunk(0.140, Chunk(usage=Usage(input_tokens=1, output_tokens=2)))
    timer.on_end(0.15)
    assert timer.n_events == 6 and timer.n_chunks == 4
    assert [round(g) for g in timer.chunk_gaps_ms] == [20, 10, 10]
    assert timer.ttft_ms == pytest.approx(100.0) and timer.nbytes == 27
    assert not timer.truncated
