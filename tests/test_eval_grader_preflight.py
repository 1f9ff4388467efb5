"""chainrun eval checks its grader before any case runs and before the log exists."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainrun.config import config_from_dict
from chainrun.errors import ProviderUnavailable
from chainrun.evals import load_cases
from chainrun.evals.runner import run_eval
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider
from tests.conftest import reply_by_step

ROOT = Path(__file__).resolve().parents[1]


def chainrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def _five_cases(tmp_path: Path) -> Path:
    """The new user's repro: five regression cases plus one llm-rubric case."""
    lines = (ROOT / "evals" / "regression.jsonl").read_text().splitlines()
    rubric = next(line for line in lines if "llm-rubric" in line)
    p = tmp_path / "five.jsonl"
    p.write_text("\n".join([*lines[:5], rubric]) + "\n")
    return p


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers; yields its base_url."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    finally:
        s.close()



# -- 1. the eval grader is checked before any case runs ----------------------------------


def test_eval_with_a_grader_down_runs_nothing_and_writes_no_log(
    lab: LabServer, tmp_path: Path
) -> None:
    cases = _five_cases(tmp_path)
    cfg = tmp_path / "grader.toml"
    cfg.write_text(
        f'[providers.local]\nbase_url = "{lab.base_url}"\n'
        '[providers.g]\nbase_url = "http://127.0.0.1:1/v1"\n'
        '[grader]\nprovider = "g"\nmodel = "x"\n'
    )
    before = len(lab.requests())
    db = tmp_path / "new.db"
    proc = chainrun("eval", str(cases), "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "grader" in lines[0] and "'g'" in lines[0], proc.stderr
    assert "no case was run" in lines[0]
    assert not db.exists()  # no log file created
    assert len(lab.requests()) == before  # no model request for any case
    proc = chainrun("eval", str(cases), "--config", str(cfg), "--db", str(db), "--json")
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["type"] == "provider_unavailable"
    assert not db.exists()


async def test_run_eval_checks_a_silent_grader_before_any_case(silent_server: str) -> None:
    """A grader that accepts and never answers: one error naming the grader, the startup
    check and its URL, no run written, the chain's provider never called."""
    cfg = config_from_dict({
        "providers": {"g": {"base_url": silent_server, "connect_timeout_s": 0.1}},
        "grader": {"provider": "g", "model": "x"},
    })  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step())
    cases_file = ROOT / "evals" / "regression.jsonl"
    all_cases = load_cases(cases_file, steps=cfg.order)
    chosen = [c for c in all_cases if any(a.type == "llm-rubric" for a in c.asserts)][:1]
    with Store.open(":memory:") as store:
        with pytest.raises(ProviderUnavailable) as info:
            await run_eval(cfg, chosen, store, providers={"local": fake}, quiet=True)
        assert store.list_runs() == []
    msg = str(info.value)
    assert msg.startswith("grader ([grader] provider = 'g'")
    assert "startup check" in msg and silent_server in msg
    assert fake.requests == []
