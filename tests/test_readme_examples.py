"""The examples of the README and the docs run as documented: the tour, catalogue files,
the hedge delay's warm-up, eval flips, Ctrl-C, the library snippets."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cli_runner import chainrun

from chainrun.lab import LabServer
from chainrun.log.store import Store


def _cases(path: Path, *cases: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


ROOT = Path(__file__).resolve().parents[1]


REPLAY = ROOT / "replays" / "commerce-12.jsonl"


# -- re-checked as a new user: what the earlier tests did not cover ----------------------


def _doc_block(page: str, after: str, lang: str) -> str:
    """The first ```lang block of ``page`` (a path from the repository's root) after the
    text ``after``."""
    text = (ROOT / page).read_text(encoding="utf-8")
    start = text.index(f"```{lang}\n", text.index(after)) + len(lang) + 4
    return text[start : text.index("```", start)]


def test_readme_catalogue_examples_load_as_documented(tmp_path: Path) -> None:
    from chainrun.log.store import Store
    from chainrun.retrieval.catalog import all_products

    db = tmp_path / "log.db"
    jsonl = tmp_path / "shop.jsonl"
    jsonl.write_text(_doc_block("docs/guides/retrieval.md", "**JSONL**", "json"))
    csv = tmp_path / "shop.csv"
    csv.write_text(_doc_block("docs/guides/retrieval.md", "**CSV**", "csv"))
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

    text = " ".join((ROOT / "docs/guides/hedging.md").read_text(encoding="utf-8").split())
    assert "`min_samples` answers (default 20): on the 12-turn replay that never happens" in text
    assert HedgePolicy().min_samples == 20 and len(REPLAY.read_text().splitlines()) == 12
    # the documented hedge as given (delay = "p95"), on the 12-turn replay
    cfg = tmp_path / "hedged.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n'
                   '[steps.compose]\ndeadline_s = 3\n'
                   '[steps.compose.hedge]\ndelay = "p95"\nmax_attempts = 2\n')  # fmt: skip
    db = tmp_path / "log.db"
    proc = chainrun("replay", str(REPLAY), "--config", str(cfg), "--db", str(db), "--json",
                    "--concurrency", "4")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with Store.open(db) as store:
        steps = [s for s in store.steps(json.loads(proc.stdout)["run_id"]) if s.step == "compose"]
    assert len(steps) == 12  # d stayed initial_delay_ms (a third of deadline_s) throughout
    assert {s.hedge_delay_ms for s in steps} == {1000.0}


def test_eval_reports_flips_per_assertion(lab_config: Path, tmp_path: Path) -> None:
    """Three repeats of a case whose answer mentions the Storm Shell in two of them:
    the case fails every time (its other assertion never holds), so no case flips,
    but its icontains assertion does and is named."""
    from chainrun.log.rows import TurnLog, TurnRow

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


def _run_snippet(code: str, cwd: Path) -> list[str]:
    import os

    snippet = cwd / "snippet.py"
    snippet.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(snippet)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_library_snippet_runs_as_a_file(lab_config: Path, tmp_path: Path) -> None:
    """The docs' library example ("Serving and embedding"), copied into a file, runs as is
    (it once was a bare ``async with`` at module level: SyntaxError), against the lab."""
    code = _doc_block("docs/guides/serving.md", "## Embedding: the library API", "python")
    status, duration_ms = _run_snippet(code, tmp_path)[-1].split()
    assert status == "ok" and float(duration_ms) > 0
    with Store.open(tmp_path / "chainrun.db") as store:  # the snippet's log, in its cwd
        assert store.db.table("turns").count == 1


def test_the_readme_program_runs_as_a_file(lab_config: Path, tmp_path: Path) -> None:
    """The README's "In your own program" example runs as is, against the lab."""
    code = _doc_block("README.md", "## In your own program", "python")
    status, answer_ttft_ms, duration_ms = _run_snippet(code, tmp_path)[-1].split()
    assert status == "ok" and 0 < float(answer_ttft_ms) <= float(duration_ms)
    with Store.open(tmp_path / "chainrun.db") as store:
        assert store.db.table("turns").count == 1


def test_the_tour_runs_as_documented(tmp_path: Path) -> None:
    """The tour's config, with the lab's port, through the tour's commands: a replay of
    the twelve requests with compose hedged, then show and hedge-stats of run 1."""
    import re
    import tomllib

    tour = (ROOT / "docs" / "tour.md").read_text(encoding="utf-8")
    readme_toml = _doc_block("README.md", "## A two-minute tour", "toml")
    tour_toml = _doc_block("docs/tour.md", "Save this as `tour.toml`", "toml")
    assert tomllib.loads(readme_toml) == tomllib.loads(tour_toml)  # one tour, told twice
    assert "chainrun lab serve --scenario lognormal --median-ms 200 --sigma 1 --port 8090" in tour
    with LabServer("lognormal", median_ms=20, sigma=1.0, n_tokens=8) as lab:
        cfg = tmp_path / "tour.toml"
        cfg.write_text(tour_toml.replace("http://127.0.0.1:8090/v1", lab.base_url))
        db = str(tmp_path / "tour.db")
        replay = re.search(r"^chainrun replay .*$", tour, re.M)
        assert replay and replay.group(0) == (
            "chainrun replay replays/commerce-12.jsonl --config tour.toml --db tour.db "
            "--concurrency 4"
        )
        proc = chainrun("replay", str(REPLAY), "--config", str(cfg), "--db", db,
                        "--concurrency", "4")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "run 1 (replay, complete): 12 turns" in proc.stdout
        assert "hedging, run 1" in proc.stdout
        shown = chainrun("show", "1", "--db", db)
        assert shown.returncode == 0 and shown.stdout.count("\nturn ") == 12
        stats = json.loads(chainrun("hedge-stats", "1", "--db", db, "--json").stdout)
    assert stats["steps"]["compose"]["n_armed"] == 12  # every compose call carried the hedge
    assert stats["steps"]["validate"]["n_armed"] == 0  # and no other step's call


async def test_the_tour_needs_no_embedding_model(tmp_path: Path, monkeypatch: Any) -> None:
    """The tour says its config needs no embedding model (``pip install -e .`` installs
    none): the chain opens and answers with the MiniLM weights missing, its label from
    the keyword rules."""
    import tomllib

    from chainrun.chain import Chain
    from chainrun.config import config_from_dict
    from chainrun.providers.fake import FakeProvider, FakeReply
    from chainrun.retrieval import embeddings

    monkeypatch.setattr(embeddings, "minilm_model_dir", lambda: None)
    monkeypatch.setattr(embeddings, "_MINILMS", {})  # nothing loaded earlier in the process
    tour = tomllib.loads(_doc_block("docs/tour.md", "Save this as `tour.toml`", "toml"))
    fake = FakeProvider(name="local", script=lambda req: FakeReply("Try the Storm Shell."))
    with Store.open(tmp_path / "tour.db") as store:
        async with Chain(config_from_dict(tour), store=store, providers={"local": fake}) as chain:
            parcel = await chain.run_turn("Where is my parcel?")
            # no rule fires: the keyword method says "other" (nearest examples would
            # need the embedding model)
            hello = await chain.run_turn("Hello there")
            await chain.flush()
            steps = {s.step: s for s in store.steps(chain.run_id or 0)
                     if s.turn_id == hello.turn_id}  # fmt: skip
    assert parcel.status == "ok" and parcel.label == "order_status"
    assert hello.status == "ok" and hello.label == "other"
    assert steps["classify"].status == "ok" and steps["retrieve"].status == "ok"
