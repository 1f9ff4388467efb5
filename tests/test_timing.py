"""The timing accumulator on lists of (time, chunk) pairs: no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chainrun.timing import Chunk, StreamTimer, Usage


def feed(pairs: list[tuple[float, Chunk]], t_start: float = 0.0, t_end: float | None = None):
    timer = StreamTimer(t_start=t_start)
    for t, c in pairs:
        timer.on_chunk(t, c)
    timer.on_end(t_end if t_end is not None else (pairs[-1][0] if pairs else t_start))
    return timer


def test_role_only_first_frame_is_not_the_first_token() -> None:
    timer = feed([
        (0.050, Chunk(role="assistant", content=None)),
        (0.300, Chunk(content="Hello")),
        (0.320, Chunk(content=" there", finish_reason="stop")),
        (0.330, Chunk(usage=Usage(10, 2, 0, 0))),
    ])  # fmt: skip
    assert timer.ttft_ms == pytest.approx(300.0)
    # the role-only frame is no chunk: no 250 ms "gap" before the first token
    assert timer.chunk_gaps_ms == pytest.approx([20.0, 10.0])
    assert timer.n_events == 4 and timer.n_chunks == 3
    assert len(timer.chunk_gaps_ms) == timer.n_chunks - 1
    assert timer.duration_ms == pytest.approx(330.0)
    assert timer.text == "Hello there"
    assert not timer.truncated
    assert timer.usage == Usage(10, 2, 0, 0)
    assert timer.time_between_tokens_ms == pytest.approx(20.0)


def test_reasoning_text_counts_as_first_token() -> None:
    timer = feed([
        (0.01, Chunk(role="assistant")),
        (0.10, Chunk(reasoning="thinking")),
        (0.50, Chunk(content="answer", finish_reason="stop")),
    ])  # fmt: skip
    assert timer.ttft_ms == pytest.approx(100.0)
    assert timer.text == "answer"
    assert timer.reasoning == ["thinking"]


def test_no_usage_leaves_tokens_unknown_not_zero() -> None:
    timer = feed([(0.1, Chunk(content="a", finish_reason="stop"))])
    assert timer.usage is None


def test_stream_without_finish_reason_is_truncated() -> None:
    timer = feed([(0.1, Chunk(content="a")), (0.2, Chunk(content="b"))])
    assert timer.truncated
    assert timer.text == "ab"


def test_usage_on_the_finish_chunk_is_kept() -> None:
    timer = feed([(0.1, Chunk(content="a", finish_reason="stop", usage=Usage(3, 1, None, None)))])
    assert timer.usage is not None and timer.usage.output_tokens == 1
    assert timer.usage.reasoning_tokens is None


def test_empty_stream_has_no_ttft() -> None:
    timer = feed([], t_end=0.5)
    assert timer.ttft_ms is None and timer.n_chunks == 0 and timer.duration_ms == 500.0


@given(st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=50))
def test_gap_list_is_chunks_minus_one_and_sums_to_span(increments: list[float]) -> None:
    t, pairs = 0.0, []
    for dt in increments:
        t += dt
        pairs.append((t, Chunk(content="x")))
    timer = feed(pairs)
    assert len(timer.chunk_gaps_ms) == timer.n_chunks - 1
    assert sum(timer.chunk_gaps_ms) == pytest.approx((pairs[-1][0] - pairs[0][0]) * 1000, abs=1e-6)
    assert timer.duration_ms is not None and timer.ttft_ms is not None
    assert timer.duration_ms >= timer.ttft_ms


def test_empty_answer_takes_ttft_from_the_finish_chunk() -> None:
    timer = feed([
        (0.01, Chunk(role="assistant")),
        (0.20, Chunk(content="", finish_reason="stop")),
        (0.21, Chunk(usage=Usage(5, 1, 0, 0))),
    ])  # fmt: skip
    assert timer.ttft_ms == pytest.approx(200.0)
    assert timer.text == "" and not timer.truncated
