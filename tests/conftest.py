"""Shared fixtures. Unit tests use the in-process fake provider and never touch the network."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from chainrun.config import (
    DEFAULT_CHAIN,
    LLM_CLASSIFY_STEP,
    ChainConfig,
    config_from_dict,
    deep_merge,
)
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply

T = TypeVar("T")


async def ticks_while(work: Awaitable[T], interval_s: float = 0.005) -> tuple[T, int]:
    """Await ``work`` while a timer ticks every ``interval_s`` s; its result and the ticks.

    A loop blocked by ``work`` cannot tick: how tests show that work left the loop.
    """
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(interval_s)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        result = await work
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return result, ticks


#: The default chain without its routes, classified by the model: an ``llm`` classify
#: step whose label nothing before the answer reads, so it is off the answer's critical
#: path. For the tests of off-path scheduling, and of hedging, breakers and cancellation
#: on a model step that is not the answer (the default classify step calls no model).
UNROUTED_MODEL_CLASSIFY: dict = {
    "order": ["classify", "retrieve", "compose", "validate", "critique"],
    "steps": {
        "classify": LLM_CLASSIFY_STEP,
        "retrieve": {"when": {}},
        "compose": {
            "prompt": "{history}Catalogue matches:\n{products}\n\nShopper: {message}\nStylist:"
        },
    },
}


def model_classify_config(overrides: dict | None = None) -> ChainConfig:
    """:data:`UNROUTED_MODEL_CLASSIFY` with ``overrides`` merged onto it key by key."""
    return config_from_dict(deep_merge(UNROUTED_MODEL_CLASSIFY, overrides or {}))


def reply_by_step(
    overrides: dict[str, FakeReply] | None = None,
) -> Callable[[ChatRequest], FakeReply]:
    """A fake script answering each default step plausibly (steps told apart by their prompt)."""
    overrides = overrides or {}

    def script(req: ChatRequest) -> FakeReply:
        prompt = req.messages[-1]["content"]
        if "Category:" in prompt:
            return overrides.get("classify", FakeReply("product_search", ttft_s=0.002))
        if "Review as JSON" in prompt:
            return overrides.get(
                "validate", FakeReply('{"ok": true, "reason": "fine"}', ttft_s=0.002)
            )
        if "more helpful" in prompt:
            return overrides.get("critique", FakeReply("Mention the price.", ttft_s=0.002))
        return overrides.get(
            "compose",
            FakeReply("Try the Storm Shell, light and dry.", ttft_s=0.005, gap_s=0.001),
        )

    return script


def failing_compose_on(message: str, error: Exception) -> FakeProvider:
    """A provider answering like :func:`reply_by_step`, but whose compose call for the turn
    of ``message`` fails with ``error`` (an outage's turn)."""
    answer = reply_by_step()

    def script(req: ChatRequest) -> FakeReply:
        if req.messages[-1]["content"].rstrip().endswith(f"{message}\nStylist:"):
            return FakeReply("", error=error)
        return answer(req)

    return FakeProvider(name="local", script=script)


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_reaches_the_processes_tests_start() -> Iterator[None]:
    """Give SIGINT Python's default handler for the session if pytest inherited it ignored.

    A pytest started as a background job of a non-interactive shell (``pytest &``, a
    script or runner that does so) starts with SIGINT ignored (POSIX: an asynchronous
    list ignores SIGINT and SIGQUIT when job control is off), and every process a test
    starts inherits that: the Ctrl-C tests' chainrun never saw their SIGINT and ran to
    the end. It was no test leaving SIGINT ignored (``_signal_handlers_restored`` checks
    every test). Restored at the end of the session.
    """
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


#: the handlers a test must leave as it found them (a child process inherits an ignored
#: signal: a test that left SIGINT ignored made every later subprocess deaf to Ctrl-C)
_WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """Fail a test that changes a process-wide signal handler and does not restore it."""
    before = {sig: signal.getsignal(sig) for sig in _WATCHED_SIGNALS}
    yield
    changed = {
        signal.Signals(sig).name: (handler, signal.getsignal(sig))
        for sig, handler in before.items()
        if signal.getsignal(sig) != handler
    }
    for sig, handler in before.items():
        signal.signal(sig, handler)
    assert not changed, f"the test left signal handlers changed (before, after): {changed}"


@pytest.fixture(autouse=True)
def _default_answer_without_facts(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default chain in this process without its answer's facts, unless the test is
    marked ``facts``: most tests pin the fake model's reply as the answer (a stop, a cut,
    a check's window); the facts the default answer renders from data after it, and its
    lead, are the subject of tests/test_answer_facts.py and of the tests marked so.
    Chains started in another process (``chainrun serve``, the CLI as a subprocess) keep
    them."""
    if request.node.get_closest_marker("facts") is None:
        facts = DEFAULT_CHAIN["steps"]["compose"]["facts"]
        monkeypatch.setitem(facts, "enabled", False)


@pytest.fixture
def store() -> Store:
    s = Store.open(":memory:")
    yield s
    s.close()


@pytest.fixture
def config() -> ChainConfig:
    return config_from_dict({})


@pytest.fixture
def fake() -> FakeProvider:
    return FakeProvider(name="local", script=reply_by_step())


# -- a latency lab shared by the CLI test modules (a module may define its own ``lab``) --
@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    """A lab answering in ~5 ms with 8 tokens (log-normal, sigma 0.3), one per module."""
    with LabServer("lognormal", median_ms=5, sigma=0.3, n_tokens=8) as server:
        yield server


@pytest.fixture
def lab_config(lab: LabServer, tmp_path: Path) -> Path:
    """A chainrun.toml pointing the default provider at ``lab``."""
    p = tmp_path / "chainrun.toml"
    p.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n')
    return p
