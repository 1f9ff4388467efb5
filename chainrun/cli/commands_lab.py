"""``chainrun lab serve``: the latency lab (an OpenAI-compatible server with known latencies)."""

from __future__ import annotations

from typing import Annotated

import typer

from chainrun.cli import JsonOpt, handle_errors, lab_app, print_json
from chainrun.lab.names import BUILTIN_SCENARIO_NAMES, SERVER_FAMILY_NAMES


@lab_app.command("serve")
@handle_errors
def lab_serve(
    scenario: Annotated[
        str,
        typer.Option(
            help=f"Built-in name ({', '.join(BUILTIN_SCENARIO_NAMES)}) or a scenario TOML file."
        ),
    ] = "fast",
    host: Annotated[str, typer.Option(help="Loopback address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free).")] = 8090,
    median_ms: Annotated[float | None, typer.Option(help="lognormal: median TTFT, ms.")] = None,
    sigma: Annotated[float | None, typer.Option(help="lognormal: sigma of log TTFT.")] = None,
    seed: Annotated[int | None, typer.Option(help="RNG seed.")] = None,
    server: Annotated[
        str | None,
        typer.Option(help="Send streams as this server family does: "
                     f"{', '.join(SERVER_FAMILY_NAMES)} (tool-call ids and indexes, "
                     "reasoning, usage fields, what its history refuses)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Serve /v1/chat/completions with the scenario's latencies and faults until Ctrl-C.

    Per-request records (disconnects, tokens sent) are at GET /admin/requests.
    """
    from chainrun.lab.scenarios import load_scenario
    from chainrun.lab.server import serve

    sc = load_scenario(scenario, median_ms=median_ms, sigma=sigma, seed=seed, server=server)

    def announce(bound: int) -> None:  # the port bound, not the 0 asked for
        shown = f"[{host}]" if ":" in host else host
        print_json({"scenario": sc.model_dump(mode="json"), "host": host, "port": bound,
                    "base_url": f"http://{shown}:{bound}/v1"})  # fmt: skip

    serve(sc, host=host, port=port, on_bound=announce if as_json else None)
    # serve() also announces the address it bound on stderr
