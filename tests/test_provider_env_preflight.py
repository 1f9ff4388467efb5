"""Every used provider's keys and environment are checked before anything
starts (the local model included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chainrun.chain import Chain
from chainrun.config import load_config
from chainrun.errors import ConfigError
from chainrun.runtime import local_model


def chainrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip



# -- 4. every provider's environment is checked before anything starts -------------------

RESPONSES_TOML = """
[providers.openai]
base_url = "https://api.openai.com/v1"
api_key_env = "CHAINRUN_NUREPORTS_KEY"
api = "responses"

[steps.compose]
provider = "openai"
model = "gpt-5-mini"
reasoning_effort = "minimal"
stop = []
temperature = 1
"""


@pytest.mark.parametrize(("value", "said"), [(None, "is not set"), ("", "is empty")])
async def test_a_missing_key_is_said_before_the_local_model_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None, said: str
) -> None:
    """The providers page's Responses example (compose on openai, the other steps on the local
    model): the key's absence was said only after llama-server had started."""
    if value is None:
        monkeypatch.delenv("CHAINRUN_NUREPORTS_KEY", raising=False)
    else:
        monkeypatch.setenv("CHAINRUN_NUREPORTS_KEY", value)
    started: list[bool] = []
    monkeypatch.setattr(local_model, "up", lambda **_: started.append(True))
    path = tmp_path / "resp.toml"
    path.write_text(RESPONSES_TOML)
    chain = Chain(load_config(path), quiet=True)
    with pytest.raises(ConfigError) as info:
        await chain.open()
    assert str(info.value) == (
        f"{path}: providers.openai.api_key_env: environment variable CHAINRUN_NUREPORTS_KEY "
        + said
        + (' (set to "")' if value == "" else "")
    )
    assert info.value.path == str(path)
    assert started == []  # the local model was never started


def test_the_cli_names_the_config_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "resp.toml"
    path.write_text(RESPONSES_TOML)
    env = {k: v for k, v in os.environ.items() if k != "CHAINRUN_NUREPORTS_KEY"}
    proc = chainrun("run", "hi", "--config", str(path), "--db", str(tmp_path / "r.db"), env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"chainrun: error: {path}: providers.openai.api_key_env: environment variable "
        "CHAINRUN_NUREPORTS_KEY is not set"
    )
    assert "starting the local model" not in proc.stderr
    assert not (tmp_path / "r.db").exists()
