"""``--resume`` runs again the requests whose turns ended ``error`` (a provider that could
not be reached or failed the turn, e.g. during an outage), not only the cancelled ones;
a conversation's turn run again sees only the turns before it.

Before: a replay whose provider went away mid-run, resumed once it was back, ended
``complete`` with the outage's turns still ``error``: they were never answered.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import failing_compose_on, reply_by_step

from chainrun.config import config_from_dict
from chainrun.errors import ProviderUnavailable
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider
from chainrun.replay.resume import answered_history, missing_requests
from chainrun.replay.run import load_requests, run_requests

LINES = [
    {"id": "a1", "message": "Do you have rain jackets?"},
    {"id": "c1", "conversation_id": "c", "turn": 1, "message": "Do you sell boots?"},
    {"id": "c2", "conversation_id": "c", "turn": 2, "message": "Which is cheapest?"},
    {"id": "c3", "conversation_id": "c", "turn": 3, "message": "In brown?"},
]


def _outage_on(message: str) -> FakeProvider:
    """A provider that cannot be reached for the compose call of ``message``'s turn."""
    return failing_compose_on(message, ProviderUnavailable("cannot reach provider 'local'"))


async def test_a_resume_runs_the_turns_that_ended_error_again(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    requests = load_requests(path)
    cfg = config_from_dict({})
    with Store.open(tmp_path / "log.db") as store:
        outage = _outage_on("Which is cheapest?")
        with pytest.raises(ProviderUnavailable):
            await run_requests(cfg, requests, store, providers={"local": outage})
        run_id = store.list_runs(1)[0].id
        assert run_id is not None
        errored = [t.request_id for t in store.turns(run_id) if t.status == "error"]
        assert errored == ["c2"]
        again = missing_requests(store, run_id, requests, str(path))
        assert "c2" in [r.id for r in again]
        assert not {"c1"} & {r.id for r in again}  # answered ok: not run again
        earlier = answered_history(store, run_id)
        assert [h.message for h in earlier["c"]] == ["Do you sell boots?"]  # not the error
        working = FakeProvider(name="local", script=reply_by_step())
        await run_requests(cfg, again, store, providers={"local": working}, run_id=run_id,
                           earlier=earlier)  # fmt: skip
        by_request: dict[str | None, list[str]] = {}
        for t in store.turns(run_id):
            by_request.setdefault(t.request_id, []).append(t.status)
        assert store.get_run(run_id).status == "complete"
        # every request answered; the outage's turn stays in the log, counted as errored
        assert all("ok" in s for s in by_request.values()), by_request
        assert by_request["c2"] == ["error", "ok"]
        assert missing_requests(store, run_id, requests, str(path)) == []
    # turn 2 run again saw turn 1 as its history, not its own failed try
    prompts = [r.messages[-1]["content"] for r in working.requests]
    (second,) = [p for p in prompts if p.rstrip().endswith("Which is cheapest?\nStylist:")]
    assert second.startswith("Shopper: Do you sell boots?\nStylist: ")
    assert second.count("Which is cheapest?") == 1
