"""Config errors about providers and hedging: one line naming the file and the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chainrun.config import load_config
from chainrun.errors import ConfigError


def chainrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip



# -- 6. config errors naming file and field ----------------------------------------------


def test_a_hedge_that_can_never_fire_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[steps.validate.hedge]\ndelay = "p95"\nmax_attempts = 1\n')
    with pytest.raises(ConfigError, match=r"c\.toml: steps\.validate\.hedge: max_attempts: a "
                       r"hedge needs at least 2 .* can never fire"):  # fmt: skip
        load_config(path)


def test_azure_with_both_a_key_and_an_entra_token_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[providers.azure]\nkind = "azure"\nendpoint = "https://x.openai.azure.com"\n'
        'api_version = "2024-10-21"\napi_key_env = "K"\nentra_token_env = "T"\n'
    )
    with pytest.raises(ConfigError, match=r"c\.toml: providers\.azure: api_key_env and "
                       "entra_token_env are both set: give one"):  # fmt: skip
        load_config(path)


def test_a_refused_first_call_does_not_repeat_itself() -> None:
    """A server answering 404 to everything said
    ``... (HTTP 404): local: HTTP 404: Error code: 404``."""
    from chainrun.errors import RequestRejected, StepConfigError

    bare = StepConfigError("compose", "local", RequestRejected("local: HTTP 404: Error code: 404",
                                                               404, provider="local"))  # fmt: skip
    assert str(bare) == (
        "steps.compose: provider 'local' refused the model or URL on the step's first call "
        "(HTTP 404)"
    )
    said = StepConfigError("compose", "local", RequestRejected(
        "local: HTTP 404: The model 'x' does not exist", 404, provider="local"))  # fmt: skip
    assert str(said).endswith("(HTTP 404): The model 'x' does not exist")
