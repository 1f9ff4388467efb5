"""``chainrun serve`` with a config that cannot start: one error line and exit 2 before
anything is bound, with one process or many (not a server answering 503 "starting"
while it retries for ever)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize(
    ("config", "said"),
    [
        ('[steps.policy]\nfile = "missing.toml"\n', "missing.toml: cannot read policy file"),
        ('[providers.local]\nbase_url = "http://127.0.0.1:9/v1"\n'
         'api_key_env = "CHAINRUN_TEST_UNSET_KEY"\n', "CHAINRUN_TEST_UNSET_KEY"),
    ],
    ids=["a policy file that is not there", "an API key variable unset"],
)  # fmt: skip
def test_a_config_that_cannot_start_is_one_line_and_exit_2(
    tmp_path: Path, config: str, said: str, workers: str
) -> None:
    (tmp_path / "chainrun.toml").write_text(config, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CHAINRUN_TEST_UNSET_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "chainrun", "serve", "--port", "0", "--workers", workers,
         "--config", "chainrun.toml", "--db", "log.db"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chainrun: error: chainrun.toml: "), lines
    assert said in lines[0]
    assert not (tmp_path / "log.db").exists()  # refused before the log was opened


async def test_a_config_error_at_open_ends_the_opener_and_calls_on_fatal() -> None:
    """What :meth:`~chainrun.chain.Chain.check` cannot see before the bind (a check at
    open) ends the opener at once, not a retry every ``retry_s`` for ever."""
    from chainrun.errors import ConfigError
    from chainrun.serve import ServeState

    tries: list[int] = []

    def factory() -> Any:
        tries.append(1)
        raise ConfigError("providers.local: cannot start")

    called: list[int] = []
    state = ServeState(factory, retry_s=0.01)
    state.on_fatal = lambda: called.append(1)
    state.start()
    await asyncio.wait_for(state.wait_ready(), 5)
    await asyncio.sleep(0.05)  # a retry, were there one
    await state.aclose()
    assert tries == [1] and called == [1]
    assert isinstance(state.fatal, ConfigError)
    assert "cannot start" in state.not_ready_reason()
