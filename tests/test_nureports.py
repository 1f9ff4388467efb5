"""The new user's findings on evals, advise, reports, opening the log and config errors.

Each test reproduces what the new user ran and fails without its fix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from sqlite_utils.utils import sqlite3

from chainrun import local
from chainrun.chain import Chain
from chainrun.config import config_from_dict, load_config
from chainrun.errors import ConfigError, ProviderUnavailable, UserInputError
from chainrun.evals import load_cases
from chainrun.evals.runner import run_eval
from chainrun.lab import LabServer
from chainrun.providers.fake import FakeProvider
from chainrun.store import Store
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


# -- 4. every provider's environment is checked before anything starts -------------------

RESPONSES_TOML = """
[providers.openai]
base_url = "https://api.openai.com/v1"
api_key_env = "CHAINRUN_NUREPORTS_KEY"
api = "responses"

[steps.compose]
provider = "openai"
model = "gpt-5-mini"
reasoning_effort = "minimal"
stop = []
temperature = 1
"""


@pytest.mark.parametrize(("value", "said"), [(None, "is not set"), ("", "is empty")])
async def test_a_missing_key_is_said_before_the_local_model_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None, said: str
) -> None:
    """The README's Responses example (compose on openai, the other steps on the local
    model): the key's absence was said only after llama-server had started."""
    if value is None:
        monkeypatch.delenv("CHAINRUN_NUREPORTS_KEY", raising=False)
    else:
        monkeypatch.setenv("CHAINRUN_NUREPORTS_KEY", value)
    started: list[bool] = []
    monkeypatch.setattr(local, "up", lambda **_: started.append(True))
    path = tmp_path / "resp.toml"
    path.write_text(RESPONSES_TOML)
    chain = Chain(load_config(path), quiet=True)
    with pytest.raises(ConfigError) as info:
        await chain.open()
    assert str(info.value) == (
        f"{path}: providers.openai.api_key_env: environment variable CHAINRUN_NUREPORTS_KEY "
        + said
        + (' (set to "")' if value == "" else "")
    )
    assert info.value.path == str(path)
    assert started == []  # the local model was never started


def test_the_cli_names_the_config_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "resp.toml"
    path.write_text(RESPONSES_TOML)
    env = {k: v for k, v in os.environ.items() if k != "CHAINRUN_NUREPORTS_KEY"}
    proc = chainrun("run", "hi", "--config", str(path), "--db", str(tmp_path / "r.db"), env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"chainrun: error: {path}: providers.openai.api_key_env: environment variable "
        "CHAINRUN_NUREPORTS_KEY is not set"
    )
    assert "starting the local model" not in proc.stderr
    assert not (tmp_path / "r.db").exists()


# -- 6. config errors naming file and field ----------------------------------------------


def test_a_hedge_that_can_never_fire_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[steps.classify.hedge]\ndelay = "p95"\nmax_attempts = 1\n')
    with pytest.raises(ConfigError, match=r"c\.toml: steps\.classify\.hedge: max_attempts: a "
                       r"hedge needs at least 2 .* can never fire"):  # fmt: skip
        load_config(path)


def test_azure_with_both_a_key_and_an_entra_token_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[providers.azure]\nkind = "azure"\nendpoint = "https://x.openai.azure.com"\n'
        'api_version = "2024-10-21"\napi_key_env = "K"\nentra_token_env = "T"\n'
    )
    with pytest.raises(ConfigError, match=r"c\.toml: providers\.azure: api_key_env and "
                       "entra_token_env are both set: give one"):  # fmt: skip
        load_config(path)


def test_a_refused_first_call_does_not_repeat_itself() -> None:
    """A server answering 404 to everything said
    ``... (HTTP 404): local: HTTP 404: Error code: 404``."""
    from chainrun.errors import RequestRejected, StepConfigError

    bare = StepConfigError("compose", "local", RequestRejected("local: HTTP 404: Error code: 404",
                                                               404, provider="local"))  # fmt: skip
    assert str(bare) == (
        "steps.compose: provider 'local' refused the model or URL on the step's first call "
        "(HTTP 404)"
    )
    said = StepConfigError("compose", "local", RequestRejected(
        "local: HTTP 404: The model 'x' does not exist", 404, provider="local"))  # fmt: skip
    assert str(said).endswith("(HTTP 404): The model 'x' does not exist")


# -- 3. a log in a directory (or a file) this process cannot write ------------------------


def _read_only(path: Path) -> Iterator[Path]:
    """Make ``path`` not writable by this process (chmod, or chattr +i for root)."""
    path.chmod(0o555 if path.is_dir() else 0o444)
    how = "chmod"
    if os.access(path, os.W_OK):  # root: permission bits do not stop it
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            path.chmod(0o755)
            pytest.skip("cannot make a path read-only here (root without chattr)")
        how = "chattr"
    try:
        yield path
    finally:
        if how == "chattr":
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def ro_log(tmp_path: Path) -> Iterator[Path]:
    """A valid log with one run, in a directory this process cannot write."""
    d = tmp_path / "rodir"
    d.mkdir()
    with Store.open(d / "log.db") as s:
        s.create_run("replay", "{}", label="ro")
    assert sorted(p.name for p in d.iterdir()) == ["log.db"]  # closed: WAL checkpointed
    yield from _read_only(d)


