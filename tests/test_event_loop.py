"""The CLI's event loop: uvloop when importable, asyncio's otherwise or when asked
(chainrun.runtime.event_loop). The library itself never picks a loop."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from chainrun.cli import run_async
from chainrun.runtime import event_loop


def fake_uvloop(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A stand-in ``uvloop`` module whose factory counts its calls (and makes asyncio's
    loop: the wiring is under test, not uvloop)."""
    made: list[int] = []

    def new_event_loop() -> asyncio.AbstractEventLoop:
        made.append(1)
        return asyncio.new_event_loop()

    module = types.ModuleType("uvloop")
    module.new_event_loop = new_event_loop  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uvloop", module)
    return made


def test_no_uvloop_means_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert event_loop.loop_factory() is None


def test_the_cli_runs_on_uvloop_when_installed_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = fake_uvloop(monkeypatch)
    monkeypatch.delenv(event_loop.ENV, raising=False)

    async def answer() -> int:
        return 42

    assert run_async(answer()) == 42 and made == [1]
    assert event_loop.uvicorn_loop() == "auto"
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert event_loop.loop_factory() is None and event_loop.uvicorn_loop() == "asyncio"
    assert run_async(answer()) == 42 and made == [1]


async def test_loop_name() -> None:
    assert event_loop.loop_name(asyncio.get_running_loop()) == "asyncio"
