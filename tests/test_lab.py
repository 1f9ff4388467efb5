"""The latency lab over real HTTP on loopback, through the real ``openai`` client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

import chainrun.lab
from chainrun.errors import InputFileError, UserInputError
from chainrun.lab import BUILTIN_SCENARIOS, LabServer, Scenario, load_scenario
from chainrun.lab.scenarios import Bimodal, Faults, Lognormal, Planner, WorkNoise

MESSAGES: list[Any] = [{"role": "user", "content": "Does the linen shirt run small?"}]
Record = dict[str, Any]


def client(lab: LabServer, **kw: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=lab.base_url, api_key="x", max_retries=0, **kw)


async def wait_record(
    lab: LabServer, pred: Callable[[Record], bool], timeout_s: float = 5.0
) -> Record:
    """Poll the admin endpoint until a record satisfies ``pred``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [r for r in lab.requests() if pred(r)]
        if found:
            return found[-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"no matching record in {lab.requests()}")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def fast_lab() -> Iterator[LabServer]:
    # 200 tokens at 10 ms: 2 s of generation, so a closed stream is visibly cut short;
    # shape tests cap the answer with max_completion_tokens instead
    with LabServer("fast", n_tokens=200, per_token_ms=10) as lab:
        yield lab


def fault_lab(**faults: Any) -> LabServer:
    return LabServer(Scenario(name="faulty", n_tokens=6, per_token_ms=1, faults=Faults(**faults)))


# ------------------------------------------------------------------ public API


def test_public_api_is_pinned() -> None:
    assert sorted(chainrun.lab.__all__) == sorted(
        ["BUILTIN_SCENARIOS", "LabServer", "Scenario", "create_app", "load_scenario", "serve"]
    )
    assert set(BUILTIN_SCENARIOS) == {
        "fast", "lognormal", "heavy-tail", "bimodal-guard", "work-noise"
    }


# ------------------------------------------------------------------ streaming shape


async def test_stream_role_frame_content_finish_and_usage(fast_lab: LabServer) -> None:
    async with client(fast_lab) as c:
        stream = await c.chat.completions.create(
            model="lab-model",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=5,
            extra_headers={"x-request-id": "req-1", "x-chainrun-attempt": "2"},
            metadata={"case": "shape"},
        )
        chunks = [ch async for ch in stream]

    first, *content, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content is None
    assert len(content) == 5
    assert all(ch.choices[0].delta.content for ch in content)
    assert all(ch.usage is None for ch in [first, *content])
    assert [ch.choices[0].finish_reason for ch in content] == [None] * 4 + ["length"]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 5
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + 5
    details = usage_chunk.usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens == 0
    cached = usage_chunk.usage.prompt_tokens_details
    assert cached is not None and cached.cached_tokens == 0

    rec = await wait_record(fast_lab, lambda r: r["request_id"] == "req-1")
    assert rec["attempt"] == "2"
    assert rec["metadata"] == {"case": "shape"}
    assert rec["planned_tokens"] == rec["tokens_sent"] == 5
    assert rec["completed"] and not rec["disconnected"]
    assert rec["status_code"] == 200 and rec["finish_reason"] == "length"


