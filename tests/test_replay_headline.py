"""What a replay prints reads top-down: one headline (turns ok of all, and the answer's
TTFT p50/p90 with n and intervals), the per-step table with one count a column, then the
warnings, each said once; and a run in which no turn was ok exits 1 and says so.

Before: the warning lines came above the table, the ``failed`` column held a second
count (``2 of 12``) beside ``n`` (completed turns only), each step out of time repeated
the advice and "see chainrun show 1", and a replay of nothing but refusals exited 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import chainrun, short_replay

from chainrun import cli
from chainrun.lab import LabServer

HEADLINE = re.compile(
    r"run 1 \(replay, complete\): (\d+) turns, (\d+) ok(?: \(([^)]*)\))?; answer TTFT "
    r"p50 \d+ ms (?:\[\d+, \d+\]|-\*), p90 \d+ ms (?:\[\d+, \d+\]|-\*), n = (\d+)$"
)


@pytest.fixture(params=[80, 120])
def columns(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The width the CLI's tables are printed at (a terminal of that many columns)."""
    monkeypatch.setattr(cli.out, "width", request.param)
    return int(request.param)


@pytest.fixture(scope="module")
def slow_lab() -> Iterator[LabServer]:
    """Every call takes ~200 ms (never under 100 ms)."""
    with LabServer("lognormal", median_ms=200, sigma=0.05, n_tokens=8) as lab:
        yield lab


def _failed_cells(table: str) -> dict[str, str]:
    """The ``failed`` column of a printed latency table, per row (wrapped lines joined)."""
    lines = table.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("┏"))
    headers = [" ".join(parts) for parts in zip(*(
        [c.strip() for c in ln.split("┃")[1:-1]] for ln in lines[head + 1:]
        if ln.startswith("┃")), strict=True)]  # fmt: skip
    col = next(i for i, h in enumerate(headers) if h.strip() == "failed")
    cells: dict[str, str] = {}
    row = ""
    for ln in lines:
        if not ln.startswith("│"):
            continue
        parts = [c.strip() for c in ln.split("│")[1:-1]]
        if parts[0] and parts[0] not in ("TTFT", "done"):  # a new row (not a wrapped name)
            row = parts[0]
        cells[row] = f"{cells.get(row, '')} {parts[col]}".strip()
    return cells


def test_headline_first_then_the_table_then_each_warning_once(
    tmp_path: Path, lab_config: Path, columns: int
) -> None:
    # the lab answers filler words: validate (a JSON verdict) fails open in every turn
    cfg = lab_config
    cfg.write_text(cfg.read_text() + "[steps.validate]\ndeadline_s = 30\n")
    res = chainrun("replay", str(short_replay(tmp_path, 4)), "--config", str(cfg),
                   "--db", str(tmp_path / "log.db"))  # fmt: skip
    assert res.returncode == 0, res.output
    first = res.stdout.splitlines()[0]
    m = HEADLINE.fullmatch(first)
    assert m is not None, first
    assert (m.group(1), m.group(2), m.group(3), m.group(4)) == ("4", "4", None, "4")
    # the table: one count a column; the failed cell is a count, then its error types
    cells = _failed_cells(res.stdout)
    assert cells["validate"] == "4: invalid_answer", res.stdout
    assert cells["compose"] == "0" and cells["classify"] == "0", res.stdout
    assert not any(" of " in c for c in cells.values()), cells
    assert "n: the completed turns a row is over" in res.stdout
    # the warnings come after the table, as a terminal shows both streams
    output = res.output
    table_end = output.index("└")
    warnings = [ln for ln in output.splitlines() if ln.startswith("chainrun: warning:")]
    assert warnings and all(output.index(w) > table_end for w in warnings), output
    assert warnings == [
        "chainrun: warning: 4 of 4 ok turns answered with a step failed open "
        "(validate:invalid_answer ×4); see chainrun show 1"
    ]


def test_steps_out_of_time_share_one_line_and_no_turn_ok_exits_1(
    tmp_path: Path, slow_lab: LabServer, columns: int
) -> None:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(f'[providers.local]\nbase_url = "{slow_lab.base_url}"\n'
                   "[steps.compose]\ndeadline_s = 0.05\n")  # fmt: skip
    res = chainrun("replay", str(short_replay(tmp_path, 3)), "--config", str(cfg),
                   "--db", str(tmp_path / "log.db"))  # fmt: skip
    assert res.returncode == 1, res.output
    assert res.stdout.splitlines()[0] == (
        "run 1 (replay, complete): 3 turns, 0 ok (3 refused); no ok answer to time; "
        "exit 1: no turn ok"
    )
    assert _failed_cells(res.stdout)["compose"] == "3: timeout", res.stdout
    warnings = [ln for ln in res.stderr.splitlines() if "warning" in ln]
    assert warnings[0] == ("chainrun: warning: 3 of 3 turns not ok (3 refused; failed steps "
                           "in them: compose:timeout ×3); see chainrun show 1")  # fmt: skip
    assert sum("see chainrun show" in w for w in warnings) == 1
    assert sum("raise it" in w or "raise them" in w for w in warnings) == 1
    # --json: the same exit status, one JSON document
    res = chainrun("replay", str(short_replay(tmp_path, 3)), "--config", str(cfg),
                   "--db", str(tmp_path / "log2.db"), "--json")  # fmt: skip
    assert res.returncode == 1 and res.stdout.lstrip().startswith("{"), res.output


def test_several_steps_out_of_time_give_one_line_with_each_setting() -> None:
    from collections import Counter

    from chainrun.cli.commands_core import _timeout_hint

    line = _timeout_hint(None, Counter({"validate:timeout": 6, "compose:timeout": 1,
                                        "compose:invalid_answer": 2}))  # fmt: skip
    assert line == (
        "validate ran out of its deadline in 6 turns (steps.validate.deadline_s), compose ran "
        "out of its deadline in 1 turn (steps.compose.deadline_s): a server slower than that "
        "here needs more; raise them ([steps.validate] deadline_s, [steps.compose] deadline_s "
        "in the chain's config) or use a faster model or server"
    )
    assert _timeout_hint(None, Counter({"compose:invalid_answer": 2})) is None
