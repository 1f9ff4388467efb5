"""--json: every error, usage errors included, is one JSON document on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import chainrun

ROOT = Path(__file__).resolve().parents[1]


REPLAY = ROOT / "replays" / "commerce-12.jsonl"


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


def test_a_log_write_given_up_during_an_outage_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A database that stayed away past the writer's patience ends a command in one line
    (error type log_write) and exit 2, never a traceback (seen when PostgreSQL went away
    during a replay and the run's end could not be written)."""
    import typer

    from chainrun.cli import handle_errors
    from chainrun.log.writer import LogWriteLost

    @handle_errors
    def command(as_json: bool = False) -> None:
        raise LogWriteLost("run log postgresql://db: the database has been unreachable for "
                           "14 s; the write is still queued")  # fmt: skip

    with pytest.raises(typer.Exit) as exited:
        command(as_json=True)
    assert exited.value.exit_code == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["error"]["message"].startswith("run log postgresql://db")
    assert err.count("\n") == 1 and "unreachable for 14 s" in err and "Traceback" not in err