async def test_stream_frames_headers_and_cpu_reading(fast_lab: LabServer) -> None:
    # the lab's own SSE response: sse-starlette's headers, one JSON object per data line
    # with the same separators for the precomposed content frames as for the others
    import httpx

    before = fast_lab.cpu_s()
    assert before is not None and before > 0 and fast_lab.pid > 0
    body = {"model": "m", "messages": [{"role": "user", "content": 'say "hi"'}],
            "stream": True, "max_completion_tokens": 4}  # fmt: skip
    async with (
        httpx.AsyncClient(trust_env=False) as http,
        http.stream("POST", f"{fast_lab.base_url}/chat/completions", json=body) as r,
    ):
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert r.headers["cache-control"] == "no-store" and r.headers["x-lab-request-id"]
        raw = b"".join([chunk async for chunk in r.aiter_bytes()]).decode()
    frames = [f for f in raw.split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(f.removeprefix("data: ")) for f in frames[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == [None, *(
        c["choices"][0]["delta"]["content"] for c in chunks[1:])]  # fmt: skip
    for f, c in zip(frames[:-1], chunks, strict=True):
        # byte-identical to encoding each choice with json.dumps' default separators
        assert f"[{json.dumps(c['choices'][0])}]" in f
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    after = fast_lab.cpu_s()
    assert after is not None and after >= before


async def test_stream_without_include_usage_has_no_usage_chunk(fast_lab: LabServer) -> None:
    async with client(fast_lab) as c:
        stream = await c.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, max_completion_tokens=3
        )
        chunks = [ch async for ch in stream]
    assert all(ch.usage is None for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_non_stream_response_shape(fast_lab: LabServer) -> None:
    async with client(fast_lab) as c:
        r = await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        again = await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content and len(r.choices[0].message.content.split()) == 4
    assert r.choices[0].message.content == again.choices[0].message.content  # deterministic
    assert r.usage is not None and r.usage.completion_tokens == 4


async def test_models_health_and_reset(fast_lab: LabServer) -> None:
    async with client(fast_lab) as c:
        models = await c.models.list()
        assert [m.id for m in models.data] == ["chainrun-lab"]
        await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1)
    assert fast_lab.requests()
    fast_lab.reset()
    assert fast_lab.requests() == []


async def test_role_only_first_frame_can_be_off() -> None:
    sc = Scenario(n_tokens=3, per_token_ms=1, faults=Faults(role_only_first_frame=False))
    with LabServer(sc) as lab:
        async with client(lab) as c:
            stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            chunks = [ch async for ch in stream]
    assert len(chunks) == 3
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content
    assert chunks[-1].choices[0].finish_reason == "stop"


# ------------------------------------------------------------------ cancellation


async def test_closing_a_stream_is_recorded_and_stops_generation(fast_lab: LabServer) -> None:
    async with client(fast_lab) as c:
        stream = await c.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_headers={"x-request-id": "loser"}
        )
        got = 0
        async for _ in stream:
            got += 1
            if got == 2:
                break
        await stream.close()

    rec = await wait_record(fast_lab, lambda r: r["request_id"] == "loser" and r["disconnected"])
    assert rec["planned_tokens"] == 200
    assert not rec["completed"]
    assert rec["disconnected_at"] is not None
    assert rec["tokens_sent"] < rec["planned_tokens"] // 4
    # generation really stopped: the count does not move any more
    await asyncio.sleep(0.3)
    later = next(r for r in fast_lab.requests() if r["id"] == rec["id"])
    assert later["tokens_sent"] == rec["tokens_sent"]


async def test_closing_before_the_first_token_and_non_stream_timeout() -> None:
    # the usual hedging loser: headers and the role frame arrived, no token yet
    with LabServer("bimodal-guard", fast_p=0.0) as lab:
        async with client(lab, timeout=0.5) as c:
            stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            async for chunk in stream:
                assert chunk.choices[0].delta.role == "assistant"
                break
            await stream.close()
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="m", messages=MESSAGES)
        gone = await wait_record(lab, lambda r: r["stream"] and r["disconnected"])
        timed_out = await wait_record(lab, lambda r: not r["stream"] and r["disconnected"])
    assert gone["planned_ttft_ms"] >= 3000
    assert gone["tokens_sent"] == 0 and gone["first_token_at"] is None
    assert timed_out["status_code"] is None and not timed_out["completed"]


# ------------------------------------------------------------------ faults


async def test_rate_limit_429_with_retry_after() -> None:
    with fault_lab(rate_limit=1.0, retry_after_s=2) as lab:
        async with client(lab) as c:
            with pytest.raises(openai.RateLimitError) as info:
                await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        rec = lab.requests()[0]
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "2"
    assert info.value.response.headers["retry-after-ms"] == "2000"
    assert rec["fault"] == "rate_limit" and rec["status_code"] == 429


async def test_server_error_500() -> None:
    with fault_lab(server_error=1.0) as lab:
        async with client(lab) as c:
            with pytest.raises(openai.InternalServerError) as info:
                await c.chat.completions.create(model="m", messages=MESSAGES)
        rec = lab.requests()[0]
    assert info.value.status_code == 500
    assert rec["fault"] == "server_error" and rec["status_code"] == 500


async def test_cut_stream_ends_without_finish_reason() -> None:
    with fault_lab(cut_after_tokens={"k": 3, "p": 1.0}) as lab:
        async with client(lab) as c:
            stream = await c.chat.completions.create(
                model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            )
            chunks = [ch async for ch in stream]
        rec = await wait_record(lab, lambda r: r["finished_at"] is not None)
    content = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(content) == 3
    assert all(ch.choices[0].finish_reason is None for ch in chunks if ch.choices)
    assert all(ch.usage is None for ch in chunks)
    assert rec["fault"] == "cut_after_tokens"
    assert rec["tokens_sent"] == 3 and rec["planned_tokens"] == 6 and not rec["completed"]


