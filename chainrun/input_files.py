"""One reader for every JSON Lines file chainrun takes: replay sets, eval sets,
catalogues and labelled retrieval queries.

One error style for all of them: an :class:`~chainrun.errors.InputFileError` whose
message is one line, ``FILE:LINE: what was expected``. The file is read line by line
(never whole into memory), a UTF-8 byte-order mark on the first line is ignored,
blank lines are skipped, and two documented limits keep an oversized input from
exhausting memory:

- :data:`MAX_FILE_BYTES` (100 MiB) for a whole file, checked before reading;
- :data:`MAX_LINE_BYTES` (1 MiB) for one line (one request, case or product), checked
  while reading, so a 10 MB message is refused on its line.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from chainrun.errors import InputFileError

#: the largest JSONL file chainrun reads, in bytes (100 MiB: about 300,000 chat turns)
MAX_FILE_BYTES = 100 * 1024 * 1024
#: the longest line (one record) chainrun reads, in bytes (1 MiB: far above any model's
#: context window of text)
MAX_LINE_BYTES = 1024 * 1024

_BOM = b"\xef\xbb\xbf"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def check_file_size(path: str | Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> None:
    """Refuse a file larger than ``max_bytes`` before reading any of it.

    Raises:
        InputFileError: the file cannot be read, or is larger than the limit.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise InputFileError(str(p), None, f"cannot read {what} ({e.strerror})") from None
    if size > max_bytes:
        raise InputFileError(
            str(p), None,
            f"{what} is {_size(size)}; the limit is {_size(max_bytes)} (split the file)",
        )  # fmt: skip


def read_jsonl(
    path: str | Path,
    what: str = "JSON Lines file",
    *,
    objects: bool = True,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, decoded value)`` for each non-blank line of a JSONL file.

    Args:
        path: the file.
        what: what the file is, for messages ("replay set", "eval set", ...).
        objects: require every line to be a JSON object.
        max_file_bytes: the file size limit in bytes (:data:`MAX_FILE_BYTES`).
        max_line_bytes: the line length limit in bytes (:data:`MAX_LINE_BYTES`).

    Raises:
        InputFileError: the file is missing, unreadable or too large; a line is not
            UTF-8, too long, not valid JSON, or (with ``objects``) not an object. The
            message names the file and the line.
    """
    p = Path(path)
    check_file_size(p, what, max_file_bytes)
    try:
        f = p.open("rb")
    except OSError as e:
        raise InputFileError(str(p), None, f"cannot read {what} ({e.strerror})") from None
    with f:
        lineno = 0
        while True:
            try:
                raw = f.readline(max_line_bytes + 1)
            except OSError as e:
                raise InputFileError(str(p), None, f"cannot read {what} ({e.strerror})") from None
            if not raw:
                return
            lineno += 1
            if lineno == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            if len(raw.rstrip(b"\r\n")) > max_line_bytes:
                raise InputFileError(
                    str(p), lineno,
                    f"line longer than {_size(max_line_bytes)} (the limit for one record)",
                )  # fmt: skip
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputFileError(
                    str(p), lineno, f"not UTF-8 text (byte {e.start + 1}); expected UTF-8 JSON"
                ) from None
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                raise InputFileError(
                    str(p), lineno, f"not valid JSON ({e.msg}, column {e.colno})"
                ) from None
            except RecursionError:
                raise InputFileError(str(p), lineno, "not valid JSON (nested too deeply)") from None
            if objects and not isinstance(value, dict):
                raise InputFileError(
                    str(p), lineno, f"expected a JSON object, got {_json_type(value)}"
                )
            yield lineno, value


def read_text_file(path: str | Path, what: str, kind: str) -> str:
    """A whole text file (at most :data:`MAX_FILE_BYTES`) as UTF-8, a byte-order mark
    dropped; ``kind`` names its format in messages (``"CSV"``).

    Raises:
        InputFileError: the file is missing, unreadable or too large, or not UTF-8: then
            naming the line and the byte in it (1-based), as :func:`read_jsonl` does.
    """
    p = Path(path)
    check_file_size(p, what)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputFileError(str(p), None, f"cannot read {what} ({e.strerror})") from None
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        byte = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise InputFileError(
            str(p), line, f"not UTF-8 text (byte {byte}); expected UTF-8 {kind}"
        ) from None


def unknown_field(key: str, known: Sequence[str]) -> str:
    """The one wording of a key a file's record may not have, for every input file:
    ``unknown field 'mesage' (did you mean 'message'?); expected id, message, ...``."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown field {key!r}{hint}; expected {', '.join(known)}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
