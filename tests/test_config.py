"""Chain configuration: defaults, key-by-key overrides, one clear error per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from chainrun.config import config_from_dict, load_config, policy_from_config
from chainrun.errors import ConfigError


def test_builtin_default_chain_has_the_six_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None)
    assert cfg.order == ["classify", "retrieve", "policy", "compose", "validate", "critique"]
    assert cfg.steps["classify"].kind == "classify"  # no model call
    assert cfg.steps["compose"].stream is True
    assert cfg.steps["retrieve"].kind == "retrieve"
    assert cfg.providers["local"].base_url is None


def test_toml_overrides_key_by_key(tmp_path: Path) -> None:
    p = tmp_path / "chainrun.toml"
    p.write_text(
        '[providers.local]\nbase_url = "http://127.0.0.1:9999/v1"\n'
        '[steps.compose]\nmax_output_tokens = 50\nreasoning_effort = "low"\n'
    )
    cfg = load_config(p)
    assert cfg.providers["local"].base_url == "http://127.0.0.1:9999/v1"
    assert cfg.steps["compose"].max_output_tokens == 50
    assert cfg.steps["compose"].reasoning_effort == "low"
    # untouched keys keep the default
    assert cfg.steps["compose"].stream is True
    assert "{products}" in cfg.steps["compose"].prompt


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"steps": {"compose": {"reasoning_effort": "extreme"}}}, "steps.compose.reasoning_effort"),
        ({"steps": {"compose": {"on_failure": "maybe"}}}, "steps.compose.on_failure"),
        ({"steps": {"compose": {"max_output_tokens": 0}}}, "steps.compose.max_output_tokens"),
        ({"steps": {"compose": {"provider": "nope"}}}, "steps.compose.provider"),
        ({"steps": {"compose": {"prompt": "{nope}"}}}, "steps.compose.prompt"),
        ({"steps": {"compose": {"colour": "red"}}}, "steps.compose.colour"),
        ({"providers": {"local": {"base_url": "ftp://x"}}}, "providers.local.base_url"),
        ({"steps": {"compose": {"hedge": {"max_attempts": 2}}}}, "steps.compose.hedge"),
        ({"steps": {"compose": {"hedge": {"delay": "fast"}}}}, "steps.compose.hedge.delay"),
        # the answer step's unknown kind is named as such (it said "expected an LLM step")
        ({"steps": {"compose": {"kind": "nosuchkind"}}}, "steps.compose.kind: the answer step"),
        # in the config's words, not the engine's delay_percentile (new user)
        (
            {"steps": {"compose": {"hedge": {"delay": "p95", "delay_ms": 100}}}},
            "steps.compose.hedge: set exactly one of delay_ms or delay",
        ),
        (
            {"steps": {"compose": {"side_effects": True, "hedge": {"delay_ms": 100}}}},
            "side_effects",
        ),
    ],
)
def test_bad_config_names_the_field(data: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(data, "chainrun.toml")
    msg = str(e.value)
    assert msg.startswith("chainrun.toml: ")
    assert expected in msg
    assert "\n" not in msg


def test_bad_value_is_shown(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[steps.compose]\nreasoning_effort = "extreme"\n')
    with pytest.raises(ConfigError, match="extreme"):
        load_config(p)


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[steps\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_hedge_percentile_and_snapshot_has_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_KEY_VAR", "sk-very-secret")
    cfg = config_from_dict({
        "providers": {"openai": {"base_url": "https://api.openai.com/v1",
                                 "api_key_env": "SECRET_KEY_VAR"}},
        "steps": {"validate": {"hedge": {"delay": "p95", "max_attempts": 3}}},
    })  # fmt: skip
    hedge = cfg.steps["validate"].hedge
    assert hedge is not None and hedge.delay_percentile == 95.0
    snap = cfg.snapshot()
    assert "SECRET_KEY_VAR" in snap and "sk-very-secret" not in snap


def test_a_shorter_chain_needs_only_order() -> None:
    cfg = config_from_dict({"order": ["classify", "compose"]})
    assert list(cfg.steps) == ["classify", "compose"]


def test_binary_config_file_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "bin.toml"
    p.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="not a text file"):
        load_config(p)


def test_every_hedge_setting_reaches_the_engine() -> None:
    """One definition: the [hedge] table is the engine's HedgePolicy plus targets and the
    `delay = "pNN"` spelling, and the step's policy carries every value and the deadline."""
    from chainrun.config import HedgeConfig
    from chainrun.hedging import HedgePolicy

    assert issubclass(HedgeConfig, HedgePolicy)
    assert set(HedgeConfig.model_fields) - set(HedgePolicy.model_fields) == {"delay", "targets"}
    cfg = config_from_dict({"steps": {"validate": {"deadline_s": 3.0, "hedge": {
        "delay": "p90", "max_attempts": 7, "initial_delay_ms": 400, "breaker_failures": 2,
        "non_fatal": [429, "timeout"], "max_extra_load": 1.0}}}})  # fmt: skip
    policy = policy_from_config(cfg.steps["validate"])
    assert isinstance(policy, HedgePolicy)
    assert (policy.delay_percentile, policy.max_attempts, policy.deadline_s) == (90.0, 7, 3.0)
    assert policy.initial_delay_ms == 400 and policy.breaker_failures == 2
    assert policy.non_fatal == frozenset({429, "timeout"})
    unhedged = policy_from_config(cfg.steps["compose"])
    assert unhedged.max_attempts == 1 and unhedged.deadline_s == cfg.steps["compose"].deadline_s


def test_hedge_limits_and_deadline_fit() -> None:
    """max_attempts up to 10 (5 is gRFC A6's cap and the recommendation); a fixed delay's
    attempts must start before the step's deadline; deadline_s belongs to the step."""
    ok = config_from_dict({"steps": {"validate": {"deadline_s": 3.0, "hedge": {
        "delay_ms": 350, "max_attempts": 8, "max_extra_load": 1.0}}}})  # fmt: skip
    assert policy_from_config(ok.steps["validate"]).max_attempts == 8
    with pytest.raises(ConfigError, match=r"steps\.validate\.hedge\.max_attempts"):
        config_from_dict({"steps": {"validate": {"hedge": {"delay_ms": 100, "max_attempts": 11}}}})
    with pytest.raises(ConfigError, match=r"attempt 10 would start at 3600 ms.*at most 8"):
        config_from_dict({"steps": {"validate": {"deadline_s": 3.0, "hedge": {
            "delay_ms": 400, "max_attempts": 10}}}})  # fmt: skip
    with pytest.raises(ConfigError, match="set deadline_s on the step"):
        config_from_dict({"steps": {"validate": {"hedge": {"delay_ms": 100, "deadline_s": 2}}}})
