"""The sample policy file's own comment: the config it shows for a shop's own file is
one the config takes, and the chain then reads that file in both places it names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chainrun.chain import Chain
from chainrun.config import load_config
from chainrun.errors import ConfigError

SAMPLE = Path(__file__).resolve().parents[1] / "chainrun" / "data" / "shop_policy.toml"


def test_the_config_the_sample_shows_is_taken(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    shown = [ln.removeprefix("#   ") for ln in lines if ln.startswith("#   ")]
    assert shown, "the sample's comment shows no config"
    (tmp_path / "chainrun.toml").write_text("\n".join(shown) + "\n", encoding="utf-8")
    shutil.copy(SAMPLE, tmp_path / "my_policy.toml")
    monkeypatch.chdir(tmp_path)
    config = load_config(tmp_path / "chainrun.toml")
    assert config.steps["policy"].file == "my_policy.toml"  # type: ignore[union-attr]
    grounding = config.steps["compose"].grounding  # type: ignore[union-attr]
    assert grounding is not None and grounding.policy_file == "my_policy.toml"
    Chain(config, quiet=True).check()  # builds: the policy step read the file
    (tmp_path / "my_policy.toml").unlink()
    with pytest.raises(ConfigError, match=r"my_policy\.toml"):
        Chain(config, quiet=True)  # the file is read, not the sample
