"""``chainrun serve`` with an identity source while its PostgreSQL log goes away for 20 s
under load (a TCP relay in front of the test server, cut: every connection closed, new
ones refused, as a stopped server or pooler does to its clients).

Every chat is answered or refused with a status: 0 HTTP 500s (a refusal is 503
``log_unavailable`` with ``Retry-After``, once the outage has outlasted ``[log]
outage_wait_s``); ``/readyz`` says the log is away while it is, and ready once it is
back; the log's writer counts the outage from the first failure anyone saw. It used to
answer every chat with an HTTP 500 and a traceback (the owner check read the log with no
outage handling) while ``/readyz`` said ready. Needs ``CHAINRUN_TEST_POSTGRES``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from serve_helpers import serving, sse
from test_conversations_log_outage import relayed_log
from test_tool_steps import tool_config

from chainrun.chain import Chain
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.serve.identity import IdentitySource

#: s the log is away
OUTAGE_S = 20.0
#: clients chatting at once
CLIENTS = 8


async def chatter(url: str, who: int, until: float, seen: list[dict[str, Any]]) -> None:
    """One shopper chatting in a loop until ``until`` (monotonic s): each chat's status,
    whether its stream ended with the ``turn`` event, and its error code."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        n = 0
        while time.monotonic() < until:
            n += 1
            body = {"message": f"hello {n}", "conversation_id": f"c-{who}-{n % 3}"}
            sent = time.monotonic()
            async with client.stream("POST", "/chat", json=body,
                                     headers={"X-Shopper": f"u-{who}"}) as r:  # fmt: skip
                if r.status_code == 200:
                    events = [e async for e, _ in sse(r)]
                    seen.append({"status": 200, "ended": events[-1] == "turn", "at": sent,
                                 "last": events[-3:]})
                else:
                    doc = (await r.aread()).decode()
                    seen.append({"status": r.status_code, "at": sent, "body": doc,
                                 "retry_after": r.headers.get("retry-after")})  # fmt: skip
            await asyncio.sleep(0.05)


async def test_a_log_away_for_20_s_under_load_is_answered_or_refused_never_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    with relayed_log() as (url, relay):
        store = Store.open(url)
        fake = FakeProvider(name="local", script=lambda req: FakeReply("Hello!", gap_s=0.001))
        try:
            async with serving(lambda: Chain(tool_config(), store=store,
                                             providers={"local": fake}, quiet=True),
                               identity=IdentitySource("X-Shopper")) as (base, _):  # fmt: skip
                async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                    warm = await client.post("/chat", json={"message": "hi"},
                                             headers={"X-Shopper": "u-warm"})  # fmt: skip
                    assert warm.status_code == 200
                    seen: list[dict[str, Any]] = []
                    start = time.monotonic()
                    cut_at, back_at = start + 2.0, start + 2.0 + OUTAGE_S
                    load = [asyncio.create_task(chatter(base, k, back_at + 6.0, seen))
                            for k in range(CLIENTS)]  # fmt: skip
                    ready: list[tuple[float, int, dict[str, Any]]] = []
                    await asyncio.sleep(cut_at - time.monotonic())
                    relay.cut()
                    while time.monotonic() < back_at:
                        r = await client.get("/readyz")
                        ready.append((time.monotonic(), r.status_code, r.json()))
                        await asyncio.sleep(0.5)
                    relay.open()
                    await asyncio.gather(*load)
                    r = await client.get("/readyz")
                    after = (r.status_code, r.json())
        finally:
            store.close()
    statuses = Counter(s["status"] for s in seen)
    assert statuses[500] == 0 and set(statuses) <= {200, 503}, statuses
    assert all(s["ended"] for s in seen if s["status"] == 200), [
        (s["last"], s["at"] - cut_at) for s in seen if s["status"] == 200 and not s["ended"]]
    refused = [s for s in seen if s["status"] == 503]
    assert refused and all('"log_unavailable"' in s["body"] and s["retry_after"] == "1"
                           for s in refused)  # fmt: skip
    # refusals only while the log was away (and the turns in the wait when it went)
    assert all(cut_at - 1.0 <= s["at"] <= back_at + 1.0 for s in refused)
    answered_after = [s for s in seen if s["status"] == 200 and s["at"] > back_at + 2.0]
    assert answered_after  # served again once it is back
    away = [doc for t, code, doc in ready if code == 503 and "the run log is away" in
            doc.get("detail", "")]  # fmt: skip
    assert away, ready  # said while it was away
    assert after[0] == 200 and after[1]["status"] == "ready"
    # the writer counts the outage from the first failure anyone saw, not from its own
    backs = [float(m.group(1)) for rec in caplog.records
             if (m := re.search(r"the database is back after ([0-9.]+) s", rec.getMessage()))]
    assert backs and max(backs) >= OUTAGE_S - 3.0, backs
