"""``retrieve_command``: the thin CLI layer over the retrieve stage (tables or JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chainrun.cli import commands_retrieve as cli_retrieve
from chainrun.errors import ConfigError
from chainrun.retrieval import RetrievalSettings


@pytest.fixture(autouse=True)
def _keyword_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # no embedder in these tests: the stage's own tests cover vector and hybrid searches
    monkeypatch.setattr(
        cli_retrieve,
        "retrieval_settings",
        lambda path: RetrievalSettings(searches=["keyword", "keyword_any", "filter"]),
    )


def test_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "chainrun.db"
    cli_retrieve.retrieve_command("waterproof jacket under 100", str(db), None, True)
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["stopped_after"] == "keyword"
    assert [s["name"] for s in doc["searches"]] == ["keyword"]
    assert {"name", "ms", "n"} <= set(doc["searches"][0])
    assert len(doc["results"]) == 8 and all(r["id"] and r["price"] <= 100 for r in doc["results"])
    assert "loaded the sample catalogue" in captured.err
    # second run: the catalogue is already there
    cli_retrieve.retrieve_command("linen shirt", str(db), None, True)
    assert "loaded the sample catalogue" not in capsys.readouterr().err


def test_tables_show_searches_merged_list_and_stop_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_retrieve.retrieve_command("rain jacket in size M", str(tmp_path / "c.db"), None, False)
    out = capsys.readouterr().out
    assert "keyword: 8 hits" in out and "merged: 8 products" in out
    assert "skipped (early exit)" in out and "early exit: stopped after keyword" in out


def test_no_early_exit_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli_retrieve.retrieve_command("anything under 20?", str(tmp_path / "c.db"), None, False)
    out = capsys.readouterr().out
    assert "no early exit: every search ran" in out and "filter:" in out


def test_settings_come_from_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert cli_retrieve.retrieval_settings(None) == RetrievalSettings()  # built-in default
    with pytest.raises(ConfigError):
        cli_retrieve.retrieval_settings(str(tmp_path / "missing.toml"))