async def test_no_usage_fault_omits_the_usage_chunk() -> None:
    with fault_lab(no_usage=1.0) as lab:
        async with client(lab) as c:
            stream = await c.chat.completions.create(
                model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            )
            chunks = [ch async for ch in stream]
        rec = lab.requests()[0]
    assert all(ch.usage is None for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert rec["fault"] == "no_usage" and rec["completed"]


async def test_hang_times_out_and_the_lab_records_the_disconnect() -> None:
    with fault_lab(hang=1.0) as lab:
        async with client(lab, timeout=0.5) as c:
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        rec = await wait_record(lab, lambda r: r["disconnected"])
    assert rec["fault"] == "hang"
    assert rec["status_code"] is None and rec["tokens_sent"] == 0


# ------------------------------------------------------------------ latency models


async def test_work_noise_work_is_fixed_by_content() -> None:
    other: list[Any] = [{"role": "user", "content": "Is the wool coat warm enough?"}]
    with LabServer("work-noise") as lab:
        async with client(lab) as c:
            for messages in (MESSAGES, MESSAGES, other):
                stream = await c.chat.completions.create(model="m", messages=messages, stream=True)
                await stream.close()  # the plan is recorded on arrival
        planned = [r["planned_tokens"] for r in lab.requests()]
        ttfts = [r["planned_ttft_ms"] for r in lab.requests()]
    assert planned[0] == planned[1] != planned[2]
    assert ttfts[0] != ttfts[1]  # the noise is drawn per copy
    assert all(20 <= n <= 200 for n in planned)


def test_work_noise_tokens_spread_over_the_range() -> None:
    planner = Planner(BUILTIN_SCENARIOS["work-noise"])
    counts = {planner.plan([{"role": "user", "content": f"q{i}"}]).tokens for i in range(50)}
    assert len(counts) > 30 and min(counts) >= 20 and max(counts) <= 200


def test_bimodal_fast_share_is_near_half() -> None:
    sc = BUILTIN_SCENARIOS["bimodal-guard"]
    assert isinstance(sc.latency, Bimodal)
    planner = Planner(sc)
    ttfts = [planner.plan(MESSAGES).ttft_ms for _ in range(200)]
    fast = [t for t in ttfts if t <= 300.0]
    assert all(100.0 <= t <= 300.0 or 3000.0 <= t <= 19000.0 for t in ttfts)
    assert 0.4 <= len(fast) / len(ttfts) <= 0.6


def test_heavy_tail_has_a_five_percent_slow_path_before_the_first_token() -> None:
    planner = Planner(BUILTIN_SCENARIOS["heavy-tail"])
    ttfts = [planner.plan(MESSAGES).ttft_ms for _ in range(4000)]
    slow = [t for t in ttfts if t >= 3000.0]
    assert all(3000.0 <= t <= 10000.0 for t in slow)
    assert 0.04 <= len(slow) / len(ttfts) <= 0.06
    body = sorted(t for t in ttfts if t < 3000.0)
    assert 180 <= body[len(body) // 2] <= 220


def test_slow_path_off_draws_as_plain_lognormal() -> None:
    plain = Planner(load_scenario("lognormal", seed=5))
    off = Planner(Scenario(latency=Lognormal(slow_p=0.0), seed=5))
    assert [plain.plan(MESSAGES).ttft_ms for _ in range(20)] == [
        off.plan(MESSAGES).ttft_ms for _ in range(20)
    ]


def test_planner_reset_replays_the_same_draws() -> None:
    planner = Planner(BUILTIN_SCENARIOS["lognormal"])
    first = [planner.plan(MESSAGES).ttft_ms for _ in range(5)]
    planner.reset()
    assert [planner.plan(MESSAGES).ttft_ms for _ in range(5)] == first


def test_lognormal_median_is_the_median() -> None:
    planner = Planner(load_scenario("lognormal", median_ms=100, seed=3))
    ttfts = sorted(planner.plan(MESSAGES).ttft_ms for _ in range(401))
    assert 85 <= ttfts[200] <= 115


# ------------------------------------------------------------------ loading


def test_overrides_go_to_the_right_place() -> None:
    sc = load_scenario("lognormal", median_ms=500, sigma=1.0, seed=9, sigma_unused=None)
    assert sc.latency.model == "lognormal"
    assert (sc.latency.median_ms, sc.latency.sigma, sc.seed) == (500, 1.0, 9)
    wn = load_scenario("work-noise", median_ms=5)
    assert isinstance(wn.latency, WorkNoise) and wn.latency.noise.median_ms == 5
    with pytest.raises(UserInputError, match="fast_p"):
        load_scenario("lognormal", fast_p=0.2)
    with pytest.raises(UserInputError, match=r"override latency\.median_ms"):
        load_scenario("lognormal", median_ms=-1)


def test_scenario_toml_round_trip(tmp_path: Path) -> None:
    f = tmp_path / "guard.toml"
    f.write_text(
        "seed = 7\n"
        "[latency]\n"
        'model = "bimodal"\n'
        "fast_p = 0.7\n"
        "fast_range_s = [0.1, 0.2]\n"
        "slow_range_s = [2, 4]\n"
        "[faults]\n"
        "rate_limit = 0.1\n"
        "cut_after_tokens = { k = 3, p = 0.05 }\n"
    )
    sc = load_scenario(f)
    assert sc.name == "guard" and sc.seed == 7
    assert isinstance(sc.latency, Bimodal) and sc.latency.slow_range_s == (2.0, 4.0)
    assert sc.faults.cut_after_tokens is not None and sc.faults.cut_after_tokens.k == 3


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ('[latency]\nmodel = "lognormal"\nmedian_ms = -5\n', 3, "latency.median_ms"),
        ('name = "x"\n\n[faults]\nhangs = 0.1\n', 4, "faults.hangs: unknown field"),
        ('[latency]\nmodel = "gamma"\n', 1, "latency"),
        ('[latency]\nmodel = "bimodal"\nslow_range_s = [5, 1]\n', 1, "slow_range_s"),
        ("[faults]\nrate_limit = 0.7\nhang = 0.6\n", 1, "must be <= 1"),
        ('[latency\nmodel = "fast"\n', 1, "not valid TOML"),
    ],
)
def test_bad_scenario_file_names_file_line_and_field(
    tmp_path: Path, text: str, line: int, expected: str
) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(InputFileError) as info:
        load_scenario(f)
    assert info.value.path == str(f)
    assert info.value.line == line
    assert expected in str(info.value)
    assert str(info.value).startswith(f"{f}:{line}: ")


