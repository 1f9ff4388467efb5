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


@pytest.mark.parametrize(("text", "error"), [
    # a table named for no classify label: no turn would read it
    ('[delivery]\ntitle = "Delivery"\ntext = "We deliver to the UK only."\n'
     '[returns]\ntitle = "Returns"\ntext = "30 days."\n[sizing]\ntitle = "S"\ntext = "S."\n'
     '[other]\ntitle = "O"\ntext = "O."\n',
     r"steps\.policy\.file: my_policy\.toml: \[delivery\] names no classify label; "
     r"expected a table per label, one of sizing, product_search, order_status"),
    # a label the step routes here with no table: its turns would get no policy text
    ('[returns]\ntitle = "Returns"\ntext = "30 days."\n',
     r"steps\.policy\.file: my_policy\.toml: no \[order_status\] table, and this step's "
     r"`when` routes 'order_status' turns here"),
])  # fmt: skip
def test_a_policy_file_that_does_not_fit_the_labels_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, error: str
) -> None:
    (tmp_path / "my_policy.toml").write_text(text, encoding="utf-8")
    (tmp_path / "chainrun.toml").write_text('[steps.policy]\nfile = "my_policy.toml"\n',
                                            encoding="utf-8")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    config = load_config(tmp_path / "chainrun.toml")
    with pytest.raises(ConfigError, match=error):
        Chain(config, quiet=True)
