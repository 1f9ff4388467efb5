"""What a new user tripped over (issue 16), each case as the user met it: the CLI
against the latency lab as the model server. Commands run in-process through click's
runner (the same code path, without a Python start-up per command); the lab server
and the stand-in of another install's llama-server are real processes."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from chainrun.cli import app, main
from chainrun.cli.commands_eval import _verdict
from chainrun.lab import LabServer
from chainrun.store import Store

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"


def chainrun(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run one chainrun command; ``.returncode``, ``.stdout`` and ``.stderr`` as a user sees."""
    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    return Result(result.exit_code, result.stdout, result.stderr)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _short_replay(tmp_path: Path, n: int = 3) -> Path:
    """The first ``n`` requests of the shipped replay set (a faster run of the same kind)."""
    p = tmp_path / f"replay-{n}.jsonl"
    p.write_text("".join(REPLAY.read_text().splitlines(keepends=True)[:n]))
    return p


def _read_json_doc(stream: Any, timeout_s: float = 20.0) -> dict[str, Any]:
    """Read lines until they form one JSON document."""
    text = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        text += line
        try:
            doc: dict[str, Any] = json.loads(text)
            return doc
        except json.JSONDecodeError:
            continue
    raise AssertionError(f"no JSON document on stdout: {text!r}")


def test_lab_serve_port_0_json_prints_the_bound_port() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "chainrun", "lab", "serve", "--port", "0", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        doc = _read_json_doc(proc.stdout)
        assert doc["port"] != 0 and doc["base_url"].endswith(f":{doc['port']}/v1")
        with urllib.request.urlopen(f"{doc['base_url']}/models", timeout=5) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)


# -- --json errors ---------------------------------------------------------------------


def test_json_errors_are_one_json_document_on_stdout(lab_config: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "message": "hi"}\n{"id": "b", "message": }\n')
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(bad), "--config", str(lab_config), "--db", str(db), "--json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["error"]["type"] == "input_file_error"
    assert doc["error"]["file"] == str(bad) and doc["error"]["line"] == 2
    assert "not valid JSON" in doc["error"]["message"]
    assert len(proc.stderr.strip().splitlines()) == 1 and f"{bad}:2" in proc.stderr
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[steps.compose]\nreasoning_effort = "extreme"\n')
    proc = chainrun("replay", str(REPLAY), "--config", str(cfg), "--db", str(db), "--json")
    assert proc.returncode == 2
    err = json.loads(proc.stdout)["error"]
    assert err["type"] == "config_error" and err["file"] == str(cfg) and err["line"] is None
    assert "steps.compose.reasoning_effort" in err["message"]
    toml = tmp_path / "broken.toml"
    toml.write_text("[steps\n")
    err = json.loads(chainrun("run", "hi", "--config", str(toml), "--json").stdout)["error"]
    assert err["type"] == "config_error" and err["line"] == 1
    proc = chainrun("show", "7", "--db", str(tmp_path / "none.db"), "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["message"]
    # without --json stdout stays empty
    proc = chainrun("replay", str(bad), "--config", str(lab_config), "--db", str(db))
    assert proc.returncode == 2 and proc.stdout == ""


# -- evals -----------------------------------------------------------------------------


def _cases(path: Path, *cases: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


RUBRIC_ONLY = (
    {"id": "r1", "message": "Do your slim jeans run small?",
     "assert": [{"type": "llm-rubric", "value": "Answers the sizing question."}]},
    {"id": "r2", "message": "Where is my parcel?",
     "assert": [{"type": "llm-rubric", "value": "Does not invent order details."}]},
)  # fmt: skip


def test_eval_says_why_llm_rubric_was_skipped_and_can_fail_on_it(
    lab_config: Path, tmp_path: Path
) -> None:
    # the grader is the chain's local provider (here the lab), whose replies are no pass/fail
    cases = _cases(tmp_path / "rubric.jsonl", *RUBRIC_ONLY)
    db = tmp_path / "log.db"
    proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 1 and "skipped 2 llm-rubric" in skipped[0]
    assert "gave no pass/fail" in skipped[0] and "[grader]" in skipped[0]
    proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db), "--json",
                    "--fail-on-skipped")  # fmt: skip
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["skipped"]["llm-rubric"]["n"] == 2 and doc["cases"]["n"] == 0
    assert all(v["passed"] is None for v in doc["verdicts"]) and len(doc["verdicts"]) == 2


