"""Chain configuration: defaults, key-by-key overrides, one clear error per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from chainrun.config import config_from_dict, load_config
from chainrun.errors import ConfigError


def test_builtin_default_chain_has_the_five_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None)
    assert cfg.order == ["classify", "retrieve", "compose", "validate", "critique"]
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
        "steps": {"classify": {"hedge": {"delay": "p95", "max_attempts": 3}}},
    })  # fmt: skip
    hedge = cfg.steps["classify"].hedge
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
    """A [hedge] key the engine does not know would be silently dropped: pin the names."""
    import dataclasses

    from chainrun.config import HedgeConfig
    from chainrun.hedging import HedgePolicy

    engine = {f.name for f in dataclasses.fields(HedgePolicy)}
    # delay (as delay_percentile) and targets (the Hedger's own argument) are translated
    assert set(HedgeConfig.model_fields) - {"delay", "targets"} <= engine
