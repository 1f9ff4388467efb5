"""The capability table: a step asking a model for what it refuses fails before any call."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from chainrun.chain import Chain
from chainrun.config import ProviderConfig, config_from_dict
from chainrun.config.capabilities import BUILTIN, LLAMA_SERVER, check_chain, lookup
from chainrun.errors import ConfigError
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider


def one_step(
    step: dict[str, Any],
    providers: dict[str, Any] | None = None,
    capabilities: dict[str, Any] | None = None,
) -> Any:
    providers = providers or {"openai": {"base_url": "https://api.openai.com/v1"}}
    answer = {"provider": next(iter(providers)), "prompt": "{message}", **step}
    data: dict[str, Any] = {
        "order": ["answer"],
        "answer_step": "answer",
        "providers": providers,
        "steps": {"answer": answer},
    }
    if capabilities is not None:
        data["capabilities"] = capabilities
    return config_from_dict(data)


async def test_unsupported_effort_fails_before_any_call_naming_step_value_and_accepted() -> None:
    cfg = one_step({"model": "gpt-5.1", "reasoning_effort": "minimal"})
    fake = FakeProvider(name="openai")
    with Store.open(":memory:") as store:
        with pytest.raises(ConfigError) as info:
            async with Chain(cfg, store=store, providers={"openai": fake}):
                pass
        assert store.list_runs() == []  # no run was created
    assert fake.requests == []  # and no call was made
    assert str(info.value) == (
        "steps.answer.reasoning_effort: 'minimal' is not accepted by model 'gpt-5.1'; "
        "accepted: none, low, medium, high (built-in capability table)"
    )


def test_cli_refuses_with_one_line_and_exit_2(tmp_path: Path) -> None:
    toml = tmp_path / "chainrun.toml"
    toml.write_text(
        '[providers.openai]\nbase_url = "http://127.0.0.1:9/v1"\n\n'
        '[steps.compose]\nprovider = "openai"\nmodel = "o4-mini-2025-04-16"\n'
        'reasoning_effort = "minimal"\nstop = []\ntemperature = 1\n'
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "chainrun",
            "run",
            "hi",
            "--config",
            str(toml),
            "--db",
            str(tmp_path / "log.db"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "steps.compose.reasoning_effort: 'minimal'" in lines[0]
    assert "model 'o4-mini-2025-04-16' (o4-mini)" in lines[0]
    assert "accepted: low, medium, high" in lines[0]
    # refused before the preflight check: the provider at port 9 was never tried
    assert "cannot reach" not in proc.stderr


def test_lookup_config_first_then_builtin_then_dated_then_local() -> None:
    assert lookup("gpt-5-mini-2025-08-07") == ("gpt-5-mini", BUILTIN["gpt-5-mini"])
    assert lookup("my-finetune") is None
    local = ProviderConfig()
    found = lookup("gemma-3-270m", local)
    assert found is not None and found[0] == LLAMA_SERVER
    assert lookup("gemma-3-270m", ProviderConfig(base_url="http://x/v1")) is None
    cfg = one_step(
        {"model": "gpt-5", "reasoning_effort": "low"},
        capabilities={"gpt-5": {"reasoning_effort": ["high"]}},
    )
    with pytest.raises(ConfigError, match=r"accepted: high \(config capability table\)"):
        check_chain(cfg)


def test_other_refusals_stop_temperature_json_schema_and_hedge_targets() -> None:
    with pytest.raises(ConfigError, match=r"^steps\.answer\.stop: model 'gpt-5'.*'stop'"):
        check_chain(one_step({"model": "gpt-5", "stop": ["\n"]}))
    with pytest.raises(ConfigError, match=r"^steps\.answer\.temperature: .*\(set to 0\.2; set"):
        check_chain(one_step({"model": "o3", "temperature": 0.2}))
    check_chain(one_step({"model": "o3", "temperature": 1}))  # its default is accepted
    with pytest.raises(ConfigError, match=r"^steps\.answer\.json_schema: .*accepted: text"):
        check_chain(
            one_step(
                {"model": "plain", "json_schema": {"type": "object"}},
                capabilities={"plain": {"response_format": ["text"]}},
            )
        )
    # a copy going to another provider is checked there too
    providers = {"local": {}, "openai": {"base_url": "https://api.openai.com/v1"}}
    hedge = {"delay_ms": 100, "targets": ["openai"]}
    cfg = one_step(
        {"model": "gpt-5-nano", "reasoning_effort": "none", "hedge": hedge}, providers=providers
    )
    with pytest.raises(ConfigError, match=r"'none' is not accepted by model 'gpt-5-nano'"):
        check_chain(cfg)
    # what the models accept passes, and so does the default chain on the local model
    check_chain(one_step({"model": "gpt-5.2", "reasoning_effort": "xhigh", "seed": 1}))
    check_chain(config_from_dict({}))


def test_responses_api_has_no_stop_or_seed_whatever_the_model() -> None:
    providers = {"r": {"base_url": "http://127.0.0.1:9/v1", "api": "responses"}}
    with pytest.raises(ConfigError, match=r"^steps\.answer\.stop: .*Responses API"):
        check_chain(one_step({"model": "unknown-model", "stop": ["\n"]}, providers=providers))
    with pytest.raises(ConfigError, match=r"^steps\.answer\.seed: .*Responses API"):
        check_chain(one_step({"model": "unknown-model", "seed": 7}, providers=providers))
    check_chain(one_step({"model": "unknown-model", "stop": []}, providers=providers))


def test_bad_capability_entry_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"capabilities\.m\.reasoning_effort\.0"):
        one_step({}, capabilities={"m": {"reasoning_effort": ["turbo"]}})
    with pytest.raises(ConfigError, match=r"capabilities\.m\.parms: unknown field"):
        one_step({}, capabilities={"m": {"parms": []}})


def test_the_docs_toml_examples_are_valid_and_pass_the_capability_check() -> None:
    """Every ```toml block of the README and the docs site is a valid config (merged onto
    the default chain) whose steps pass the capability check; the lab scenarios page's
    blocks are scenario files, valid scenarios."""
    from chainrun.lab.scenarios import Scenario

    root = Path(__file__).parents[1]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    n = scenarios = 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for code in re.findall(r"```python\n(.*?)```", text, re.S):
            if "register_check(" in code:  # a page's own check, named by its toml blocks
                exec(compile(code, str(page), "exec"), {})
        for block in re.findall(r"```toml\n(.*?)```", text, re.S):
            if page.name == "lab-scenarios.md":
                Scenario.model_validate(tomllib.loads(block))
                scenarios += 1
                continue
            check_chain(config_from_dict(tomllib.loads(block), str(page.relative_to(root))))
            n += 1
    assert n >= 15 and scenarios >= 1


async def test_a_guard_step_goes_through_the_same_check_as_an_llm_step() -> None:
    cfg = config_from_dict({
        "order": ["guard", "answer"],
        "answer_step": "answer",
        "providers": {"openai": {"base_url": "https://api.openai.com/v1"}},
        "steps": {
            "answer": {"provider": "openai", "model": "gpt-5.1", "prompt": "{message}"},
            "guard": {"kind": "guard", "provider": "openai", "model": "gpt-5.1",
                      "reasoning_effort": "minimal", "on_missing_verdict": "closed"},
        },
    })  # fmt: skip
    with pytest.raises(ConfigError, match=r"^steps\.guard\.reasoning_effort: 'minimal'"):
        check_chain(cfg)
    fake = FakeProvider(name="openai")
    with pytest.raises(ConfigError, match=r"steps\.guard\.reasoning_effort"):
        async with Chain(cfg, providers={"openai": fake}):
            pass
    assert fake.requests == []  # refused before any call


def test_a_guard_hedged_onto_a_model_that_refuses_its_stop_is_refused() -> None:
    cfg = config_from_dict({
        "order": ["guard", "answer"],
        "answer_step": "answer",
        "providers": {"local": {}, "openai": {"base_url": "https://api.openai.com/v1"}},
        "steps": {
            "answer": {"provider": "local", "prompt": "{message}"},
            "guard": {"kind": "guard", "provider": "local", "model": "o4-mini-2025-04-16",
                      "stop": ["\n"], "on_missing_verdict": "open",
                      "hedge": {"delay_ms": 300, "targets": ["openai"]}},
        },
    })  # fmt: skip
    with pytest.raises(ConfigError, match=r"^steps\.guard\.stop"):
        check_chain(cfg)
