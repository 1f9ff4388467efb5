"""A config that keeps a default route but leaves out the step at its other end is an
error: written before the default chain had its ``policy`` step, an ``order`` without it
kept retrieve's default ``when``, and order, returns and sizing questions got neither the
search nor the policy text."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import ROOT, chainrun

from chainrun.config import config_from_dict, load_config
from chainrun.errors import ConfigError

#: a chainrun.toml from before the routed default chain (its own compose prompt, an
#: explicit order without policy)
BEFORE_ROUTES = """\
order = ["classify", "retrieve", "compose", "validate", "critique"]

[steps.compose]
prompt = "Catalogue matches:\\n{products}\\n\\nShopper: {message}\\nStylist:"
"""


def test_an_order_without_the_policy_step_is_one_error_line(tmp_path: Path) -> None:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(BEFORE_ROUTES)
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{cfg}: order: ")
    assert "sizing, order_status, returns reach no step" in line
    assert "steps.retrieve keeps the default `when`" in line
    assert "add 'policy' to order, or give [steps.retrieve] `when = {}`" in line
    res = chainrun("config", "show", "--config", str(cfg))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [f"chainrun: error: {line}"]


@pytest.mark.parametrize(
    "fix",
    [
        # the default routes whole
        {"order": ["classify", "retrieve", "policy", "compose", "validate", "critique"]},
        # no routes: retrieve on every label
        {"steps": {"retrieve": {"when": {}}}},
        # a route of the file's own: what it skips is its choice
        {"steps": {"retrieve": {"when": {"label": {"not": ["other"]}}}}},
        # a step of the file's own serves the labels retrieve skips
        {"order": ["classify", "retrieve", "answers", "compose", "validate", "critique"],
         "steps": {"answers": {"kind": "policy",
                               "when": {"label": ["order_status", "returns", "sizing"]}}}},
    ],
)
def test_a_chain_whose_every_label_has_a_route_is_valid(fix: dict) -> None:
    data = {"order": ["classify", "retrieve", "compose", "validate", "critique"],
            "steps": {"compose": {"prompt": "{products} {message}"}}}  # fmt: skip
    merged = {**data, **{k: v for k, v in fix.items() if k != "steps"},
              "steps": {**data["steps"], **fix.get("steps", {})}}  # fmt: skip
    config_from_dict(merged, "chainrun.toml")


def test_a_step_serving_only_some_of_the_labels_is_named_with_the_rest() -> None:
    orders = {"kind": "policy", "when": {"label": ["order_status"]}}
    data = {"order": ["classify", "retrieve", "orders", "compose"],
            "steps": {"compose": {"prompt": "{products} {message}"}, "orders": orders}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"labels sizing, returns reach no step"):
        config_from_dict(data, "chainrun.toml")


def test_the_default_chain_and_the_shipped_examples_are_valid() -> None:
    config_from_dict({}, "built-in default")
    load_config(ROOT / "examples" / "shop" / "chainrun.toml")