def test_eval_grader_is_configured_in_chainrun_toml(lab_config: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "grader.toml"
    cfg.write_text(lab_config.read_text() + '[grader]\nprovider = "nowhere"\n')
    cases = _cases(tmp_path / "rubric.jsonl", *RUBRIC_ONLY)
    proc = chainrun("eval", str(cases), "--config", str(cfg), "--db", str(tmp_path / "l.db"))
    assert proc.returncode == 2 and "grader.provider: unknown provider 'nowhere'" in proc.stderr


def test_eval_assertion_naming_a_missing_step_is_caught_at_load(
    lab_config: Path, tmp_path: Path
) -> None:
    def case(case_id: str, step: str) -> dict[str, Any]:
        return {"id": case_id, "message": "hi",
                "assert": [{"type": "equals", "step": step, "value": "a"}]}  # fmt: skip

    cases = _cases(tmp_path / "typo.jsonl", case("ok", "label"), case("t", "clasify"))
    db = tmp_path / "log.db"
    proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db))
    assert proc.returncode == 2
    assert f"{cases}:2" in proc.stderr and "did you mean 'classify'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not db.exists()


def test_eval_run_refuses_new_run_options_and_exits_2_without_a_match(
    lab_config: Path, tmp_path: Path
) -> None:
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(_short_replay(tmp_path)), "--config", str(lab_config),
                    "--db", str(db), "--json")  # fmt: skip
    run_id = json.loads(proc.stdout)["run_id"]
    cases = _cases(tmp_path / "c.jsonl", {"id": "x", "message": "not in the replay",
                                          "assert": [{"type": "contains", "value": "a"}]})
    proc = chainrun("eval", str(cases), "--run", str(run_id), "--config", str(lab_config),
                    "--db", str(db), "--repeat", "2", "--concurrency", "4",
                    "--label", "x")  # fmt: skip
    assert proc.returncode == 2 and "existing run" in proc.stderr
    assert "--repeat, --concurrency, --label: only for a new eval run" in proc.stderr
    proc = chainrun("eval", str(cases), "--run", str(run_id), "--config", str(lab_config),
                    "--db", str(db), "--repeat", "1")  # fmt: skip
    assert proc.returncode == 2 and "--repeat: only for a new eval run" in proc.stderr
    proc = chainrun("eval", str(cases), "--run", str(run_id), "--config", str(lab_config),
                    "--db", str(db))  # fmt: skip
    assert proc.returncode == 2
    assert f"run {run_id}: none of its 3 turns matches a case" in proc.stderr


# -- providers -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dead_hedge_target_does_not_block_the_run(lab: LabServer, tmp_path: Path) -> None:
    cfg = tmp_path / "hedged.toml"
    cfg.write_text(
        f'[providers.local]\nbase_url = "{lab.base_url}"\n'
        f'[providers.backup]\nbase_url = "http://127.0.0.1:{_free_port()}/v1"\n'
        '[steps.classify.hedge]\ndelay_ms = 1\nmax_attempts = 2\ntargets = ["local", "backup"]\n'
    )
    db = tmp_path / "log.db"
    replay = _short_replay(tmp_path)
    proc = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "backup" in line]
    assert len(warnings) == 1 and "circuit breaker starts open" in warnings[0]
    doc = json.loads(proc.stdout)
    assert doc["turn"]["n"] == 3 and doc["status"] == "complete"
    with Store.open(db) as store:
        calls = store.calls(doc["run_id"])
        assert all(t.status == "ok" for t in store.turns(doc["run_id"]))
    to_backup = [c for c in calls if c.target == "backup"]
    assert to_backup and all(c.outcome == "suppressed" for c in to_backup)  # never sent
    # an unreachable primary still stops the run
    cfg.write_text(cfg.read_text().replace('targets = ["local", "backup"]',
                                           'targets = ["backup", "local"]')
                   + '[steps.compose]\nprovider = "backup"\n')  # fmt: skip
    proc = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2 and "cannot reach provider 'backup'" in proc.stderr


