"""chainrun hedge-stats: a fire is not a copy sent."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from cli_runner import chainrun, short_replay

from chainrun.lab import LabServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



# -- 1. hedge-stats: a fire is not a copy sent ------------------------------------------


def test_hedge_stats_with_a_dead_backup_shows_no_copy_was_sent(tmp_path: Path) -> None:
    """A backup whose breaker is open: every fire's copy is suppressed. The fire rate
    stays the timer's (1.0), beside it copies sent per call 0 and why none was sent.

    The primary answers in ~300 ms and the hedge is due after 1 ms, so the timer goes
    off before any answer can settle the race, however loaded the machine (with the
    5 ms lab an event loop stalled past both let the answer win: fire rate 0.667)."""
    with LabServer("lognormal", median_ms=300, sigma=0.05, n_tokens=8) as lab:
        _dead_backup_run(lab, tmp_path)


def _dead_backup_run(lab: LabServer, tmp_path: Path) -> None:
    cfg = tmp_path / "hedged.toml"
    cfg.write_text(
        f'[providers.local]\nbase_url = "{lab.base_url}"\n'
        f'[providers.backup]\nbase_url = "http://127.0.0.1:{_free_port()}/v1"\n'
        '[steps.critique.hedge]\ndelay_ms = 1\nmax_attempts = 2\ntargets = ["local", "backup"]\n'
    )
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(short_replay(tmp_path)), "--config", str(cfg),
                    "--db", str(db))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(chainrun("hedge-stats", "--db", str(db), "--json").stdout)
    critique = doc["steps"]["critique"]
    assert critique["fire_rate"] == 1.0 and critique["n_fired"] == 3  # the timer went off
    assert critique["copies_sent"] == 0 and critique["copies_sent_per_call"] == 0.0
    assert critique["n_fired_no_copy_sent"] == 3
    assert critique["unsent"] == {"budget_exhausted": 0, "circuit_open": 3, "loop_lag": 0,
                                   "rate_limited": 0}
    text = chainrun("hedge-stats", "--db", str(db)).stdout
    assert "sent/call" in text and "unsent b/c/l/r" in text and "0/3/0/0" in text
    assert "a fire with no copy sent cannot win" in text
    # advise critiques its prediction against this run: it says the copies never went out
    adv = json.loads(chainrun("advise", "--run", "1", "--step", "critique", "--db", str(db),
                              "--simulations", "200", "--json").stdout)  # fmt: skip
    observed = adv["validation"]["observed"]
    assert observed["copies_sent_per_call"] == 0.0 and observed["n_fired_no_copy_sent"] == 3
    assert adv["validation"]["note"].startswith("3 of 3 fires sent no copy (circuit_open 3)")
    text = chainrun("advise", "--run", "1", "--step", "critique", "--db", str(db),
                    "--simulations", "200").stdout  # fmt: skip
    assert "observed run 1: 3 of 3 fires sent no copy" in text