def test_unknown_scenario_and_missing_file() -> None:
    with pytest.raises(UserInputError, match="unknown scenario 'nope'"):
        load_scenario("nope")
    with pytest.raises(InputFileError, match="cannot read"):
        load_scenario("/nonexistent/lab.toml")


def test_a_binary_scenario_file_is_one_error(tmp_path: Path) -> None:
    """New user: a non-UTF-8 scenario file gave a UnicodeDecodeError traceback."""
    f = tmp_path / "binary.toml"
    f.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputFileError, match="not a text file") as info:
        load_scenario(f)
    assert info.value.path == str(f)


def test_lab_server_refuses_non_loopback() -> None:
    from chainrun.lab.server import _check_loopback

    _check_loopback("127.0.0.1")
    _check_loopback("::1")
    with pytest.raises(UserInputError, match="loopback"):
        _check_loopback("0.0.0.0")


# ------------------------------------------------------------------ concurrency


async def test_300_concurrent_streams() -> None:
    sc = Scenario(n_tokens=10, per_token_ms=20)
    with LabServer(sc) as lab:
        async with client(lab) as c:

            async def one(i: int) -> int:
                stream = await c.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": str(i)}], stream=True
                )
                return len([ch async for ch in stream if ch.choices[0].delta.content])

            counts = await asyncio.gather(*(one(i) for i in range(300)))
        records = lab.requests()
    assert counts == [10] * 300
    assert len(records) == 300 and all(r["completed"] for r in records)
    # served side by side, not one after another: each stream lasts at least 0.2 s (10
    # tokens at 20 ms), so one at a time the lab would take at least 60 s. How many were
    # open at once, from the lab's own record (not how fast: that depends on the
    # machine's load and is a benchmark's business)
    events = sorted([(r["received_at"], 1) for r in records]
                    + [(r["finished_at"], -1) for r in records])  # fmt: skip
    open_now = peak = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    assert peak >= 100, peak


async def test_a_client_closing_right_after_done_is_a_completed_stream() -> None:
    """Under load the client can read ``[DONE]`` and close before the lab's generator
    resumes from its last send; that stream was complete, not disconnected (the paced
    and saturating scale runs lost most of their pairings to this). Driven through the
    lab's ASGI app with the disconnect delivered inside the send of ``[DONE]``."""
    from chainrun.lab.server import create_app

    app = create_app(Scenario(name="t", n_tokens=3, per_token_ms=0,
                              latency=Lognormal(median_ms=1, sigma=0.01)))  # fmt: skip
    body = json.dumps({"model": "m", "stream": True, "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip
    gone = asyncio.Event()
    sent: list[bytes] = []
    bodies = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if bodies:
            return bodies.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))
        if b"[DONE]" in message.get("body", b""):
            gone.set()  # the client read [DONE] and closed
            for _ in range(3):  # the disconnect is seen before the generator resumes
                await asyncio.sleep(0)

    await asyncio.wait_for(app(scope, receive, send), 5)
    (rec,) = app.state.lab.records
    assert any(b"[DONE]" in b for b in sent)
    assert rec.completed and not rec.disconnected and rec.finished_at is not None
