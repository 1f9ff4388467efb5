"""Import rules of the package (README, ARCHITECTURE): who may import whom."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "chainrun"

#: (modules matching this prefix, must not import any module with these prefixes)
RULES = [
    ("chainrun.hedging", ("chainrun.providers", "chainrun.chain", "chainrun.steps",
                          "chainrun.timing", "openai", "httpx", "chainrun.errors")),
    ("chainrun.providers", ("chainrun.hedging", "chainrun.chain", "chainrun.steps")),
    ("chainrun.store", ("chainrun.chain", "chainrun.steps", "chainrun.scheduler")),
    ("chainrun.records", ("chainrun.chain", "chainrun.steps", "chainrun.scheduler")),
    ("chainrun.migrations", ("chainrun.chain", "chainrun.steps", "chainrun.scheduler")),
    ("chainrun.lab", ("chainrun.chain", "chainrun.steps", "chainrun.scheduler")),
    ("chainrun", ("chainrun.cli",)),  # nothing outside the CLI imports the CLI
]  # fmt: skip


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


MODULES = {_module(p): _imports(p) for p in PKG.rglob("*.py")}


@pytest.mark.parametrize(("scope", "forbidden"), RULES)
def test_import_rules(scope: str, forbidden: tuple[str, ...]) -> None:
    bad = []
    for mod, imports in MODULES.items():
        if not (mod == scope or mod.startswith(scope + ".")):
            continue
        if scope == "chainrun" and (mod == "chainrun.cli" or mod.startswith("chainrun.cli.")
                                    or mod == "chainrun.__main__"):  # fmt: skip
            continue
        for imp in imports:
            if any(imp == f or imp.startswith(f + ".") for f in forbidden):
                bad.append(f"{mod} imports {imp}")
    assert not bad, bad
