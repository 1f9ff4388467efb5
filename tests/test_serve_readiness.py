"""``/readyz`` tells the truth: not ready, with the reason, while every turn would fail.

Before: it said ready while the answer step's circuit breakers were open (every turn
refused ``circuit_open``), while the run log's writer had stopped taking writes
(turns answered and never logged), and while the identity provider's keys could not be
had (every chat refused 503).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx
from joserfc import jwt
from joserfc.jwk import RSAKey
from serve_helpers import fake_chain, serving

from chainrun.config import ChainConfig, config_from_dict
from chainrun.errors import ProviderStatusError
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.serve.identity import IdentitySource, JwksKeys, TokenVerifier
from chainrun.serve.settings import DEFAULT_MODEL_ID


async def test_not_ready_while_the_answer_steps_breakers_are_open(store: Store) -> None:
    """500s in a row open the answer step's breaker: not ready until it cools down."""
    config = config_from_dict({"steps": {"compose": {"hedge": {
        "delay": "p95", "breaker_failures": 2, "breaker_cooldown_s": 0.5}}}})  # fmt: skip
    failing = [True]

    def script(req):  # type: ignore[no-untyped-def]
        from conftest import reply_by_step

        if failing[0]:
            return reply_by_step({"compose": FakeReply(
                error=ProviderStatusError("down", status=500))})(req)  # fmt: skip
        return reply_by_step()(req)

    fake = FakeProvider(name="local", script=script)
    async with (
        serving(fake_chain(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        assert (await client.get("/readyz")).status_code == 200
        body = {"model": DEFAULT_MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):
            await client.post("/v1/chat/completions", json=body)
        shut = await client.get("/readyz")
        failing[0] = False
        await asyncio.sleep(0.6)  # the cool-down: half-open, a probe may go
        again = await client.get("/readyz")
    assert shut.status_code == 503, shut.text
    assert shut.json()["reason"] == "breaker_open" and "local" in shut.json()["detail"]
    assert again.status_code == 200, again.text


async def test_not_ready_while_the_log_refuses_writes(
    config: ChainConfig, tmp_path: Path, fake: FakeProvider
) -> None:
    class Escaped(BaseException):
        """Stops the log's writer thread, as a bug in its own code would."""

    with Store.open(tmp_path / "log.db") as store:
        async with (
            serving(fake_chain(config, store, fake)) as (url, _),
            httpx.AsyncClient(base_url=url) as client,
        ):
            assert (await client.get("/readyz")).status_code == 200
            writer = store.writer
            assert writer is not None
            stopped = threading.Event()

            def escape(db: object) -> None:
                stopped.set()
                raise Escaped("the writer's own code failed")

            await writer.post(escape)
            await asyncio.to_thread(stopped.wait, 5)
            for _ in range(50):
                if writer.status()["state"] == "stopped":
                    break
                await asyncio.sleep(0.02)
            r = await client.get("/readyz")
    assert r.status_code == 503, r.text
    assert r.json()["reason"] == "log_refuses_writes"
    assert r.json()["log"]["state"] == "stopped"


async def test_not_ready_while_identities_cannot_be_checked(
    config: ChainConfig, store: Store, fake: FakeProvider, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The identity provider's key set cannot be read: every chat is refused 503, and
    /readyz says so; once it can be read, ready again without a chat to find out."""
    monkeypatch.setattr("chainrun.serve.identity.CHECK_EVERY_S", 0.0)
    key = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    keys_file = tmp_path / "jwks.json"  # not there yet
    source = IdentitySource("Authorization-Token",
                            TokenVerifier.from_jwks(JwksKeys(str(keys_file))))  # fmt: skip
    token = jwt.encode({"alg": "RS256", "kid": "k1"}, {"sub": "shopper-1"}, key)
    async with (
        serving(fake_chain(config, store, fake), identity=source) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        chat = await client.post("/chat", json={"message": "hi"},
                                 headers={"Authorization-Token": token})  # fmt: skip
        away = await client.get("/readyz")
        keys_file.write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
        back = await client.get("/readyz")
    assert chat.status_code == 503 and chat.json()["error"]["code"] == "identity_unavailable"
    assert away.status_code == 503, away.text
    assert away.json()["reason"] == "identity_unavailable"
    assert str(keys_file) in away.json()["detail"]
    assert back.status_code == 200, back.text
