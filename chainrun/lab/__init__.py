"""The latency lab: an OpenAI-compatible server on loopback with a known latency distribution.

Hedging is measured against it through the real ``openai`` client over real HTTP:
a :class:`Scenario` (built-in or TOML) sets the time to first token, the tokens and
their pace, and injected faults; the server records what it did with every request
(including when a client closed its stream), readable at ``GET /admin/requests``.

::

    from chainrun.lab import LabServer

    with LabServer("bimodal-guard") as lab:
        client = AsyncOpenAI(base_url=lab.base_url, api_key="x")
        ...
        lab.requests()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chainrun.lab.process import LabServer
    from chainrun.lab.scenarios import BUILTIN_SCENARIOS, Scenario, load_scenario
    from chainrun.lab.server import create_app, serve

#: public name -> its module, imported on first use (PEP 562): ``chainrun lab serve
#: --help`` needs the scenario names, not the HTTP server
_EXPORTS = {
    "LabServer": "chainrun.lab.process",
    "BUILTIN_SCENARIOS": "chainrun.lab.scenarios",
    "Scenario": "chainrun.lab.scenarios",
    "load_scenario": "chainrun.lab.scenarios",
    "create_app": "chainrun.lab.server",
    "serve": "chainrun.lab.server",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chainrun.lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = ["BUILTIN_SCENARIOS", "LabServer", "Scenario", "create_app", "load_scenario", "serve"]