@pytest.fixture
def static_server(tmp_path: Path) -> Iterator[str]:
    """A plain static file server (not an OpenAI API) serving an empty directory."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_server_that_is_not_an_openai_api_stops_at_preflight(
    static_server: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "static.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{static_server}/v1"\n')
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(REPLAY), "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2
    assert "not an OpenAI-compatible API" in proc.stderr
    assert "HTTP 404 with text/html" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # a 200 that is no model list (a file where /v1/models would be) is caught too
    models = tmp_path / "www" / "v1" / "models"
    models.parent.mkdir()
    models.write_text("<html>hello</html>")
    proc = chainrun("run", "hi", "--config", str(cfg), "--db", str(db))
    assert proc.returncode == 2 and "HTTP 200" in proc.stderr
    with Store.open(db) as store:
        assert all(r.status != "complete" for r in store.list_runs())


# -- the local server ------------------------------------------------------------------

_HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_local_status_and_down_leave_another_installs_server_alone(tmp_path: Path) -> None:
    # another virtualenv's llama-server (a stand-in answering /health), recorded in the
    # shared state directory the way that install's chainrun records it
    other_bin = tmp_path / "other-venv" / "bin" / "llama-server"
    other_bin.parent.mkdir(parents=True)
    other_bin.symlink_to(sys.executable)
    model = tmp_path / "other-model.gguf"
    port = _free_port()
    args = [str(other_bin), "-c", _HEALTH_SERVER, str(port), "--model", str(model)]
    proc = subprocess.Popen(args, start_new_session=True)
    home = tmp_path / "home"
    home.mkdir()
    (home / "local-server.json").write_text(json.dumps({  # as an older chainrun wrote it
        "pid": proc.pid, "port": port, "model_path": str(model), "started_at": time.time(),
        "log_path": str(home / "llama-server.log")}))  # fmt: skip
    env = {"CHAINRUN_HOME": str(home)}
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            time.sleep(0.05)
        status = chainrun("local", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["running"] is False  # not this install's server
        assert [(o["pid"], o["binary"]) for o in doc["others"]] == [(proc.pid, str(other_bin))]
        text = chainrun("local", "status", env=env).stdout
        assert "not running" in text and "another install's server" in text
        down = chainrun("local", "down", env=env)
        assert down.returncode == 2 and "another install's" in down.stderr
        assert "--force" in down.stderr and proc.poll() is None  # left alone
        forced = chainrun("local", "down", "--force", "--json", env=env)
        assert forced.returncode == 0, forced.stderr
        assert json.loads(forced.stdout)["pid"] == proc.pid
        assert proc.wait(timeout=10) is not None
        assert not list(home.glob("local-server*.json"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_json_usage_errors_are_a_json_document_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["chainrun", "runs", "--limit", "0", "--json"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    err = json.loads(captured.out)["error"]
    assert err["type"] == "usage_error" and "--limit" in err["message"]
    assert len(captured.err.strip().splitlines()) == 1


# -- summaries of interrupted runs: one rule -----------------------------------------


def _interrupted_run(db: Path) -> int:
    """A replay interrupted by Ctrl-C: 6 completed turns, 2 cancelled after 156 and 104 ms
    (partial durations), 1 refused and 1 errored turn."""
    from chainrun.records import CallRow, StepRow, TurnLog, TurnRow

    with Store.open(db) as store:
        run = store.create_run("replay", "{}")
        statuses = ["ok"] * 6 + ["cancelled", "cancelled", "refused", "error"]
        durations = [1000.0, 1100.0, 1200.0, 1300.0, 1400.0, 1500.0, 156.0, 104.0, 900.0, 50.0]
        for i, (status, ms) in enumerate(zip(statuses, durations, strict=True)):
            turn = TurnLog(TurnRow(input=f"m{i}", status=status, duration_ms=ms))  # type: ignore[arg-type]
            step_status = "cancelled" if status == "cancelled" else "ok"
            turn.steps = [StepRow(step="compose", status=step_status, duration_ms=ms - 10)]  # type: ignore[arg-type]
            turn.calls = [CallRow(step="compose", ttft_ms=ms / 4, output_tokens=20)]
            store.log_turn(run, turn)
        store.finish_run(run, "interrupted")
    return run


def test_every_summary_counts_only_completed_turns(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    run = _interrupted_run(db)
    counts = {"n_completed": 6, "n_cancelled": 2, "n_refused": 1, "n_replaced": 0,
              "n_errored": 1}
    shown = json.loads(chainrun("show", str(run), "--db", str(db), "--json").stdout)["summary"]
    assert shown["turn"]["n"] == 6 and shown["turns"] == counts
    assert shown["turn"]["p50_ms"] == 1200.0  # not pulled down by 156 ms and 104 ms
    assert shown["steps"]["compose"]["n"] == 6
    compared = json.loads(chainrun("compare", str(run), str(run), "--db", str(db),
                                   "--json").stdout)  # fmt: skip
    assert compared["turn"]["a"]["n"] == 6 and compared["a"]["turns"] == counts
    assert compared["steps"]["compose"]["a"]["n"] == 6
    hedging = json.loads(chainrun("hedge-stats", str(run), "--db", str(db), "--json").stdout)
    assert hedging["n_turns"] == 6 and hedging["turns"] == counts
    assert hedging["steps"]["compose"]["n"] == 6
    text = chainrun("show", str(run), "--db", str(db)).stdout
    assert "over 6 completed turns" in text and "2 cancelled, 1 refused, 1 errored" in text
    text = chainrun("compare", str(run), str(run), "--db", str(db)).stdout
    assert "A: over 6 completed turns" in text
    # the audit: the same rule, the same n, the others counted beside
    proc = chainrun("audit", "--run", str(run), "--db", str(db), "--format", "json", "--out", "-")
    assert proc.returncode == 0, proc.stderr
    items = {i["id"]: i for i in json.loads(proc.stdout)["items"]}
    live_vs_replay = items[7]["figures"]
    assert live_vs_replay["metrics"]["turn"][f"replay run {run}"]["n"] == 6
    assert live_vs_replay["metrics"]["turn"][f"replay run {run}"]["p50_ms"] == 1200.0
    assert live_vs_replay["metrics"]["compose"][f"replay run {run}"]["n"] == 6
    assert live_vs_replay["turns"][f"replay run {run}"] == counts
    assert "(2 cancelled, 1 refused, 1 errored left out)" in items[7]["evidence"]
    assert items[5]["figures"]["steps"]["compose"]["?"]["n"] == 6  # winning calls


def test_compare_says_which_difference_decided_its_verdict(tmp_path: Path) -> None:
    from chainrun.records import TurnLog, TurnRow

    db = tmp_path / "log.db"
    with Store.open(db) as store:
        runs = []
        for shift in (0.0, 500.0):  # B: its slowest 25% are 500 ms slower, the median is not
            run = store.create_run("replay", "{}")
            for i in range(200):
                ms = 1000.0 + i + (shift if i >= 150 else 0.0)
                store.log_turn(run, TurnLog(TurnRow(input=f"m{i}", duration_ms=ms)))
            store.finish_run(run, "complete")
            runs.append(run)
    doc = json.loads(chainrun("compare", str(runs[0]), str(runs[1]), "--db", str(db),
                              "--json").stdout)  # fmt: skip
    turn = doc["turn"]
    assert turn["verdict"] == "worse" and turn["decided_by"] in ("p90", "p99")
    assert turn["diff"]["p50_ci"][0] <= 0  # the p50 alone would not say worse
    # the table's verdict cell names the deciding difference and its interval
    cell = _verdict(turn)
    lo, hi = turn["diff"][f"{turn['decided_by']}_ci"]
    assert cell.startswith(f"worse ({turn['decided_by']} +") and f"[{lo:.0f}, {hi:.0f}])" in cell


def _near_constant_runs(db: Path) -> tuple[int, int]:
    """Two runs of 200 turns with near-constant latency (1000-1006 ms); B is 2% slower
    per turn and 1% slower in its one step: a real difference, but a tiny one."""
    from chainrun.records import StepRow, TurnLog, TurnRow

    with Store.open(db) as store:
        runs = []
        for factor, step_factor in ((1.0, 1.0), (1.02, 1.01)):
            run = store.create_run("replay", "{}")
            for i in range(200):
                ms = 1000.0 + i % 7
                turn = TurnLog(TurnRow(input=f"m{i}", duration_ms=ms * factor))
                turn.steps = [StepRow(step="compose", duration_ms=(ms - 100) * step_factor)]
                store.log_turn(run, turn)
            store.finish_run(run, "complete")
            runs.append(run)
    return runs[0], runs[1]


def test_compare_min_effect_calls_a_tiny_real_difference_same(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    a, b = (str(r) for r in _near_constant_runs(db))

    def compared(*extra: str) -> dict[str, Any]:
        proc = chainrun("compare", a, b, "--db", str(db), "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    strict = compared("--min-effect", "0")  # the intervals alone: B is slower, for real
    assert strict["turn"]["verdict"] == "worse" and strict["steps"]["compose"]["verdict"] == "worse"
    assert strict["regressions"] == ["turn", "compose"]
    assert 0 < strict["turn"]["diff"]["p50_ci"][0] and strict["turn"]["diff"]["p50_ms"] < 25
    doc = compared("--min-effect", "5%", "--fail-on-regression", "any")
    assert doc["min_effect"] == {"text": "5%", "value": 5.0, "unit": "%"}
    assert doc["turn"]["verdict"] == "same" and doc["steps"]["compose"]["verdict"] == "same"
    assert doc["turn"]["decided_by"] == "p50" and doc["regressions"] == []
    assert doc["turn"]["diff"]["tolerance_ms"]["p50"] == pytest.approx(50.15)
    assert doc["regression"] is False
    assert compared()["min_effect"]["text"] == "5%"  # the default
    ms = compared("--min-effect", "10ms")  # 20 ms slower is beyond a 10 ms tolerance
    assert ms["min_effect"]["unit"] == "ms" and ms["turn"]["verdict"] == "worse"
    # compose is 9 ms slower: under 10 ms, but its interval reaches past it
    compose = ms["steps"]["compose"]
    assert compose["diff"]["p50_ms"] < 10 < compose["diff"]["p50_ci"][1]
    assert compose["verdict"] == "inconclusive"
    text = chainrun("compare", a, b, "--db", str(db), "--min-effect", "5%").stdout
    assert "min effect 5%: a difference shown to lie within it is 'same'" in text
    assert _verdict(doc["turn"]) == "same (p50 +20 [18, 22] within ±50)"  # the table's cell
    for bad in ("5", "five%", "-3%", "20s"):
        proc = chainrun("compare", a, b, "--db", str(db), "--min-effect", bad)
        assert proc.returncode == 2 and f"--min-effect {bad!r}" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_compare_counts_and_names_skipped_eval_verdicts(lab_config: Path, tmp_path: Path) -> None:
    # each case: one checkable assertion and one llm-rubric the lab's replies cannot grade
    cases = _cases(
        tmp_path / "mixed.jsonl",
        *(
            {**c, "assert": [*c["assert"], {"type": "not-contains", "value": "XYZZY"}]}
            for c in RUBRIC_ONLY
        ),
    )
    db = tmp_path / "log.db"
    runs = []
    for _ in range(2):
        proc = chainrun("eval", str(cases), "--config", str(lab_config), "--db", str(db), "--json")
        assert proc.returncode == 0, proc.stderr
        runs.append(str(json.loads(proc.stdout)["run_id"]))
    proc = chainrun("compare", *runs, "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    ev = json.loads(proc.stdout)["evals"]
    assert ev["n_pairs"] == 2 and ev["a"]["passed"] == 2  # the not-contains verdicts
    for side in ("a", "b"):
        sk = ev["skipped"][side]
        assert sk["n"] == 2 and sk["cases"] == 2
        assert sk["by_type"]["llm-rubric"]["n"] == 2
        assert "gave no pass/fail" in sk["by_type"]["llm-rubric"]["reason"]
    assert set(ev["by_type"]) == {"not-contains"}  # no verdict, no pass rate
    text = chainrun("compare", *runs, "--db", str(db)).stdout
    lines = [line for line in text.splitlines() if "skipped" in line]
    assert [line.split(" (")[0] for line in lines] == [
        "A: skipped 2 llm-rubric", "B: skipped 2 llm-rubric"]  # fmt: skip
    assert all("in no pass rate" in line and "[grader]" in line for line in lines)
    assert "evals (paired on 2 cases): A 2/2 = 1.00" in text
    proc = chainrun("compare", *runs, "--db", str(db), "--fail-on-skipped")
    assert proc.returncode == 1


# -- issue 16 re-checked as a new user: what the earlier tests did not cover --------------


def _readme_block(after: str, lang: str) -> str:
    """The first ```lang block of the README after the text ``after``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"```{lang}\n", text.index(after)) + len(lang) + 4
    return text[start : text.index("```", start)]


