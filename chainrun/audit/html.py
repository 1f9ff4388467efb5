"""The audit as one self-contained HTML page: no script, no network, plots inlined as SVG.

Every text that reaches the page goes through :func:`html.escape` (with quotes), so an
answer, prompt, label or step name holding ``<script>`` or an ``onerror=`` attribute
shows as text. The only markup not escaped is the SVG matplotlib draws, whose text is
drawn as paths (:mod:`chainrun.audit.plots`).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from chainrun.audit.plots import render_svg
from chainrun.audit.report import AuditReport, Item, Table

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;
max-width:1200px;padding:0 16px;color:#1d2330}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 6px;padding-top:8px;
border-top:1px solid #dde}h3{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:12.5px}
th,td{border:1px solid #cfd5df;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f1f3f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.v{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;font-size:12px;
color:#fff}.v-pass{background:#2e7d32}.v-warn{background:#b26a00}.v-fail{background:#c62828}
.v-not_enough_data{background:#607080}.meta{color:#5b6475;font-size:12.5px}
.plot svg{max-width:100%;height:auto}ul{margin:4px 0 8px 18px;padding:0}
details pre{font-size:11.5px;background:#f7f8fa;padding:8px;overflow:auto}
"""

#: no script, no network: the page may only use its own inline style and data: images
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_LABELS = {"pass": "pass", "warn": "warn", "fail": "fail", "not_enough_data": "not enough data"}


def _e(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return escape(f"{value:g}")
    return escape(str(value), quote=True)


def _badge(verdict: str) -> str:
    return f'<span class="v v-{_e(verdict)}">{_e(_LABELS.get(verdict, verdict))}</span>'


def _table(t: Table) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in t.columns)
    body = []
    for row in t.rows:
        cells = []
        for v in row:
            cls = ' class="num"' if isinstance(v, int | float) and not isinstance(v, bool) else ""
            cells.append(f"<td{cls}>{_e(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<h3>{_e(t.title)}</h3><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _item(item: Item) -> str:
    parts = [
        f'<h2 id="item-{item.id}">{item.id}. {_e(item.title)} {_badge(item.verdict)}</h2>',
        f"<p>{_e(item.evidence)}</p>",
    ]
    if item.notes:
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in item.notes) + "</ul>")
    if item.missing:
        parts.append(
            "<h3>Missing data and how to get it</h3><ul>"
            + "".join(f"<li>{_e(m)}</li>" for m in item.missing)
            + "</ul>"
        )
    parts += [_table(t) for t in item.tables]
    for i, plot in enumerate(item.plots):
        parts.append(f'<div class="plot">{render_svg(plot, f"item{item.id}-{i}")}</div>')
    figures = json.dumps(item.figures, indent=1, default=str)
    parts.append(f"<details><summary>Figures (JSON)</summary><pre>{_e(figures)}</pre></details>")
    return "\n".join(parts)


def _scope(scope: dict[str, Any]) -> str:
    lines = [f"{s['name']} ({s['n_turns']} turns)" for s in scope.get("samples", [])]
    evals = scope.get("eval_runs", [])
    if evals:
        lines.append("eval runs " + ", ".join(str(e["id"]) for e in evals))
    return "; ".join(lines) or "nothing (the log holds no runs)"


def render_html(report: AuditReport) -> str:
    """The whole report as a standalone HTML document (UTF-8 text)."""
    summary = "".join(
        f'<tr><td class="num">{i.id}</td><td><a href="#item-{i.id}">{_e(i.title)}</a></td>'
        f"<td>{_badge(i.verdict)}</td><td>{_e(i.evidence)}</td></tr>"
        for i in report.items
    )
    body = "\n".join(_item(i) for i in report.items)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>chainrun audit {_e(report.generated_at[:10])}</title><style>{_CSS}</style></head>
<body><h1>chainrun audit: the slow-chain checklist</h1>
<p class="meta">Generated {_e(report.generated_at)} from {_e(_scope(report.scope))}.</p>
<table><thead><tr><th>#</th><th>item</th><th>verdict</th><th>evidence</th></tr></thead>
<tbody>{summary}</tbody></table>
{body}
</body></html>
"""
