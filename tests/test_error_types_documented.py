"""The error-type vocabulary: every ``error_type`` the code can log is documented in
docs/reference/error-types.md, and the page names none the code cannot log.

The code's vocabulary is read from the code itself: the ``error_type`` of every
exception class of chainrun, and every string literal the package assigns to an
``error_type`` (a row's field, a keyword argument, a dict key, a return value of
:func:`chainrun.errors.error_type`). ``http_NNN`` stands for the HTTP statuses.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import chainrun
from chainrun.errors import ChainrunError

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "error-types.md"
PKG = ROOT / "chainrun"


def documented() -> set[str]:
    """The names in the page's ``| `error_type` | meaning |`` table."""
    names = set()
    for line in PAGE.read_text().splitlines():
        m = re.match(r"\|\s*`([a-z0-9_NX]+)`\s*\|", line)
        if m:
            names.add(m.group(1))
    return names


def _literal(node: ast.AST | None) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.JoinedStr):
        head = node.values[0] if node.values else None
        if isinstance(head, ast.Constant) and head.value == "http_":
            return {"http_NNN"}
    if isinstance(node, ast.BoolOp | ast.IfExp):
        parts = node.values if isinstance(node, ast.BoolOp) else [node.body, node.orelse]
        return set().union(*(_literal(p) for p in parts))
    if isinstance(node, ast.Tuple):  # a, b = "x", "y" handled by the caller
        return set()
    return set()


def _is_error_type(target: ast.AST) -> bool:
    return (isinstance(target, ast.Name) and target.id == "error_type") or (
        isinstance(target, ast.Attribute) and target.attr == "error_type"
    )


def assigned_in_code() -> set[str]:
    """String literals the package gives an ``error_type`` anywhere."""
    found: set[str] = set()
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if _is_error_type(t):
                        found |= _literal(node.value)
                    elif isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        for sub, val in zip(t.elts, node.value.elts, strict=False):
                            if _is_error_type(sub):
                                found |= _literal(val)
            elif isinstance(node, ast.keyword) and node.arg == "error_type":
                found |= _literal(node.value)
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "error_type":
                        found |= _literal(v)
            elif isinstance(node, ast.FunctionDef) and node.name == "error_type":
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Return):
                        found |= _literal(sub.value)
    return found


def exception_types() -> set[str]:
    """The ``error_type`` of every chainrun exception class (all modules imported)."""
    for mod in pkgutil.walk_packages(chainrun.__path__, "chainrun."):
        if mod.name.startswith("chainrun.cli") or mod.name.endswith("__main__"):
            continue
        importlib.import_module(mod.name)
    out: set[str] = set()
    todo = [ChainrunError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        value = cls.__dict__.get("error_type")
        if isinstance(value, str):
            out.add(value)
    return out


def test_the_page_lists_exactly_the_code_s_error_types() -> None:
    code = assigned_in_code() | exception_types()
    code.discard("")
    docs = documented()
    assert docs, f"no error_type table found in {PAGE}"
    assert code - docs == set(), f"logged but not documented in {PAGE.name}: {code - docs}"
    assert docs - code == set(), f"documented but never logged: {docs - code}"


def test_the_vocabulary_has_what_the_issue_named() -> None:
    code = assigned_in_code() | exception_types()
    assert {"response_failed", "cancelled", "timeout", "http_NNN"} <= code
