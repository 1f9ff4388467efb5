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

from typing import TYPE_CHECKING

from chainrun.lazy_exports import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["BUILTIN_SCENARIOS", "LabServer", "Scenario", "create_app", "load_scenario", "serve"]
