"""The config as a shop's team meets it through the CLI: its own step kinds from its own
module (``plugins``), a hedged run resumed from its stored config, and the effective
config printed as TOML (``chainrun config show``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import httpx
import pytest
from cli_runner import chainrun
from serve_helpers import chat, serving

from chainrun.chain import Chain
from chainrun.config import load_config
from chainrun.lab import LabServer
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "replays" / "commerce-12.jsonl"




#: A shop's own module: a step kind with its own config model and state field.
SHOP_MODULE = '''
from typing import Literal

from chainrun.steps import StateField, Step, StepConfig, StepResult, register_step_kind


class ParcelConfig(StepConfig):
    kind: Literal["{kind}"] = "{kind}"
    #: what the step writes
    status: str = "in transit"


@register_step_kind
class Parcel(Step):
    kind = "{kind}"
    config_model = ParcelConfig
    state_fields = (StateField("parcel", "the parcel's status", empty="(unknown)"),)

    @property
    def reads(self):
        return frozenset({{"message"}})

    @property
    def writes(self):
        return frozenset({{"parcel"}})

    async def run(self, state, ctx):
        ctx.row.output = self.config.status
        yield StepResult(updates={{"parcel": self.config.status}})
'''


def _shop(tmp_path: Path, lab: LabServer, kind: str) -> Path:
    """A shop's folder: its module (registering ``kind``) beside its chainrun.toml."""
    module = f"shop_steps_{kind}"
    (tmp_path / f"{module}.py").write_text(SHOP_MODULE.format(kind=kind))
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(
        f'plugins = ["{module}"]\n'
        'order = ["parcel", "retrieve", "compose"]\n'
        f'[providers.local]\nbase_url = "{lab.base_url}"\n'
        f'[steps.parcel]\nkind = "{kind}"\nstatus = "delivered on Monday"\n'
        # no classify step here: retrieve runs on every turn (the default routes on the label)
        "[steps.retrieve]\nwhen = {}\n"
        '[steps.compose]\nprompt = "Parcel: {parcel}\\nShopper: {message}\\nStylist:"\n'
    )
    return cfg


