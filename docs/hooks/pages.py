"""MkDocs hooks: the pages made at build time.

(The reference pages' generated parts are committed Markdown, written by
``python -m chainrun.cli.reference_pages``; they are not made here.)

- ``measurements.md`` is ``benchmarks/README.md`` as it is in the repository; a link to
  ``benchmarks/README.md#section`` from any page points at that page, so ``mkdocs build
  --strict`` checks that the section exists.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = "measurements.md"
_BENCH_LINK = re.compile(r"\]\(((?:\.\./)+)benchmarks/README\.md(#[^)\s]*)?\)")


def on_files(files: Files, config: Any) -> Files:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    note = (
        "!!! note\n    This page is `benchmarks/README.md` from the repository: every "
        "measurement with its command, date, machine and load, oldest first. The "
        "[headline figures](benchmarks.md) summarise what holds now.\n\n"
    )
    title, _, rest = text.partition("\n")
    files.append(File.generated(config, MEASUREMENTS, content=f"{title}\n\n{note}{rest}"))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    here = posixpath.dirname(page.file.src_uri)

    def to_measurements(m: re.Match[str]) -> str:
        target = posixpath.relpath(MEASUREMENTS, here or ".")
        return f"]({target}{m.group(2) or ''})"

    return _BENCH_LINK.sub(to_measurements, markdown)
