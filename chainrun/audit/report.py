"""The audit's result types: eight items, each with a verdict, evidence, figures, tables
and plots, and the JSON document they make (``chainrun audit --format json``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from chainrun.audit.plots import Plot

Verdict = Literal["pass", "warn", "fail", "not_enough_data"]
VERDICTS: tuple[Verdict, ...] = ("pass", "warn", "fail", "not_enough_data")

#: how bad a verdict is, for combining per-step verdicts into an item's (worst wins) and
#: for ``--fail-on``; not_enough_data sits above pass: a missing measurement never passes
_SEVERITY: dict[Verdict, int] = {"pass": 0, "not_enough_data": 1, "warn": 2, "fail": 3}


def worst(verdicts: list[Verdict], empty: Verdict = "not_enough_data") -> Verdict:
    """The most severe of ``verdicts`` (fail > warn > not_enough_data > pass)."""
    return max(verdicts, key=lambda v: _SEVERITY[v]) if verdicts else empty


def fails_on(verdict: Verdict, level: Literal["warn", "fail"]) -> bool:
    """True when ``verdict`` should fail a CI job run with ``--fail-on level``."""
    if level == "fail":
        return verdict == "fail"
    return verdict in ("warn", "fail")


@dataclass
class Table:
    """A table of figures for the HTML and Markdown reports (cells are plain values)."""

    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Item:
    """One checklist item.

    ``evidence``: one or two sentences in plain words. ``notes``: per-step findings.
    ``missing``: the data that is missing and the command that would produce it.
    ``figures``: JSON-ready numbers behind the verdict (every statistic with its n).
    ``tables`` and ``plots`` are for the HTML/Markdown reports only.
    """

    id: int
    title: str
    verdict: Verdict
    evidence: str
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "verdict": self.verdict,
            "evidence": self.evidence,
            "notes": self.notes,
            "missing": self.missing,
            "figures": self.figures,
        }


@dataclass
class AuditReport:
    """The whole audit: the eight items and what the log held (``scope``)."""

    items: list[Item]
    scope: dict[str, Any]
    generated_at: str

    def as_json(self) -> dict[str, Any]:
        """``{"items": [{"id", "title", "verdict", "evidence", "notes", "missing",
        "figures"}], "scope": {...}, "generated_at": ISO-8601 UTC}``."""
        return {
            "items": [i.as_json() for i in self.items],
            "scope": self.scope,
            "generated_at": self.generated_at,
        }

    def worst(self) -> Verdict:
        return worst([i.verdict for i in self.items], empty="pass")
