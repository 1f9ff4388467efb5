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

from chainrun.lab.process import LabServer
from chainrun.lab.scenarios import BUILTIN_SCENARIOS, Scenario, load_scenario
from chainrun.lab.server import create_app, serve

__all__ = ["BUILTIN_SCENARIOS", "LabServer", "Scenario", "create_app", "load_scenario", "serve"]
