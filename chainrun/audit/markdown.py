"""The audit as Markdown: the verdict table, then per item its evidence, notes, missing
data and tables (no plots). Text from the log is escaped so that it cannot break a
table or inject HTML into a renderer that allows it."""

from __future__ import annotations

import re
from typing import Any

from chainrun.audit.report import AuditReport, Item, Table

_SPECIAL = re.compile(r"([\\`*_{}\[\]|<>#])")


def _e(value: Any) -> str:
    if value is None:
        return "–"
    text = f"{value:g}" if isinstance(value, float) else str(value)
    text = text.replace("&", "&amp;").replace("\r", " ").replace("\n", " ")
    return _SPECIAL.sub(r"\\\1", text)


def _table(t: Table) -> list[str]:
    lines = [
        f"**{_e(t.title)}**",
        "",
        "| " + " | ".join(_e(c) for c in t.columns) + " |",
        "|" + "---|" * len(t.columns),
    ]
    lines += ["| " + " | ".join(_e(v) for v in row) + " |" for row in t.rows]
    return [*lines, ""]


def _item(item: Item) -> list[str]:
    lines = [f"## {item.id}. {_e(item.title)}: {item.verdict}", "", _e(item.evidence), ""]
    lines += [f"- {_e(n)}" for n in item.notes]
    if item.notes:
        lines.append("")
    if item.missing:
        lines += ["Missing data and how to get it:", ""]
        lines += [f"- {_e(m)}" for m in item.missing]
        lines.append("")
    for t in item.tables:
        lines += _table(t)
    return lines


def render_markdown(report: AuditReport) -> str:
    """The whole report as Markdown text."""
    lines = [
        "# chainrun audit: the slow-chain checklist",
        "",
        f"Generated {report.generated_at}.",
        "",
        "| # | item | verdict | evidence |",
        "|---|---|---|---|",
    ]
    lines += [f"| {i.id} | {_e(i.title)} | {i.verdict} | {_e(i.evidence)} |" for i in report.items]
    lines.append("")
    for item in report.items:
        lines += _item(item)
    return "\n".join(lines) + "\n"
