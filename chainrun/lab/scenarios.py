"""Scenarios of the latency lab: how the fake server's answers are timed and broken.

A :class:`Scenario` fixes the time to first token (TTFT), the number of generated
tokens and their pace, and the faults injected, so that hedging can be measured on
a *known* latency distribution. :class:`Planner` turns a scenario plus one request
into a :class:`Plan` (pure: no I/O, a seeded RNG), which the server then plays out.

A scenario file is TOML (all times in ms unless the name ends in ``_s``)::

    name = "slow-tail"
    seed = 7
    per_token_ms = 2          # pace of tokens after the first (non-work models)
    n_tokens = 16             # tokens per answer (non-work models), capped by max_tokens
    reasoning_tokens = 0      # Responses API: hidden reasoning tokens before the text
    reasoning_summary_tokens = 8   # Responses API: summary deltas when a summary is asked

    [latency]                 # the TTFT distribution; "model" picks the kind
    model = "lognormal"       # fast | lognormal | bimodal | work_noise
    median_ms = 300
    sigma = 0.8

    [faults]                  # probabilities per request, 0..1
    rate_limit = 0.02         # 429 with Retry-After: retry_after_s
    retry_after_s = 1
    server_error = 0.01       # 500
    hang = 0.0                # never send headers until the client disconnects
    no_usage = 0.0            # omit the usage chunk
    role_only_first_frame = true
    cut_after_tokens = { k = 3, p = 0.05 }   # stream ends after k tokens, no finish_reason
    reject = { p = 0.0, status = 400, param = "reasoning_effort" }   # a refused request
    stream_error = { p = 0.0, after_tokens = 0, style = "event", code = 400 }  # error in a 200
    headers_only = 0.0        # headers (200), then silence until the client disconnects
    malformed_sse = 0.0       # one "data:" line that is not JSON, mid-stream
    pause = { after_tokens = 1, ms = 3000, p = 0.0 }   # a pause after the first token(s)
    usage_on_finish = false   # usage on the finish chunk instead of a usage-only chunk
    retry_after = true        # send Retry-After with a 429
    attempts = [1]            # faults only on these attempts (x-chainrun-attempt); all if unset

    schema_answers = false    # JSON-Schema requests get an object following the schema
    server = "ollama"         # streams as that family sends them (lab/servers.py), or unset

    [tool_calls]              # requests offering tools get tool calls (lab/tool_calls.py)
    rounds = 1                # rounds answered with a tool call before the text answer
    malformed_rounds = []     # rounds whose arguments break the tool's schema
    fragments = 3             # the arguments' JSON text in this many streamed pieces
    [prompt_cache]            # llama-server's prompt cache: a prompt seen before is cached
    warm_ttft_factor = 0.05   #   and its TTFT is this share of the planned one

    [strict_history]          # refuse requests for what earlier tool-call turns hold
    content_null = true       #   400 on "content": null (Ollama, LM Studio)
    arguments_must_parse = true   # 500 on unparsable arguments (llama-server)
    reasoning_content = true  #   400 without reasoning_content (DeepSeek thinking mode)

    [[wire]]                  # exact bytes instead of the planned stream (a bug report's)
    after_ms = 0              # wait this long after the previous frame (the first: after
    data = "data: {...}\n\n" #   the request is in), then send these bytes as they are

The W/N split of ``work_noise`` follows "The Tail at Scale" (Dean and
Barroso, CACM 56(2), 2013): the work W (tokens x per-token time) is fixed by the request's
content, so two copies of one request carry the same W; only the noise N (the TTFT)
is drawn independently per copy.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from chainrun.errors import InputFileError, UserInputError
from chainrun.lab.names import SERVER_FAMILY_NAMES
from chainrun.lab.tool_calls import ToolCallsConfig

Fault = Literal[
    "rate_limit", "server_error", "hang", "cut_after_tokens", "no_usage", "reject",
    "stream_error", "headers_only", "malformed_sse",
]  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_range(r: tuple[float, float], field: str) -> None:
    if r[0] > r[1]:
        raise ValueError(f"{field}: expected [lo, hi] with lo <= hi, got {list(r)}")


class Fast(_Strict):
    """No added latency: the first token is sent at once."""

    #: the latency model: answers at once (TTFT about 0)
    model: Literal["fast"] = "fast"

    def ttft_ms(self, rng: random.Random) -> float:
        """Always 0 ms."""
        return 0.0


class Lognormal(_Strict):
    """TTFT = ``median_ms * exp(sigma * Z)``, Z standard normal (the median is ``median_ms``).

    With ``slow_p > 0``, a share ``slow_p`` of requests take a slow path instead: TTFT
    uniform in ``slow_range_s`` (s), before the first token (the heavy-tailed
    scenario: a log-normal body plus 5% of 3-10 s). ``slow_p = 0`` draws exactly as
    before (one Gaussian per request, no extra RNG draw).
    """

    #: the latency model: TTFT = median_ms x exp(sigma x Z), Z standard normal
    model: Literal["lognormal"] = "lognormal"
    #: the TTFT's median, in ms
    median_ms: float = Field(default=200.0, gt=0)
    #: the spread of log TTFT (0: every TTFT is the median)
    sigma: float = Field(default=0.5, ge=0)
    #: the share of requests on the slow path instead (0..1)
    slow_p: float = Field(default=0.0, ge=0, le=1)
    #: the slow path's TTFT, uniform in this range, in s
    slow_range_s: tuple[float, float] = (3.0, 10.0)

    @model_validator(mode="after")
    def _slow_range(self) -> Lognormal:
        _check_range(self.slow_range_s, "slow_range_s")
        if self.slow_range_s[0] < 0:
            raise ValueError("slow_range_s: times must be >= 0")
        return self

    def ttft_ms(self, rng: random.Random) -> float:
        """One TTFT draw, in ms."""
        body = self.median_ms * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        if self.slow_p > 0 and rng.random() < self.slow_p:
            return rng.uniform(*self.slow_range_s) * 1000.0
        return body


class Bimodal(_Strict):
    """A warm and a cold path: TTFT uniform in ``fast_range_s`` with probability ``fast_p``,
    else uniform in ``slow_range_s`` (ranges in s).

    The default is a classifier on a shared inference endpoint with a warm and a cold
    path: 0.1-0.3 s or 3-19 s,
    about half each.
    """

    #: the latency model: a warm path with probability fast_p, else a cold one
    model: Literal["bimodal"] = "bimodal"
    #: the warm path's share of requests (0..1)
    fast_p: float = Field(default=0.5, ge=0, le=1)
    #: the warm path's TTFT, uniform in this range, in s
    fast_range_s: tuple[float, float] = (0.1, 0.3)
    #: the cold path's TTFT, uniform in this range, in s
    slow_range_s: tuple[float, float] = (3.0, 19.0)

    @model_validator(mode="after")
    def _ranges(self) -> Bimodal:
        _check_range(self.fast_range_s, "fast_range_s")
        _check_range(self.slow_range_s, "slow_range_s")
        if self.fast_range_s[0] < 0:
            raise ValueError("fast_range_s: times must be >= 0")
        return self

    def ttft_ms(self, rng: random.Random) -> float:
        """One TTFT draw, in ms."""
        lo, hi = self.fast_range_s if rng.random() < self.fast_p else self.slow_range_s
        return rng.uniform(lo, hi) * 1000.0


class LognormalNoise(_Strict):
    """Serving-side noise N: lognormal with median ``median_ms`` (ms) and shape ``sigma``."""

    #: the noise's median (the TTFT drawn per copy), in ms
    median_ms: float = Field(default=30.0, gt=0)
    #: the spread of the noise's log
    sigma: float = Field(default=0.3, ge=0)


class WorkNoise(_Strict):
    """Latency = N + W: noise N (the TTFT, drawn per request) plus work W.

    W = tokens x ``per_token_ms``; the number of tokens, in ``[tokens_min, tokens_max]``,
    is fixed by a hash of the request's messages, so every copy of a request does the
    same work. Used to show that a copy wins only when N1 - N2 > d (Dean and Barroso, 2013).
    """

    #: the latency model: work fixed by the request (tokens x per_token_ms) plus noise
    #: drawn per copy
    model: Literal["work_noise"] = "work_noise"
    #: the noise N: the TTFT, drawn independently for each copy
    noise: LognormalNoise = LognormalNoise()
    #: the time a token of the work takes, in ms
    per_token_ms: float = Field(default=10.0, ge=0)
    #: the fewest tokens the request's content fixes
    tokens_min: int = Field(default=20, ge=1)
    #: the most tokens the request's content fixes
    tokens_max: int = Field(default=200, ge=1)

    @model_validator(mode="after")
    def _tokens(self) -> WorkNoise:
        if self.tokens_min > self.tokens_max:
            raise ValueError(
                f"tokens_min ({self.tokens_min}) must not exceed tokens_max ({self.tokens_max})"
            )
        return self

    def ttft_ms(self, rng: random.Random) -> float:
        """One noise draw N, in ms."""
        return self.noise.median_ms * math.exp(self.noise.sigma * rng.gauss(0.0, 1.0))

    def work_tokens(self, content_key: str) -> int:
        """The tokens the request carries, from a hash of its content (same for every copy)."""
        h = int.from_bytes(hashlib.blake2b(content_key.encode(), digest_size=8).digest(), "big")
        return self.tokens_min + h % (self.tokens_max - self.tokens_min + 1)


Latency = Annotated[Fast | Lognormal | Bimodal | WorkNoise, Field(discriminator="model")]
_LATENCY_TAGS = frozenset({"fast", "lognormal", "bimodal", "work_noise"})


class CutFault(_Strict):
    """With probability ``p``, the stream ends after ``k`` tokens without a finish_reason."""

    #: the stream ends after this many tokens, with no finish_reason
    k: int = Field(ge=0)
    #: the probability a request gets this fault (0..1)
    p: float = Field(ge=0, le=1)


class RejectFault(_Strict):
    """With probability ``p``, refuse the request with an OpenAI-style error body
    (``invalid_request_error`` naming ``param`` with ``code``), at HTTP ``status``."""

    #: the probability a request gets this fault (0..1)
    p: float = Field(ge=0, le=1)
    #: the HTTP status of the refusal (4xx)
    status: int = Field(default=400, ge=400, le=499)
    #: the request parameter the error body names
    param: str | None = "reasoning_effort"
    #: the error body's code
    code: str | None = "unsupported_value"
    #: the error body's message
    message: str = (
        "Unsupported value: 'reasoning_effort' does not support 'minimal' with this model. "
        "Supported values are: 'none', 'low', 'medium', and 'high'."
    )


class StreamErrorFault(_Strict):
    """With probability ``p``, a 200 stream reports an error after ``after_tokens`` tokens
    and ends: ``style = "event"`` sends llama-server's ``error: {...}`` SSE field then
    ``data: [DONE]``; ``style = "data"`` sends ``data: {"error": {...}}`` (e.g. a 503
    in the middle of a stream)."""

    #: the probability a request gets this fault (0..1)
    p: float = Field(ge=0, le=1)
    #: the tokens sent before the error
    after_tokens: int = Field(default=0, ge=0)
    #: event: an SSE "error:" field then [DONE] (llama-server); data: a data line
    #: holding {"error": ...}
    style: Literal["event", "data"] = "event"
    #: the error's code
    code: int = 400
    #: the error's message
    message: str = "the request exceeds the available context size"


class PauseFault(_Strict):
    """With probability ``p``, a pause of ``ms`` after the first ``after_tokens`` tokens."""

    #: the tokens sent before the pause
    after_tokens: int = Field(default=1, ge=1)
    #: how long the stream pauses, in ms
    ms: float = Field(ge=0)
    #: the probability a stream pauses (0..1)
    p: float = Field(default=1.0, ge=0, le=1)


class Faults(_Strict):
    """Per-request fault probabilities (0..1).

    ``rate_limit``, ``server_error``, ``hang``, ``cut_after_tokens.p``, ``reject.p``,
    ``stream_error.p``, ``headers_only`` and ``malformed_sse`` exclude one another (one
    draw decides among them, so their sum must be <= 1); ``no_usage`` and ``pause`` are
    drawn on their own. Stream faults only affect streams (``no_usage`` also drops
    ``usage`` from a non-streamed answer). With ``attempts`` set, only requests whose
    ``x-chainrun-attempt`` header is one of them get faults.
    """

    #: the share of requests answered 429 (with Retry-After: retry_after_s)
    rate_limit: float = Field(default=0.0, ge=0, le=1)
    #: the ``Retry-After`` sent with a 429, in s
    retry_after_s: float = Field(default=1.0, ge=0)
    #: the share of requests answered 500
    server_error: float = Field(default=0.0, ge=0, le=1)
    #: the share of requests that get no headers until the client leaves
    hang: float = Field(default=0.0, ge=0, le=1)
    #: streams cut after k tokens with probability p, no finish_reason
    cut_after_tokens: CutFault | None = None
    #: the share of answers without their usage (tokens unknown)
    no_usage: float = Field(default=0.0, ge=0, le=1)
    #: first streamed chunk carries only ``role`` with null content (as llama.cpp does)
    role_only_first_frame: bool = True
    #: requests refused with a 4xx naming a parameter, with probability p
    reject: RejectFault | None = None
    #: an error inside a 200 stream (an SSE error event or data line), with probability p
    stream_error: StreamErrorFault | None = None
    #: the share of requests answered 200 headers, then silence until the client leaves
    headers_only: float = Field(default=0.0, ge=0, le=1)
    #: the share of streams with one data line that is not JSON, mid-stream
    malformed_sse: float = Field(default=0.0, ge=0, le=1)
    #: a pause of ms after the first after_tokens tokens, with probability p
    pause: PauseFault | None = None
    #: usage on the chunk with the finish_reason instead of a usage-only chunk
    usage_on_finish: bool = False
    #: send ``Retry-After`` (and ``retry-after-ms``) with a 429
    retry_after: bool = True
    #: the form of ``Retry-After`` (RFC 9110 §10.2.3): ``seconds`` (with OpenAI's
    #: ``retry-after-ms`` beside it) or ``http_date`` alone (an IMF-fixdate, as some
    #: gateways send it)
    retry_after_form: Literal["seconds", "http_date"] = "seconds"
    #: only these attempt numbers (``x-chainrun-attempt``) get faults; None = every request
    attempts: list[int] | None = None

    def exclusive(self) -> tuple[tuple[Fault, float], ...]:
        """The mutually exclusive faults and their probabilities, in draw order."""
        return (
            ("rate_limit", self.rate_limit),
            ("server_error", self.server_error),
            ("hang", self.hang),
            ("cut_after_tokens", self.cut_after_tokens.p if self.cut_after_tokens else 0.0),
            ("reject", self.reject.p if self.reject else 0.0),
            ("stream_error", self.stream_error.p if self.stream_error else 0.0),
            ("headers_only", self.headers_only),
            ("malformed_sse", self.malformed_sse),
        )

    @model_validator(mode="after")
    def _exclusive(self) -> Faults:
        total = sum(p for _, p in self.exclusive())
        if total > 1.0 + 1e-9:
            raise ValueError(
                "rate_limit + server_error + hang + cut_after_tokens.p + reject.p + "
                f"stream_error.p + headers_only + malformed_sse must be <= 1 (got {total:g})"
            )
        return self


class PromptCache(_Strict):
    """llama-server's prompt cache, emulated: a request whose messages the lab has
    answered before gets its prompt from the cache (all prompt tokens but the last are
    cached, as llama-server reuses a slot's matching prefix) and a TTFT of
    ``warm_ttft_factor`` times the planned one. A request with ``"cache_prompt": false``
    (llama-server's per-request switch) neither uses nor fills the cache."""

    #: a cached prompt's TTFT as a share of the planned one (0..1)
    warm_ttft_factor: float = Field(default=0.05, ge=0, le=1)


class WireFrame(_Strict):
    """Bytes the lab sends exactly as written, ``after_ms`` after the previous frame (the
    first: after the request is in). Text is sent UTF-8 encoded; put the SSE framing
    (``data: ...``, blank lines) in it yourself."""

    #: the wait after the previous frame (the first: after the request is in), in ms
    after_ms: float = Field(default=0.0, ge=0)
    #: the bytes sent as they are (UTF-8), SSE framing included
    data: str


class StrictHistory(_Strict):
    """Requests a strict server refuses for what their earlier turns hold, as real
    OpenAI-compatible servers do (each publicly reported, 2025-2026). Checked on every
    assistant message with ``tool_calls`` in ``messages``:

    - ``content_null``: ``"content": null`` on it is a 400 (Ollama, LM Studio);
    - ``arguments_must_parse``: a call whose ``arguments`` is not valid JSON is a 500
      (llama-server, ggml-org/llama.cpp#25510);
    - ``reasoning_content``: one without ``reasoning_content`` is a 400 (DeepSeek's
      thinking mode, api-docs.deepseek.com "Thinking Mode", tool calls).
    """

    #: 400 on an assistant tool-call message with "content": null (Ollama, LM Studio)
    content_null: bool = False
    #: 500 on a call whose arguments are not valid JSON (llama-server)
    arguments_must_parse: bool = False
    #: 400 on one without reasoning_content (DeepSeek's thinking mode)
    reasoning_content: bool = False

    def refusal(self, messages: list[Any]) -> tuple[int, str] | None:
        """``(status, message)`` for a request these rules refuse, else None."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") != "assistant" or not m.get("tool_calls"):
                continue
            if self.content_null and m.get("content", None) is None:
                return 400, f"messages[{i}].content: null is not a string"
            if self.reasoning_content and not m.get("reasoning_content"):
                return 400, (f"messages[{i}]: the reasoning_content of an assistant message "
                             "with tool_calls must be passed back")  # fmt: skip
            if self.arguments_must_parse:
                for call in m["tool_calls"]:
                    fn = call.get("function") if isinstance(call, dict) else None
                    args = fn.get("arguments") if isinstance(fn, dict) else None
                    try:
                        json.loads(args if isinstance(args, str) else "")
                    except ValueError:
                        return 500, "Failed to parse tool call arguments as JSON"
        return None


class Scenario(_Strict):
    """How the lab serves: TTFT distribution, token count and pace, faults, RNG seed.

    With ``wire`` set, every streamed request (Chat Completions, Responses, both Azure
    routes) gets exactly those frames as a 200 ``text/event-stream`` body instead of the
    planned stream: an emulated server sending the bytes a bug report describes;
    ``wire_rounds`` does the same per tool round (Chat Completions).
    """

    #: the scenario's name (in the lab's records and the benchmarks' results)
    name: str = "custom"
    #: the TTFT distribution; model picks its kind (fast, lognormal, bimodal, work_noise)
    latency: Latency = Fast()
    #: pace of tokens after the first, in ms (non-work models; work_noise has its own)
    per_token_ms: float = Field(default=2.0, ge=0)
    #: tokens per answer for non-work models (a request's max_completion_tokens caps it)
    n_tokens: int = Field(default=16, ge=1)
    #: the faults injected, per request
    faults: Faults = Faults()
    #: the RNG seed of the draws (unset: a new seed each start)
    seed: int | None = 0
    #: Responses API only: hidden reasoning tokens per answer (one token interval each,
    #: before the text; none when the request's reasoning.effort is "none")
    reasoning_tokens: int = Field(default=0, ge=0)
    #: Responses API only: summary deltas streamed over the reasoning phase when the
    #: request asks for reasoning.summary (at most ``reasoning_tokens``)
    reasoning_summary_tokens: int = Field(default=8, ge=1)
    #: answer requests that offer ``tools`` with tool calls (None: always text)
    tool_calls: ToolCallsConfig | None = None
    #: exact frames for every streamed request instead of the planned stream (None: plan)
    wire: list[WireFrame] | None = None
    #: exact frames by tool round (``[[wire_rounds]]``: round 1's frames, round 2's, ...;
    #: a later round gets the last list): a server's bytes for a tool-call turn and for
    #: the answer after the tool results (None: ``wire`` or the plan)
    wire_rounds: list[list[WireFrame]] | None = None
    #: refuse requests whose earlier tool-call turns a strict server refuses (None: none,
    #: or the ``server`` family's)
    strict_history: StrictHistory | None = None
    #: send streams as this server family does (chainrun.lab.servers.SERVER_PROFILES:
    #: tool-call ids and indexes, reasoning, usage fields, what its history refuses);
    #: None: as the OpenAI API documents
    server: Literal[SERVER_FAMILY_NAMES] | None = None  # type: ignore[valid-type]
    #: emulate llama-server's prompt cache (None: no cache, every prompt token computed)
    prompt_cache: PromptCache | None = None
    #: answer a request that asks for a JSON Schema (``response_format`` json_schema,
    #: Responses ``text.format``) with an object following it, as a server enforcing it
    #: with a grammar would (lab/tool_calls.py ``schema_answer``); false: the words
    schema_answers: bool = False
    #: keep each request's chat messages in its record (``GET /admin/requests``,
    #: ``messages``): for tests and demos that check what a client sent (off by default:
    #: a long benchmark would hold every prompt in memory)
    record_bodies: bool = False

    @property
    def token_interval_ms(self) -> float:
        """Time between tokens, in ms, for this scenario's latency model."""
        if isinstance(self.latency, WorkNoise):
            return self.latency.per_token_ms
        return self.per_token_ms


#: The named scenarios (``chainrun lab serve --scenario NAME``).
BUILTIN_SCENARIOS: dict[str, Scenario] = {
    "fast": Scenario(name="fast", latency=Fast()),
    "lognormal": Scenario(name="lognormal", latency=Lognormal(median_ms=200.0, sigma=0.5)),
    # the tail scenario: log-normal body (median 200 ms) plus 5% of 3-10 s
    "heavy-tail": Scenario(
        name="heavy-tail",
        latency=Lognormal(median_ms=200.0, sigma=0.5, slow_p=0.05, slow_range_s=(3.0, 10.0)),
    ),
    "bimodal-guard": Scenario(
        name="bimodal-guard",
        latency=Bimodal(fast_p=0.5, fast_range_s=(0.1, 0.3), slow_range_s=(3.0, 19.0)),
    ),
    "work-noise": Scenario(
        name="work-noise",
        latency=WorkNoise(
            noise=LognormalNoise(median_ms=30.0, sigma=0.3),
            per_token_ms=10.0,
            tokens_min=20,
            tokens_max=200,
        ),
    ),
}


@dataclass(frozen=True)
class Plan:
    """What the server will do with one request.

    Attributes:
        ttft_ms: planned time to first token, in ms (0 for errors and hangs).
        tokens: tokens to generate (after the request's max tokens cap).
        finish_reason: "stop", or "length" when the cap cut the answer.
        fault: the fault applied, or None.
        cut_after: for a cut stream, the tokens sent before the cut; else None.
        token_interval_ms: time between tokens, in ms.
        pause_after: tokens sent before a pause (None: no pause); ``pause_ms`` its length.
    """

    ttft_ms: float
    tokens: int
    finish_reason: Literal["stop", "length", "tool_calls"]
    fault: Fault | None
    cut_after: int | None
    token_interval_ms: float
    pause_after: int | None = None
    pause_ms: float = 0.0


def content_key(messages: Any) -> str:
    """A canonical string of a request's messages (what the work hash and token text use)."""
    return json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Planner:
    """Draws a :class:`Plan` per request from a scenario with a seeded RNG (no I/O)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)

    def reset(self) -> None:
        """Restart the RNG from the scenario's seed (same draws again)."""
        self.rng = random.Random(self.scenario.seed)

    def plan(
        self, messages: Any, max_tokens: int | None = None, attempt: int | None = None
    ) -> Plan:
        """Plan one request.

        Args:
            messages: the request's ``messages`` (any JSON value; hashed for work_noise).
            max_tokens: the request's ``max_completion_tokens``/``max_tokens``, or None.
            attempt: the request's ``x-chainrun-attempt`` number, or None.
        """
        sc = self.scenario
        lat = sc.latency
        wanted = (
            lat.work_tokens(content_key(messages)) if isinstance(lat, WorkNoise) else sc.n_tokens
        )
        tokens = wanted if max_tokens is None else max(1, min(wanted, max_tokens))
        finish: Literal["stop", "length"] = "length" if tokens < wanted else "stop"
        ttft = lat.ttft_ms(self.rng)

        fault: Fault | None = None
        cut_after: int | None = None
        f = sc.faults
        if f.attempts is not None and attempt not in f.attempts:
            f = Faults(role_only_first_frame=f.role_only_first_frame)
        exclusive = f.exclusive()
        u = self.rng.random()
        edge = 0.0
        for name, p in exclusive:
            edge += p
            if p > 0 and u < edge:
                fault = name
                break
        if fault == "cut_after_tokens":
            assert f.cut_after_tokens is not None
            cut_after = min(f.cut_after_tokens.k, tokens)
        no_usage = self.rng.random() < f.no_usage
        if fault is None and no_usage:
            fault = "no_usage"
        if fault in ("rate_limit", "server_error", "hang", "reject", "headers_only"):
            ttft = 0.0
        pause_after: int | None = None
        if f.pause is not None and self.rng.random() < f.pause.p:
            pause_after = f.pause.after_tokens
        return Plan(
            ttft_ms=ttft,
            tokens=tokens,
            finish_reason=finish,
            fault=fault,
            cut_after=cut_after,
            token_interval_ms=sc.token_interval_ms,
            pause_after=pause_after,
            pause_ms=f.pause.ms if f.pause is not None and pause_after is not None else 0.0,
        )


# ---------------------------------------------------------------- loading


_TABLE_RE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_\-\"'. ]+?)\s*=")


def _split_key(key: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in key.split("."))


def _line_of(text: str, path: tuple[str, ...]) -> int | None:
    """The 1-based line defining the longest prefix of ``path`` in TOML ``text`` (best effort)."""
    best: tuple[int, int] | None = None  # (prefix length, line)
    table: tuple[str, ...] = ()
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _TABLE_RE.match(line)
        if m:
            table = _split_key(m.group(1))
            full = table
        else:
            k = _KEY_RE.match(line)
            if not k:
                continue
            full = table + _split_key(k.group(1))
        n = len(full)
        if n <= len(path) and path[:n] == full and (best is None or n > best[0]):
            best = (n, lineno)
    return best[1] if best else None


def _error_path(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    # pydantic puts the union tag into the location (latency.lognormal.median_ms): drop it
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] == "latency" and parts[1] in _LATENCY_TAGS:
        del parts[1]
    return tuple(parts)


def _describe(err: ValidationError) -> tuple[tuple[str, ...], str]:
    first = err.errors()[0]
    path = _error_path(tuple(first["loc"]))
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    value = first.get("input")
    if not isinstance(value, dict) and first["type"] not in ("missing", "extra_forbidden"):
        if "got " not in msg:
            msg += f" (got {value!r})"
    return path, msg


def _apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Put ``median_ms=..``-style overrides where they belong (top, latency, noise, faults)."""
    out = copy.deepcopy(data)
    latency = out.setdefault("latency", {"model": "fast"})
    faults = out.setdefault("faults", {})
    for key, value in overrides.items():
        if value is None:
            continue
        if key in Scenario.model_fields and key not in ("latency", "faults"):
            out[key] = value
        elif latency.get("model") == "work_noise" and key in LognormalNoise.model_fields:
            latency.setdefault("noise", {})[key] = value
        elif key in _latency_fields(latency.get("model")):
            latency[key] = value
        elif key in Faults.model_fields:
            faults[key] = value
        else:
            raise UserInputError(
                f"scenario override {key}={value!r} does not apply to latency model "
                f"{latency.get('model')!r}"
            )
    return out


def _latency_fields(model: Any) -> set[str]:
    for cls in (Fast, Lognormal, Bimodal, WorkNoise):
        if cls.model_fields["model"].default == model:
            return set(cls.model_fields) - {"model"}
    return set()


def load_scenario(name_or_path: str | Path, **overrides: Any) -> Scenario:
    """A built-in scenario by name, or a scenario TOML file, with overrides applied.

    Args:
        name_or_path: a key of :data:`BUILTIN_SCENARIOS` or the path of a TOML file
            (format in this module's docstring; ``name`` defaults to the file's stem).
        overrides: field values that replace the scenario's; None values are ignored.
            Keys name a top-level field (``seed``, ``per_token_ms``, ``n_tokens``), a
            field of the latency model (``median_ms``, ``sigma``, ``fast_p``, ...; for
            ``work_noise``, ``median_ms``/``sigma`` set the noise) or of ``faults``.

    Raises:
        InputFileError: the file is missing, not TOML, or invalid; the message names
            the file, the line when it can be found, and the field path.
        UserInputError: an unknown scenario name or an override that does not fit.
    """
    key = str(name_or_path)
    source: str | None = None
    text = ""
    if isinstance(name_or_path, str) and key in BUILTIN_SCENARIOS:
        data = BUILTIN_SCENARIOS[key].model_dump(mode="json")
    else:
        p = Path(name_or_path)
        if not p.exists() and p.suffix != ".toml":
            raise UserInputError(
                f"unknown scenario {key!r}; expected one of "
                f"{', '.join(BUILTIN_SCENARIOS)} or the path of a .toml file"
            )
        source = str(p)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise InputFileError(
                source, None, f"cannot read scenario file ({e.strerror})"
            ) from None
        except UnicodeDecodeError:
            raise InputFileError(source, None, "not a text file (expected UTF-8 TOML)") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            m = re.search(r"at line (\d+)", str(e))
            raise InputFileError(
                source, int(m.group(1)) if m else None, f"not valid TOML ({e})"
            ) from None
        data.setdefault("name", p.stem)
        try:
            Scenario.model_validate(data)
        except ValidationError as e:
            path, msg = _describe(e)
            raise InputFileError(
                source, _line_of(text, path), f"{'.'.join(path) or '(top level)'}: {msg}"
            ) from None
    return _validate_overrides(data, overrides, source or f"scenario {key!r}")


def with_overrides(scenario: Scenario, **overrides: Any) -> Scenario:
    """A copy of ``scenario`` with overrides applied (same keys as :func:`load_scenario`).

    Raises:
        UserInputError: an override that does not fit the scenario.
    """
    return _validate_overrides(
        scenario.model_dump(mode="json"), overrides, f"scenario {scenario.name!r}"
    )


def _validate_overrides(data: dict[str, Any], overrides: dict[str, Any], where: str) -> Scenario:
    if not any(v is not None for v in overrides.values()):
        return Scenario.model_validate(data)
    merged = _apply_overrides(data, overrides)
    try:
        return Scenario.model_validate(merged)
    except ValidationError as e:
        path, msg = _describe(e)
        raise UserInputError(f"{where}: override {'.'.join(path)}: {msg}") from None
