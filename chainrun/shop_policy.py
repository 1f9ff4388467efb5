"""The shop's policy text: what questions about orders, returns and sizes are answered from.

A policy file is TOML with one table per classify label, each with a ``title`` and a
``text`` (the sample shop's: ``chainrun/data/shop_policy.toml``)::

    [returns]
    title = "Returns, refunds and exchanges"
    text = \"\"\"Returns: within 30 days of delivery, ...\"\"\"

:func:`policy_text` gives the section of a label as a prompt shows it (``{policy}``):
its title and text, then one blank line, so a template places ``{policy}`` just before
its own sections. A label with no section gets ``""``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chainrun.errors import ConfigError

__all__ = ["SAMPLE_POLICY", "PolicySection", "load_policy", "policy_text"]

#: the sample shop's policy file, shipped with the package
SAMPLE_POLICY = Path(__file__).resolve().parent / "data" / "shop_policy.toml"


@dataclass(frozen=True)
class PolicySection:
    """One label's policy: a title and the text (lines of plain facts)."""

    title: str
    text: str

    @property
    def lines(self) -> list[str]:
        """The text's non-blank lines, stripped, in order."""
        return [row.strip() for row in self.text.splitlines() if row.strip()]


def load_policy(path: str | Path | None = None) -> dict[str, PolicySection]:
    """The policy sections by label, from ``path`` (None: the sample shop's file).

    Raises:
        ConfigError: the file cannot be read, is not TOML, or a table is not a
            ``title`` and a non-empty ``text`` (the message names the file and table).
    """
    p = Path(path) if path is not None else SAMPLE_POLICY
    where = str(path) if path is not None else "chainrun/data/shop_policy.toml"
    try:
        raw = p.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise ConfigError(f"{where}: cannot read policy file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a text file (expected UTF-8 TOML)") from None
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML ({e})") from None
    sections: dict[str, PolicySection] = {}
    for label, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: {label}: expected a table with title and text")
        unknown = set(table) - {"title", "text"}
        if unknown:
            raise ConfigError(f"{where}: {label}.{sorted(unknown)[0]}: unknown field; "
                              "expected title and text")  # fmt: skip
        title, text = table.get("title", label), table.get("text")
        if not isinstance(title, str) or not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{where}: {label}: expected a string title and a non-empty text")
        sections[label] = PolicySection(title.strip(), text.strip())
    if not sections:
        raise ConfigError(f"{where}: no policy section (expected one table per label)")
    return sections


def policy_text(
    sections: dict[str, PolicySection], label: str | None, keep: Sequence[int] | None = None
) -> str:
    """The prompt text of ``label``'s section (``"Shop policy, TITLE:\\nTEXT\\n\\n"``), or
    ``""`` when the label has none; ``keep``: only these of its :attr:`~PolicySection.lines`
    (by index), in the section's order."""
    section = sections.get(label or "")
    if section is None:
        return ""
    text = section.text
    if keep is not None:
        lines = section.lines
        text = "\n".join(lines[i] for i in sorted(set(keep)) if 0 <= i < len(lines))
    return f"Shop policy, {section.title}:\n{text}\n\n"
