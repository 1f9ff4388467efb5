"""The docs' lists that mirror code cannot drift: the concepts page names every step
kind registered and every run and turn status the log's row models allow."""

from __future__ import annotations

import typing
from pathlib import Path

from chainrun.log.rows import RunStatus, StepStatus, TurnStatus
from chainrun.steps import step_kinds

CONCEPTS = Path(__file__).resolve().parents[1] / "docs" / "concepts" / "index.md"


def _section(text: str, heading: str) -> str:
    return text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_concepts_page_names_every_step_kind() -> None:
    step = _section(CONCEPTS.read_text(encoding="utf-8"), "Step")
    # chainrun's own kinds (tests register kinds of their own in the same process)
    builtin = [k for k, cls in step_kinds().items() if cls.__module__.startswith("chainrun.")]
    assert {"llm", "retrieve"} <= set(builtin)
    missing = [k for k in builtin if f"`{k}`" not in step]
    assert not missing, f"docs/concepts/index.md, Step: kinds not named: {missing}"


def test_the_concepts_page_names_every_run_and_turn_status() -> None:
    text = CONCEPTS.read_text(encoding="utf-8")
    for heading, statuses in (("Run", RunStatus), ("Turn", TurnStatus), ("Step", StepStatus)):
        section = _section(text, heading)
        missing = [s for s in typing.get_args(statuses) if f"`{s}`" not in section]
        assert not missing, f"docs/concepts/index.md, {heading}: statuses not named: {missing}"
