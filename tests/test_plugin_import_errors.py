"""A plugin module that is found but whose own import fails says so, with its file, line
and error; only a module that is not there is called not found.

Before: both read "cannot import 'shop_steps' (...); expected a module on the Python
path or in DIR", which sent a user looking for a module that was there.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from cli_runner import chainrun


@pytest.mark.parametrize(
    ("body", "line", "error"),
    [
        ("import os\nimport no_such_dependency_xyz\n", 2,
         "(ModuleNotFoundError: No module named 'no_such_dependency_xyz')"),
        ("x = 1\nraise RuntimeError('boom')\n", 2, "(RuntimeError: boom)"),
        ("def f(:\n", 1, "(SyntaxError: "),
    ],
)  # fmt: skip
def test_a_plugin_whose_own_import_fails_names_its_file_line_and_error(
    tmp_path: Path, body: str, line: int, error: str
) -> None:
    name = f"shop_plugin_{uuid.uuid4().hex[:8]}"  # a name no other test imported
    module = tmp_path / f"{name}.py"
    module.write_text(body)
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(f'plugins = ["{name}"]\n')
    res = chainrun("config", "show", "--config", str(cfg))
    assert res.returncode == 2
    said = res.stderr.strip()
    assert "\n" not in said, res.stderr
    assert said.startswith(
        f"chainrun: error: {cfg}: plugins: cannot import '{name}': the module was found "
        f"({module}) but failed while importing at line {line} {error}"
    ), said
    assert "expected a module on the Python path" not in said


def test_a_plugin_that_is_not_there_is_still_not_found(tmp_path: Path) -> None:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text('plugins = ["no_such_shop_module_xyz.steps"]\n')
    res = chainrun("config", "show", "--config", str(cfg))
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"chainrun: error: {cfg}: plugins: cannot import 'no_such_shop_module_xyz.steps' "
        "(ModuleNotFoundError: No module named 'no_such_shop_module_xyz'); expected a module "
        f"on the Python path or in {tmp_path.resolve()}"
    )
