"""The CLI's event loop: uvloop when importable, asyncio's otherwise or when asked
(chainrun.eventloop). The library itself never picks a loop."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from chainrun import eventloop
from chainrun.cli import run_async


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
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.loop_factory() is None


def test_the_cli_runs_on_uvloop_when_installed_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = fake_uvloop(monkeypatch)
    monkeypatch.delenv(eventloop.ENV, raising=False)

    async def answer() -> int:
        return 42

    assert run_async(answer()) == 42 and made == [1]
    assert eventloop.uvicorn_loop() == "auto"
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert eventloop.loop_factory() is None and eventloop.uvicorn_loop() == "asyncio"
    assert run_async(answer()) == 42 and made == [1]


async def test_loop_name() -> None:
    assert eventloop.loop_name(asyncio.get_running_loop()) == "asyncio"
