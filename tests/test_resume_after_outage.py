"""A turn refused because its provider went away (a killed server: the connection broke
mid-answer, or could not be made) is run again by ``--resume``, like an ``error`` turn;
the run's headline counts requests, each by its latest turn.

Before: kill -9 of the provider mid-TTFT logged the in-flight turn ``refused``
(``provider_error``), ``--resume`` skipped it, and the resumed run ended ``complete``
with "13 turns, 11 ok (1 refused, 1 errored)" for a 12-request file.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from conftest import failing_compose_on, reply_by_step

from chainrun.analysis.summary import latency_summary
from chainrun.config import config_from_dict
from chainrun.errors import ProviderConnectionLost, ProviderError
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.replay.resume import missing_requests
from chainrun.replay.run import load_requests, run_requests

LINES = [
    {"id": "a1", "message": "Do you have rain jackets?"},
    {"id": "a2", "message": "Do you sell boots?"},
    {"id": "a3", "message": "Any scarves?"},
]


async def test_a_killed_server_mid_answer_is_connection_lost() -> None:
    """A real HTTP server that sends a stream's headers and then dies (closes the socket,
    as a kill -9 does) is ``connection_lost`` on the real openai client, not a refusal."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
        await writer.drain()
        writer.transport.abort()  # no body, no last chunk: the server is gone

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    provider = OpenAICompatProvider("lab", f"http://127.0.0.1:{port}/v1")
    try:
        request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])
        try:
            async for _ in provider.chunks(request):
                pass
        except ProviderError as e:
            err: ProviderError = e
        else:
            raise AssertionError("the broken stream raised nothing")
    finally:
        await provider.aclose()
        server.close()
        await server.wait_closed()
    assert isinstance(err, ProviderConnectionLost), repr(err)
    assert err.error_type == "connection_lost"


def _lost_on(message: str) -> FakeProvider:
    return failing_compose_on(message, ProviderConnectionLost("lab: connection lost"))


async def test_a_resume_runs_a_turn_refused_for_a_lost_provider_again(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    requests = load_requests(path)
    cfg = config_from_dict({})
    with Store.open(tmp_path / "log.db") as store:
        await run_requests(cfg, requests, store,
                           providers={"local": _lost_on("Do you sell boots?")})  # fmt: skip
        run_id = store.list_runs(1)[0].id
        assert run_id is not None
        (refused,) = [t for t in store.turns(run_id) if t.status == "refused"]
        assert (refused.request_id, refused.error_type) == ("a2", "connection_lost")
        again = missing_requests(store, run_id, requests, str(path))
        assert [r.id for r in again] == ["a2"]
        working = FakeProvider(name="local", script=reply_by_step())
        await run_requests(cfg, again, store, providers={"local": working}, run_id=run_id)
        assert missing_requests(store, run_id, requests, str(path)) == []
        assert [t.status for t in store.turns(run_id)] == ["ok", "refused", "ok", "ok"]
        summary = latency_summary(store, run_id)
    # 3 requests, 3 answered: the refused try stays in the log but is not a turn of its own
    assert summary["n_turns"] == 3
    assert summary["turns"]["n_completed"] == 3 and summary["turns"]["n_refused"] == 0
    assert summary["turn"]["n"] == 3


async def test_a_turn_the_chain_refused_is_not_run_again(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    requests = load_requests(path)
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("", error=ProviderError("lab: the model said no")),
    }))  # fmt: skip
    with Store.open(tmp_path / "log.db") as store:
        await run_requests(config_from_dict({}), requests, store, providers={"local": fake})
        run_id = store.list_runs(1)[0].id
        assert run_id is not None
        assert {t.status for t in store.turns(run_id)} == {"refused"}
        assert missing_requests(store, run_id, requests, str(path)) == []