def test_readme_catalogue_examples_load_as_documented(tmp_path: Path) -> None:
    from chainrun.catalog import all_products
    from chainrun.store import Store

    db = tmp_path / "log.db"
    jsonl = tmp_path / "shop.jsonl"
    jsonl.write_text(_readme_block("**JSONL**", "json"))
    csv = tmp_path / "shop.csv"
    csv.write_text(_readme_block("**CSV**", "csv"))
    loaded = {}
    for path, n in ((jsonl, 1), (csv, 2)):
        proc = chainrun("catalog", "load", str(path), "--db", str(db), "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["loaded"] == n
        with Store.open(db) as store:
            loaded[path.suffix] = {p["id"]: p for p in all_products(store.db)}
    assert loaded[".jsonl"]["JKT-001"]["sizes"] == {"S": 2, "M": 0}
    jacket, tee = loaded[".csv"]["JKT-001"], loaded[".csv"]["TSH-004"]
    assert jacket == {**loaded[".jsonl"]["JKT-001"], "colours": ["navy"]}  # the same product
    assert jacket["stock"] == 2  # an empty stock is the sum over sizes
    assert tee["colours"] == ["white", "black"] and tee["sizes"] == {"S": 5, "M": 3, "L": 1}
    assert tee["stock"] == 9 and tee["tags"] == ["cotton"] and tee["price"] == 19.5


def test_readme_hedge_example_says_p95_never_arms_on_the_12_turn_replay(
    lab: LabServer, tmp_path: Path
) -> None:
    from chainrun.hedging.policy import HedgePolicy

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "`min_samples` answers (default 20): on the 12-turn replay that never happens" in text
    assert HedgePolicy().min_samples == 20 and len(REPLAY.read_text().splitlines()) == 12
    # the README's hedge as given (delay = "p95"), on the 12-turn replay
    cfg = tmp_path / "hedged.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n'
                   '[steps.classify]\ndeadline_s = 3\n'
                   '[steps.classify.hedge]\ndelay = "p95"\nmax_attempts = 2\n')  # fmt: skip
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(REPLAY), "--config", str(cfg), "--db", str(db), "--json",
                    "--concurrency", "4")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with Store.open(db) as store:
        steps = [s for s in store.steps(json.loads(proc.stdout)["run_id"]) if s.step == "classify"]
    assert len(steps) == 12  # d stayed initial_delay_ms (a third of deadline_s) throughout
    assert {s.hedge_delay_ms for s in steps} == {1000.0}


