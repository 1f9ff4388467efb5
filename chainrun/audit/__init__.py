"""``chainrun audit``: the slow-chain checklist judged from the run log.

Seven items (:mod:`chainrun.audit.items`), each with a verdict ``pass | warn | fail |
not_enough_data``, evidence, and the figures behind it with their n; rendered as one
self-contained HTML page with plots (:mod:`.html`, :mod:`.plots`), Markdown
(:mod:`.markdown`) or JSON (:meth:`AuditReport.as_json`). All log reads go through
:mod:`chainrun.audit.rows`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from chainrun.audit.items import CHECKS
from chainrun.audit.report import AuditReport, Item, Table, Verdict, fails_on
from chainrun.audit.scope import Scope, select_scope
from chainrun.errors import UserInputError
from chainrun.log.migrations import utc_now
from chainrun.log.store import Store

Format = Literal["html", "md", "json"]
FORMATS: tuple[Format, ...] = ("html", "md", "json")
_EXT = {"html": "html", "md": "md", "json": "json"}

__all__ = [
    "FORMATS",
    "AuditReport",
    "Format",
    "Item",
    "Scope",
    "Table",
    "Verdict",
    "audit",
    "audit_scope",
    "default_path",
    "fails_on",
    "load_labelled_queries",
    "render",
    "write_report",
]


def audit_scope(scope: Scope) -> AuditReport:
    """Run the eight checks over ``scope``."""
    return AuditReport([check(scope) for check in CHECKS], scope.describe(), utc_now())


def audit(
    store: Store,
    runs: Sequence[int] = (),
    live: str | None = None,
    eval_runs: Sequence[int] = (),
    queries: Mapping[str, tuple[str, ...]] | None = None,
) -> AuditReport:
    """Audit the log: by default the latest replay run, every live turn, every eval run.

    See :func:`chainrun.audit.scope.select_scope` for the arguments.

    Raises:
        UserInputError: an unknown run id, a non-eval ``--eval-run``, a malformed window.
    """
    return audit_scope(select_scope(store, runs, live, eval_runs, queries))


def load_labelled_queries(path: str | Path) -> dict[str, tuple[str, ...]]:
    """Labelled retrieval queries (``evals/retrieval_queries.jsonl`` format), keyed by
    the lower-cased message.

    Raises:
        InputFileError: see :func:`chainrun.retrieval.evaluate.load_queries`.
    """
    from chainrun.retrieval.evaluate import load_queries

    return {q.query.strip().lower(): q.expected for q in load_queries(path)}


def render(report: AuditReport, fmt: Format) -> str:
    """The report as HTML, Markdown or JSON text."""
    if fmt == "html":
        from chainrun.audit.html import render_html

        return render_html(report)
    if fmt == "md":
        from chainrun.audit.markdown import render_markdown

        return render_markdown(report)
    return json.dumps(report.as_json(), indent=2, default=str) + "\n"


def default_path(fmt: Format, now: datetime | None = None) -> Path:
    """``audit-YYYY-MM-DD.<ext>`` in the working directory (UTC date)."""
    day = (now or datetime.now(UTC)).date().isoformat()
    return Path(f"audit-{day}.{_EXT[fmt]}")


def _umask() -> int:
    """The process's umask, read without changing it (os.umask sets it to read it, which
    races other threads creating files); 0o022 where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_report(text: str, path: str | Path) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a
    rename, so a crash never leaves a half-written report over a good one.

    Raises:
        UserInputError: the folder does not exist or cannot be written, or ``path`` is
            a directory.
    """
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise UserInputError(f"--out {path}: directory {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise UserInputError(f"--out {path}: cannot write in {folder} ({e.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        # mkstemp makes the file 0600; a report gets the mode any new file would (umask)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UserInputError(f"--out {path}: cannot write the report ({e.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