def test_a_kind_from_the_shops_own_module_runs_through_the_cli(
    lab: LabServer, tmp_path: Path
) -> None:
    """``kind = "..."`` of a kind the shop's module registers: the module named in
    ``plugins`` is imported (from the config file's folder) before the config is
    validated, and the turn runs with the kind's field in the compose prompt."""
    cfg = _shop(tmp_path, lab, "parcel_run")
    db = tmp_path / "log.db"
    res = chainrun("run", "where is my parcel?", "--config", str(cfg), "--db", str(db),
                   "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok"
    steps = {s["step"]: s for s in doc["steps"]}
    assert steps["parcel"]["status"] == "ok"
    store = Store.open(db)
    try:
        (compose,) = [c for c in store.calls(doc["run_id"]) if c.step == "compose"]
    finally:
        store.close()
    user = json.loads(compose.prompt or "[]")[-1]["content"]
    assert user.startswith("Parcel: delivered on Monday\nShopper: where is my parcel?"), user


def test_a_plugin_that_does_not_import_is_one_line_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text('plugins = ["no_such_shop_module"]\n[steps.classify]\nkind = "order"\n')
    res = chainrun("config", "show", "--config", str(cfg))
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "\n" not in line, res.stderr
    assert line.startswith(f"chainrun: error: {cfg}: plugins: cannot import 'no_such_shop_module' "
                           "(ModuleNotFoundError: No module named 'no_such_shop_module')"), line


@pytest.mark.parametrize(("function", "why"), [
    ("no_such_shop_tools_xyz:lookup", "cannot import 'no_such_shop_tools_xyz': no such module"),
    ("json:no_such_function", "module 'json' has no attribute 'no_such_function'"),
    ("shop_tools_here:lookup", None),  # beside the config: imports
])
def test_a_tool_whose_function_does_not_import_is_one_line_exit_2(
    tmp_path: Path, function: str, why: str | None
) -> None:
    """``config show`` imports each ``[tools.NAME] function`` as the chain will: one that
    does not import fails at the file's load, not at a turn or at serve's start (it
    printed the config and exited 0)."""
    (tmp_path / "shop_tools_here.py").write_text("def lookup(order: str) -> dict:\n"
                                                 "    return {'order': order}\n")  # fmt: skip
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(f'[tools.lookup_order]\ndescription = "Look an order up"\n'
                   f'function = "{function}"\n')  # fmt: skip
    res = chainrun("config", "show", "--config", str(cfg))
    if why is None:
        assert res.returncode == 0, res.stderr
        assert "[tools.lookup_order]" in res.stdout
        return
    assert res.returncode == 2 and res.stdout == "", res.stdout
    line = res.stderr.strip()
    assert "\n" not in line, res.stderr
    assert line.startswith(f"chainrun: error: {cfg}: tools.lookup_order.function: {why}"), line
    assert line.endswith('expected "module:callable" naming a callable on the Python path or '
                         "in the config file's folder"), line


def test_a_hedged_run_resumes_from_its_stored_config(lab: LabServer, tmp_path: Path) -> None:
    """A run whose validate step is hedged, resumed: its stored config validates again
    (it held hedge.deadline_s = null, which the [hedge] table refused)."""
    cfg = tmp_path / "hedged.toml"
    cfg.write_text(
        f'[providers.local]\nbase_url = "{lab.base_url}"\n'
        '[steps.validate.hedge]\ndelay = "p95"\nmax_attempts = 2\n'
    )
    lines = REPLAY.read_text().splitlines(keepends=True)
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(lines[:2]))
    db = tmp_path / "log.db"
    first = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db), "--json")
    assert first.returncode == 0, first.stderr
    replay.write_text("".join(lines[:3]))  # one request the run has not answered
    resumed = chainrun("replay", str(replay), "--db", str(db), "--resume", "1", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["turns"]["n_completed"] == 3


def test_config_show_prints_the_effective_chain_as_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(
        '[steps.compose]\nmax_output_tokens = 50\n[steps.classify]\nlabels = ["a", "b"]\n'
    )
    res = chainrun("config", "show", "--config", str(cfg))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"# The effective chainrun config: the built-in defaults "
                                 f"merged with {cfg}.")  # fmt: skip
    doc = tomllib.loads(res.stdout)
    # the file's values, and the defaults it did not change (labels, prompts, kinds)
    assert doc["steps"]["compose"]["max_output_tokens"] == 50
    assert doc["steps"]["classify"]["labels"] == ["a", "b"]
    assert doc["steps"]["classify"]["method"] == "combined"
    assert "{policy}" in doc["steps"]["compose"]["prompt"]
    assert doc["steps"]["retrieve"]["kind"] == "retrieve"
    assert doc["steps"]["retrieve"]["when"] == {"label": {"not": ["order_status", "returns",
                                                                  "sizing"]}}  # fmt: skip
    assert doc["order"] == ["classify", "retrieve", "policy", "compose", "validate", "critique"]
    # loaded as a chainrun.toml, it is the same chain
    again = tmp_path / "again.toml"
    again.write_text(res.stdout)
    assert load_config(again).snapshot() == load_config(cfg).snapshot()
    # --json: the same config as one JSON document
    as_json = json.loads(chainrun("config", "show", "--config", str(cfg), "--json").stdout)
    assert as_json["steps"]["compose"]["max_output_tokens"] == 50


def test_config_show_of_a_bad_config_is_one_line_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text('[steps.retrieve]\nreasoning_effort = "low"\n')
    res = chainrun("config", "show", "--config", str(cfg))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().startswith(
        f"chainrun: error: {cfg}: steps.retrieve.reasoning_effort: a step of kind 'retrieve' takes "
        "no key 'reasoning_effort'"
    ), res.stderr


async def test_a_kind_from_the_shops_own_module_runs_through_serve(
    lab: LabServer, tmp_path: Path
) -> None:
    """The config ``chainrun serve --config`` loads names the shop's module in
    ``plugins``: a /chat turn runs the shop's kind and streams its step."""
    cfg = load_config(_shop(tmp_path, lab, "parcel_serve"))
    store = Store.open(tmp_path / "serve.db")
    try:
        factory = lambda: Chain(cfg, store=store, kind="live", quiet=True)  # noqa: E731
        async with (
            serving(factory) as (url, _),
            httpx.AsyncClient(base_url=url) as client,
        ):
            events = await chat(client, "where is my parcel?")
        finished = {d["step"]: d for e, d in events if e == "step" and d["phase"] == "finished"}
        assert finished["parcel"]["kind"] == "parcel_serve"
        assert finished["parcel"]["status"] == "ok"
        assert finished["parcel"]["output"] == "delivered on Monday"
        turn = events[-1][1]
        assert turn["status"] == "ok"
        (compose,) = [c for c in store.calls(turn["run_id"]) if c.step == "compose"]
        assert json.loads(compose.prompt or "[]")[-1]["content"].startswith(
            "Parcel: delivered on Monday\n"
        )
    finally:
        store.close()
