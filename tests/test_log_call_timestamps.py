"""``calls.started_at``: when each call was sent, a UTC timestamp in the format of every
``*_at`` column, inside its turn's own start and end.

Before: the chain never filled it (NULL in every row), so a call could only be placed
in time through its turn's and step's offsets. Real lab over HTTP, real log.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

from cli_runner import chainrun, short_replay

from chainrun.log.store import Store

#: the *_at format (chainrun.log.migrations.utc_now): ISO-8601 UTC with ms
AT_FORMAT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00")


def test_every_sent_call_has_its_send_time_inside_its_turn(
    tmp_path: Path, lab_config: Path
) -> None:
    db = tmp_path / "log.db"
    res = chainrun("replay", str(short_replay(tmp_path, 3)), "--config", str(lab_config),
                   "--db", str(db), "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    with Store.open(db) as store:
        turns = {t.id: t for t in store.turns(1)}
        calls = store.calls(1)
    sent = [c for c in calls if c.started_offset_ms is not None]
    assert len(turns) == 3 and len(sent) >= 3 * 3  # compose, validate, critique
    one_ms = timedelta(milliseconds=1)  # both sides are truncated to the ms
    for c in sent:
        assert c.started_at is not None and AT_FORMAT.fullmatch(c.started_at), c.started_at
        turn = turns[c.turn_id]
        assert turn.started_at is not None and AT_FORMAT.fullmatch(turn.started_at)
        began = datetime.fromisoformat(turn.started_at)
        ended = began + timedelta(milliseconds=turn.duration_ms or 0)
        assert began - one_ms <= datetime.fromisoformat(c.started_at) <= ended + one_ms, (
            c.step, c.started_at, turn.started_at, turn.duration_ms)
    assert all(c.started_at is None for c in calls if c.started_offset_ms is None)
