"""``chainrun serve`` keeps its embedded local model: when the llama-server it serves
with is gone, ``/readyz`` says so (503, the reason) and one line on stderr; the watch
starts it again (here: a second latency lab, on another port, stands in for the
restarted server), points the provider there, and chats are answered again without a
restart of serve. The servers are real HTTP servers (the lab); only "is this install's
llama-server alive" and "start it" are scripted."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator

import httpx
import pytest
from log_backends import open_log
from serve_helpers import chat, serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import ProviderUnavailable
from chainrun.lab import LabServer
from chainrun.providers import factory
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.runtime.local_model import LocalServer, free_port
from chainrun.serve.provider_watch import LocalModelWatch


async def readyz_until(client: httpx.AsyncClient, status: int) -> httpx.Response:
    """``GET /readyz`` until it answers ``status`` (the watch acts every 50-100 ms here),
    for at most 5 s; the last answer."""
    for _ in range(100):
        ready = await client.get("/readyz")
        if ready.status_code == status:
            break
        await asyncio.sleep(0.05)
    return ready


def _server(port: int) -> LocalServer:
    return LocalServer(os.getpid(), port, "model.gguf", time.time(), "llama-server.log")


@pytest.fixture(scope="module")
def two_labs() -> Iterator[tuple[LabServer, LabServer]]:
    with (
        LabServer("lognormal", median_ms=5, sigma=0.3, n_tokens=8, per_token_ms=1) as a,
        LabServer("lognormal", median_ms=5, sigma=0.3, n_tokens=8, per_token_ms=1) as b,
    ):
        yield a, b


async def test_a_gone_server_is_started_again_and_the_provider_follows_it(
    two_labs, caplog
) -> None:
    lab, _ = two_labs
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    provider = OpenAICompatProvider("local", dead, connect_timeout_s=0.5)
    starts: list[bool] = []
    failing = True

    async def start(quiet: bool) -> LocalServer:
        starts.append(quiet)
        if failing:
            raise ProviderUnavailable("llama-server exited with code 1 during start")
        return _server(lab.port)

    watch = LocalModelWatch([provider], find=lambda: None, start=start)
    try:
        with pytest.raises(ProviderUnavailable):
            await provider.check()
        with caplog.at_level(logging.WARNING, logger="chainrun.serve"):
            await watch.check()
            await watch.check()  # the same failure again: not said twice
        assert watch.down is not None and "could not be started again" in watch.down
        said = [r.getMessage() for r in caplog.records]
        assert sum("not running" in m for m in said) == 1, said
        assert sum("could not be started again" in m for m in said) == 1, said
        assert provider.base_url == dead and len(starts) == 2 and not starts[0]
        failing = False
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="chainrun.serve"):
            await watch.check()
        assert watch.down is None and provider.base_url == lab.base_url
        assert provider.server_address == f"127.0.0.1:{lab.port}"
        assert any("answers again" in r.getMessage() for r in caplog.records)
        await provider.check()  # a real request reaches the server it follows now
    finally:
        await provider.aclose()


async def test_a_live_server_is_left_alone(two_labs, caplog) -> None:
    lab, _ = two_labs
    provider = OpenAICompatProvider("local", lab.base_url)

    async def start(quiet: bool) -> LocalServer:
        raise AssertionError("a live server must not be started again")

    watch = LocalModelWatch([provider], find=lambda: _server(lab.port), start=start)
    try:
        with caplog.at_level(logging.WARNING, logger="chainrun.serve"):
            await watch.check()
        assert watch.down is None and provider.base_url == lab.base_url
        assert caplog.records == []
    finally:
        await provider.aclose()


async def test_serve_says_the_model_is_down_and_answers_again_after_its_restart(
    two_labs, monkeypatch, tmp_path
) -> None:
    first, second = two_labs
    running: list[LocalServer | None] = [_server(first.port)]
    restarted = asyncio.Event()

    async def start_at_open(quiet: bool) -> LocalServer:  # the chain's open finds it
        server = running[0]
        assert server is not None
        return server

    async def start_again(quiet: bool) -> LocalServer:
        await restarted.wait()  # the test reads /readyz while the model is down
        running[0] = _server(second.port)
        return running[0]

    monkeypatch.setattr(factory, "start_local_model", start_at_open)
    cfg = config_from_dict({"providers": {"local": {}}})  # no base_url: the embedded model
    with open_log("sqlite") as store:

        def make() -> Chain:
            return Chain(cfg, store=store, kind="live", quiet=True)

        options = {"every_s": 0.05, "find": lambda: running[0], "start": start_again}
        async with (
            serving(make, watch_options=options) as (url, state),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            assert (await client.get("/readyz")).status_code == 200
            assert (await chat(client, "Do you have rain jackets?"))[-1][1]["status"] == "ok"
            second.reset()
            running[0] = None  # the server is killed
            ready = await readyz_until(client, 503)
            assert ready.status_code == 503 and "not running" in ready.json()["detail"]
            restarted.set()
            ready = await readyz_until(client, 200)
            assert ready.status_code == 200, ready.text
            again = await chat(client, "Do you have rain jackets?")
            assert again[-1][1]["status"] == "ok", again[-1]
            assert state.model_watch is not None and state.model_watch.down is None
    assert len(second.requests()) >= 1  # the second turn went to the restarted server


async def test_serve_says_when_the_answers_server_is_away_and_when_it_is_back(
    tmp_path, caplog
) -> None:
    """A lab (a real server) killed under serve: the failed turn starts the watch, one
    warning line, /readyz 503 naming the provider; a lab started again on the same port:
    one line, /readyz 200, chats answered."""
    lab = LabServer("lognormal", median_ms=5, sigma=0.3, n_tokens=8, per_token_ms=1).start()
    port = lab.port
    cfg = config_from_dict(
        {"providers": {"local": {"base_url": lab.base_url, "connect_timeout_s": 0.5}}}
    )
    revived: LabServer | None = None
    try:
        with open_log("sqlite") as store, caplog.at_level(logging.WARNING, "chainrun.serve"):

            def make() -> Chain:
                return Chain(cfg, store=store, kind="live", quiet=True)

            async with (
                serving(make, watch_options={"every_s": 0.1}) as (url, state),
                httpx.AsyncClient(base_url=url, timeout=30) as client,
            ):
                assert (await chat(client, "Do you have rain jackets?"))[-1][1]["status"] == "ok"
                assert (await client.get("/readyz")).status_code == 200
                lab.stop()  # the model server dies
                failed = await chat(client, "Do you have rain jackets?")
                assert failed[-1][1]["status"] == "error", failed[-1]
                ready = await readyz_until(client, 503)
                assert ready.status_code == 503, ready.text
                assert "provider 'local'" in ready.json()["detail"], ready.text
                said = [r.getMessage() for r in caplog.records]
                away = [m for m in said if "cannot be reached" in m]
                assert len(away) == 1, away
                revived = LabServer("lognormal", median_ms=5, sigma=0.3, n_tokens=8,
                                    per_token_ms=1)  # fmt: skip
                revived.start(port=port)
                ready = await readyz_until(client, 200)
                assert ready.status_code == 200, ready.text
                assert any("answers again" in r.getMessage() for r in caplog.records)
                again = await chat(client, "Do you have rain jackets?")
                assert again[-1][1]["status"] == "ok", again[-1]
                assert state.provider_watch is not None and state.provider_watch.down == {}
    finally:
        lab.stop()
        if revived is not None:
            revived.stop()
