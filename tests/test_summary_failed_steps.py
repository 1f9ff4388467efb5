"""A step that failed closed is counted in the summary's ``failed`` column, and a step that
ran out of time names the setting to raise.

Before: ``failed`` counted failures in completed turns only, so compose timing out in
every turn (each turn refused) showed ``0``; and nothing told a new user that the fix
was the step's deadline. Here compose's deadline is below what the lab takes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import chainrun, short_replay

from chainrun.lab import LabServer
from chainrun.log.store import Store


@pytest.fixture(scope="module")
def slow_lab() -> Iterator[LabServer]:
    """Every call takes ~200 ms (never under 100 ms)."""
    with LabServer("lognormal", median_ms=200, sigma=0.05, n_tokens=8) as lab:
        yield lab


def _config(tmp_path: Path, lab: LabServer) -> Path:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{lab.base_url}"\n'
                   "[steps.compose]\ndeadline_s = 0.05\n")  # fmt: skip
    return cfg


def _cells(table: str, row: str) -> list[str]:
    """The cells of a printed table's row, each cell's wrapped lines joined."""
    lines = table.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"│ {row} "))
    block = [lines[start]]
    for ln in lines[start + 1:]:
        if not ln.startswith("│ ") or ln.split("│")[1].strip():
            break  # the next row (or the table's end)
        block.append(ln)
    columns = zip(*(ln.split("│")[1:-1] for ln in block), strict=True)
    return [" ".join(part.strip() for part in col if part.strip()) for col in columns]


def test_a_step_failing_closed_is_counted_with_its_error_type(
    tmp_path: Path, slow_lab: LabServer
) -> None:
    replay = short_replay(tmp_path, 4)
    res = chainrun("replay", str(replay), "--config", str(_config(tmp_path, slow_lab)),
                   "--db", str(tmp_path / "log.db"), "--json")  # fmt: skip
    assert res.returncode == 1, res.stderr  # no turn ok: exit 1 (chainrun replay)
    doc = json.loads(res.stdout)
    assert doc["turns"]["n_refused"] == 4 and doc["turns"]["n_completed"] == 0
    compose = doc["steps"]["compose"]
    assert (compose["n_failed"], compose["n_ran"], compose["failures"]) == (4, 4, {"timeout": 4})
    assert compose["n"] == 0  # the percentiles stay over completed turns
    retrieve = doc["steps"]["retrieve"]  # routed: it runs for some of the labels only
    with Store.open(tmp_path / "log.db") as store:
        ran = sum(1 for s in store.steps(1) if s.step == "retrieve" and s.status != "skipped")
    assert (retrieve["n_failed"], retrieve["n_ran"], retrieve["failures"]) == (0, ran, {})


def test_the_table_counts_it_and_a_step_out_of_time_names_the_setting_to_raise(
    tmp_path: Path, slow_lab: LabServer
) -> None:
    replay = short_replay(tmp_path, 4)
    res = chainrun("replay", str(replay), "--config", str(_config(tmp_path, slow_lab)),
                   "--db", str(tmp_path / "log.db"))  # fmt: skip
    assert res.returncode == 1, res.stderr  # no turn ok: exit 1 (chainrun replay)
    assert "4: timeout" in _cells(res.stdout, "compose"), res.stdout  # "failed"
    hints = [ln for ln in res.stderr.splitlines() if "ran out of" in ln]
    assert hints == [
        "chainrun: warning: compose ran out of its deadline in 4 turns "
        "(steps.compose.deadline_s = 0.05 s): a server slower than that here needs more; "
        "raise it ([steps.compose] deadline_s in the chain's config) or use a faster model "
        "or server"
    ]


def test_run_says_which_step_failed_and_why(tmp_path: Path, slow_lab: LabServer) -> None:
    """``chainrun run`` of a refused turn names the failed step and its error type on the
    turn's line and in the step table's status cell (before: "turn refused: Sorry, ..."
    and a bare ``failed_closed``: nothing said it was compose's deadline)."""
    res = chainrun("run", "Do you have rain jackets?", "--config",
                   str(_config(tmp_path, slow_lab)), "--db", str(tmp_path / "log.db"))  # fmt: skip
    out = " ".join(res.stdout.split())
    assert "turn refused (compose: timeout):" in out, res.stdout
    assert _cells(res.stdout, "compose")[1] == "failed_closed: timeout", res.stdout
