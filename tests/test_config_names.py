"""Every config name that refers to another (a step, a tool, a provider, a classify
label) is checked when the config loads, and a near miss is named (did you mean)."""

from __future__ import annotations

from typing import Any

import pytest

from chainrun.config import config_from_dict
from chainrun.errors import ConfigError

TOOL = {"description": "Look an order up", "function": "json:dumps",
        "parameters": {"type": "object", "properties": {}}}  # fmt: skip


def _tools(compose: dict[str, Any]) -> dict[str, Any]:
    step = {"tools": ["order_status", "add_to_cart"], **compose}
    return {"tools": {"order_status": TOOL, "add_to_cart": TOOL}, "steps": {"compose": step}}


def test_a_label_no_step_gives_is_refused_with_the_nearest() -> None:
    with pytest.raises(ConfigError, match=r"steps\.compose\.tools_by_label\.order_statos: no "
                       r"step gives the label 'order_statos' \(did you mean 'order_status'\?\); "
                       r"the labels: sizing, product_search, order_status"):  # fmt: skip
        config_from_dict(_tools({"tools_by_label": {"order_statos": ["order_status"]}}))
    config_from_dict(_tools({"tools_by_label": {"order_status": ["order_status"]}}))


def test_a_label_the_classify_step_was_given_is_taken() -> None:
    cfg = _tools({"tools_by_label": {"orders": ["order_status"]}})
    cfg["steps"]["classify"] = {"labels": ["orders", "other"]}
    config_from_dict(cfg)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (_tools({"tools_by_label": {"order_status": ["order_statos"]}}),
         r"'order_statos' is not one of the step's tools .* \(did you mean 'order_status'\?\)"),
        ({"tools": {"order_status": TOOL}, "steps": {"compose": {"tools": ["order_statos"]}}},
         r"steps\.compose\.tools: unknown tool 'order_statos' \(did you mean 'order_status'\?\)"),
        ({"steps": {"compose": {"after": ["retreive"]}}},
         r"steps\.compose\.after: 'retreive' is not another step .* \(did you mean "
         r"'retrieve'\?\)"),
        ({"steps": {"compose": {"provider": "locl"}}},
         r"steps\.compose\.provider: unknown provider 'locl' \(did you mean 'local'\?\)"),
    ],
    ids=["a tool of tools_by_label", "a step's tool", "a step after", "a step's provider"],
)  # fmt: skip
def test_a_near_miss_is_named(data: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        config_from_dict(data)