def test_eval_reports_flips_per_assertion(lab_config: Path, tmp_path: Path) -> None:
    """Three repeats of a case whose answer mentions the Storm Shell in two of them:
    the case fails every time (its other assertion never holds), so no case flips,
    but its icontains assertion does and is named."""
    from chainrun.records import TurnLog, TurnRow

    db = tmp_path / "log.db"
    answers = ["Try the Storm Shell.", "Try the City Drizzle.", "The Storm Shell fits."]
    with Store.open(db) as store:
        run = store.create_run("eval", "{}")
        for rep, answer in enumerate(answers):
            for case_id in ("flaky", "steady"):
                store.log_turn(run, TurnLog(TurnRow(input=case_id, output=answer,
                                                    request_id=f"{case_id}#{rep}")))  # fmt: skip
        store.finish_run(run, "complete")
    cases = _cases(
        tmp_path / "flips.jsonl",
        {"id": "flaky", "message": "flaky", "assert": [
            {"type": "contains", "value": "XYZZY"}, {"type": "icontains", "value": "storm"}]},
        {"id": "steady", "message": "steady", "assert": [{"type": "contains", "value": "T"}]},
    )  # fmt: skip
    proc = chainrun("eval", str(cases), "--run", str(run), "--config", str(lab_config),
                    "--db", str(db), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    flip = json.loads(proc.stdout)["flip"]
    assert (flip["n_cases"], flip["flipped"]) == (2, 0)
    assert flip["assertions"]["n"] == 3 and flip["assertions"]["flipped"] == 1
    assert flip["assertions"]["flipped_assertions"] == ["flaky: icontains on turn"]
    text = chainrun("eval", str(cases), "--run", str(run), "--config", str(lab_config),
                    "--db", str(db)).stdout  # fmt: skip
    assert "0/2 repeated cases and 1/3 repeated assertions changed verdict" in text
    assert "  flipped: flaky: icontains on turn" in text


def test_ctrl_c_during_a_replay_gives_one_n_everywhere(tmp_path: Path) -> None:
    """The issue's case as the user met it: Ctrl-C during a replay (a real SIGINT to a
    real process), then show, compare, hedge-stats and the audit of that run."""
    import sqlite3

    db = tmp_path / "log.db"
    with LabServer("lognormal", median_ms=150, sigma=0.1, n_tokens=8) as slow:
        cfg = tmp_path / "slow.toml"
        cfg.write_text(f'[providers.local]\nbase_url = "{slow.base_url}"\n')
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainrun", "replay", str(REPLAY), "--config", str(cfg),
             "--db", str(db), "--concurrency", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            done = 0
            while done < 3 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
                if not db.exists():
                    continue
                with contextlib.suppress(sqlite3.Error):  # read-only: never create the log
                    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
                    try:
                        row = conn.execute("select count(*) from turns where status = 'ok'")
                        done = row.fetchone()[0]
                    finally:
                        conn.close()
            if proc.poll() is not None:
                raise AssertionError(f"the replay ended before Ctrl-C: {proc.communicate()}")
            assert done >= 3
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130 and "interrupted" in stderr
    shown = json.loads(chainrun("show", "1", "--db", str(db), "--json").stdout)
    assert shown["status"] == "interrupted"
    counts = shown["summary"]["turns"]
    n = counts["n_completed"]
    assert n >= 3 and counts["n_cancelled"] >= 1  # turns in flight at Ctrl-C
    assert shown["summary"]["turn"]["n"] == n
    compared = json.loads(chainrun("compare", "1", "1", "--db", str(db), "--json").stdout)
    assert compared["turn"]["a"]["n"] == n and compared["a"]["turns"] == counts
    hedging = json.loads(chainrun("hedge-stats", "1", "--db", str(db), "--json").stdout)
    assert hedging["n_turns"] == n and hedging["turns"] == counts
    audited = chainrun("audit", "--run", "1", "--db", str(db), "--format", "json", "--out", "-")
    item7 = json.loads(audited.stdout)["items"][6]["figures"]
    assert item7["metrics"]["turn"]["replay run 1"]["n"] == n
    assert item7["turns"]["replay run 1"] == counts
    text = chainrun("show", "1", "--db", str(db)).stdout
    assert f"over {n} completed turns" in text and f"{counts['n_cancelled']} cancelled" in text


def test_readme_library_snippet_runs_as_a_file(lab_config: Path, tmp_path: Path) -> None:
    """The README's "Library API" example, copied into a file, runs as is (it once was a
    bare ``async with`` at module level: SyntaxError), here against the latency lab."""
    import os

    snippet = tmp_path / "snippet.py"
    snippet.write_text(_readme_block("## Library API", "python"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(snippet)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    status, duration_ms = proc.stdout.splitlines()[-1].split()
    assert status == "ok" and float(duration_ms) > 0
    with Store.open(tmp_path / "chainrun.db") as store:  # the snippet's log, in its cwd
        assert store.db.table("turns").count == 1