def test_readers_read_a_log_in_a_read_only_directory(ro_log: Path) -> None:
    db = ro_log / "log.db"
    with Store.open(db, create=False) as s:
        assert [r.label for r in s.list_runs()] == ["ro"]
    proc = chainrun("runs", "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["label"] for r in json.loads(proc.stdout)["runs"]] == ["ro"]
    assert sorted(p.name for p in ro_log.iterdir()) == ["log.db"]


def test_a_wal_with_changes_in_a_read_only_directory_is_said_exactly(tmp_path: Path) -> None:
    d = tmp_path / "rodir"
    d.mkdir()
    with Store.open(d / "log.db") as s:
        s.create_run("replay", "{}")
    (d / "log.db-wal").write_bytes(b"\0" * 32)  # a crashed writer's leftover
    for _ in _read_only(d):
        with pytest.raises(UserInputError) as info:
            Store.open(d / "log.db", create=False)
        msg = str(info.value)
        assert msg.startswith(f"{d / 'log.db'}: cannot read: the directory {d} is not writable")
        assert "log.db-shm" in msg


def test_writing_a_read_only_log_names_the_file(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as s:
        s.create_run("replay", "{}")
    for _ in _read_only(db):
        for create in (True, False):
            with Store.open(db, create=create) as s:  # a writer, a reader: both can read
                assert len(s.list_runs()) == 1
                with pytest.raises(sqlite3.OperationalError, match="readonly"):
                    s.create_run("replay", "{}")


def test_the_cli_names_the_log_a_write_failed_on(capsys: pytest.CaptureFixture[str]) -> None:
    from chainrun.cli import handle_errors

    @handle_errors
    def command(db: Path, as_json: bool = False) -> None:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    with pytest.raises(typer.Exit):
        command(db=Path("ro/log.db"), as_json=True)
    captured = capsys.readouterr()
    assert "ro/log.db: the log database is not writable (attempt to write a readonly" in (
        " ".join(captured.err.split())
    )
    assert json.loads(captured.out)["error"]["file"] == "ro/log.db"


# -- 2. advise: a loser cancelled at 24 ms is not "never answers" --------------------------


def log_fast_hedged_classify(store: Store, n: int = 300, seed: int = 11) -> int:
    """The fast lab with a classify hedge (delay p95, 5 ms to start): every call answers in
    <= 23 ms; a few primaries were cancelled at 23.9 ms, longer than the slowest answer."""
    import random

    from chainrun.records import CallRow, StepRow, TurnLog, TurnRow

    rng = random.Random(seed)
    hedge = {"delay": "p95", "initial_delay_ms": 5, "max_attempts": 2}
    run = store.create_run("replay", json.dumps(
        {"steps": {"classify": {"deadline_s": 3.0, "hedge": hedge}}}))  # fmt: skip
    for i in range(n):
        if i % 30 == 0:  # the primary lost to the copy sent at 5 ms, cancelled at 23.9 ms
            calls = [
                CallRow(step="classify", outcome="cancelled"),
                CallRow(step="classify", attempt=2, started_offset_ms=5.0, ttft_ms=18.9,
                        duration_ms=18.9, outcome="duplicate"),
            ]  # fmt: skip
            step = StepRow(step="classify", duration_ms=23.9, n_attempts=2,
                           hedge_delay_ms=5.0, hedge_fired=True, hedge_won=True)  # fmt: skip
        else:
            ms = rng.uniform(3.0, 23.0)
            calls = [CallRow(step="classify", ttft_ms=ms, duration_ms=ms, outcome="not_fired")]
            step = StepRow(step="classify", duration_ms=ms, n_attempts=1, hedge_delay_ms=5.0)
        store.log_turn(run, TurnLog(TurnRow(input="m"), steps=[step], calls=calls))
    return run


def test_advise_puts_the_censored_tail_at_the_longest_time_not_never(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from chainrun.advise import advise
    from chainrun.cli import app

    with Store.open(":memory:") as store:
        run = log_fast_hedged_classify(store)
        res = advise(store, run, "classify", deadline_s=3.0, max_extra_calls=1.05,
                     simulations=4000)  # fmt: skip
    # before: the cancelled primaries' leftover Kaplan-Meier mass was drawn as "never",
    # so one attempt missed a 3 s deadline in ~3% of turns although nothing took 24 ms
    assert res["baseline"]["in_time"] == 1.0
    assert res["baseline"]["p99_ms"] is not None and res["baseline"]["p99_ms"] < 30
    tail = res["censored_tail"]
    assert tail["at_ms"] == 23.9 and 0 < tail["share"] < 0.2 and not tail["beyond_deadline"]
    assert "None" not in res["recommendation"]["reason"]
    lo, hi = res["validation"]["observed"]["extra_calls_per_turn_ci95"]
    assert 0 <= lo < res["validation"]["observed"]["extra_calls_per_turn"] < hi <= 1

    db = tmp_path / "log.db"
    with Store.open(db) as s:
        run = log_fast_hedged_classify(s)
    runner = CliRunner()
    for bad in ("0", "-1"):
        out = runner.invoke(app, ["advise", "--run", str(run), "--step", "classify", "--db",
                                  str(db), "--deadline-s", bad])  # fmt: skip
        assert out.exit_code == 2
        assert "--deadline-s must be > 0 s" in " ".join(out.output.split())


def test_a_deadline_cut_call_still_misses_the_deadline() -> None:
    """Efron's tail sits just above the longest time: a call cut at the 3 s deadline (the
    longest logged time) is not counted in time at a 3 s deadline."""
    import numpy as np

    from chainrun.advise import _Calls, _impute

    nan = float("nan")
    calls = _Calls(
        settle=np.array([100.0, 200.0, nan]), ttft=np.array([100.0, 200.0, nan]),
        per_token=np.full(3, nan), work=np.full(3, nan), censored_at=np.array([nan, nan, 3000.0]),
        stream=False, n_split=0, n_errors_fast=0,
    )  # fmt: skip
    out = _impute(calls, np.random.default_rng(0))
    assert out[2] > 3000.0 and out[2] < 3000.001


# -- 5. every percentile with n and an interval; 6. show's text and a closed pipe ---------


def _log_run(db: Path, n: int = 120, label: str | None = None) -> int:
    from chainrun.records import CallRow, StepRow, TurnLog, TurnRow

    with Store.open(db) as s:
        run = s.create_run("replay", "{}", label=label)
        for i in range(n):
            ms = 10.0 + i
            hedged = i % 4 == 0
            s.log_turn(run, TurnLog(
                TurnRow(input="m", output="o", duration_ms=ms + 5, answer_ttft_ms=ms,
                        answer_done_ms=ms + 4),
                steps=[StepRow(step="compose", kind="llm", duration_ms=ms,
                               hedge_delay_ms=20.0, hedge_fired=hedged,
                               hedge_won=hedged and i % 8 == 0)],
                calls=[CallRow(step="compose", ttft_ms=5.0 + i % 7, duration_ms=ms,
                               outcome="not_fired")],
            ))  # fmt: skip
        s.finish_run(run, "complete")
    return run


def test_reports_give_every_percentile_and_rate_an_interval(tmp_path: Path) -> None:
    from chainrun.report import hedge_stats, latency_summary

    db = tmp_path / "log.db"
    run = _log_run(db)
    with Store.open(db, create=False) as s:
        summary = latency_summary(s, run)
        hs = hedge_stats(s, run)["steps"]["compose"]
    assert summary["turn"]["p50_ci"][0] <= summary["turn"]["p50_ms"] <= summary["turn"]["p50_ci"][1]
    assert summary["turn"]["p90_ci"] is not None
    step = summary["steps"]["compose"]
    assert step["p50_ci"] and step["p90_ci"] and step["ttft_p50_ci"] and step["ttft_n"] == 120
    lo, hi = hs["fire_rate_ci95"]
    assert 0 <= lo < hs["fire_rate"] == 0.25 < hi <= 1
    assert hs["win_rate_ci95"][0] < hs["win_rate"] < hs["win_rate_ci95"][1]

    wide = {**os.environ, "COLUMNS": "250"}
    shown = chainrun("show", str(run), "--db", str(db), env=wide)
    assert shown.returncode == 0, shown.stderr
    assert "p50 ms [95% CI]" in shown.stdout and "None" not in shown.stdout
    turn = summary["turn"]
    assert f"{turn['p50_ms']:.0f} [{turn['p50_ci'][0]:.0f}, {turn['p50_ci'][1]:.0f}]" in (
        shown.stdout
    )
    hedge = chainrun("hedge-stats", str(run), "--db", str(db), env=wide)
    assert "fire rate [95% CI]" in hedge.stdout
    assert f"0.250 [{lo:.3f}, {hi:.3f}]" in hedge.stdout
    cmp = chainrun("compare", str(run), str(run), "--db", str(db), env=wide)
    assert cmp.returncode == 0, cmp.stderr
    assert "p50 A [95% CI]" in cmp.stdout
    assert f"{turn['p50_ms']:.0f} [{turn['p50_ci'][0]:.0f}, {turn['p50_ci'][1]:.0f}]" in (
        cmp.stdout
    )


def test_show_prints_no_python_reprs_and_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    run = _log_run(db, n=300)
    proc = subprocess.run(
        f"{sys.executable} -m chainrun show {run} --db {db} | head -1",
        shell=True, capture_output=True, text=True, timeout=120,
        executable="/bin/bash",
    )  # fmt: skip
    assert proc.stdout == f"run {run}: replay complete label=- source=-\n"
    assert proc.stderr == ""
    status = subprocess.run(
        f"{sys.executable} -m chainrun show {run} --db {db} | head -1 >/dev/null; "
        'echo "${PIPESTATUS[0]}"',
        shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash",
    )  # fmt: skip
    assert status.stdout.strip() == "141"  # as `seq 1000000 | head -1`: killed by SIGPIPE
    assert status.stderr == ""
