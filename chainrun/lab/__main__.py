"""``python -m chainrun.lab serve ...``: the entry point :class:`~chainrun.lab.LabServer` runs.

Users run ``chainrun lab serve`` (the typer CLI); this argparse entry exists so
the subprocess needs nothing but the package.
"""

from __future__ import annotations

import argparse
import sys

from chainrun.errors import UserInputError


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and serve; returns the exit code (2 for a user mistake)."""
    parser = argparse.ArgumentParser(prog="python -m chainrun.lab")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the latency lab on loopback")
    s.add_argument("--scenario", default="fast", help="built-in name or TOML path")
    s.add_argument("--scenario-json", help="a whole Scenario as JSON (overrides --scenario)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8090, help="0 picks a free port")
    s.add_argument("--port-file", help="write the bound port here")
    s.add_argument("--median-ms", type=float, help="override the latency median, in ms")
    s.add_argument("--sigma", type=float, help="override the lognormal sigma")
    s.add_argument("--seed", type=int, help="override the RNG seed")
    args = parser.parse_args(argv)

    # imported late so that --help stays fast
    from pydantic import ValidationError

    from chainrun.lab.scenarios import Scenario, load_scenario
    from chainrun.lab.server import serve

    try:
        if args.scenario_json:
            scenario = Scenario.model_validate_json(args.scenario_json)
        else:
            scenario = load_scenario(
                args.scenario, median_ms=args.median_ms, sigma=args.sigma, seed=args.seed
            )
        serve(scenario, args.host, args.port, port_file=args.port_file)
    except (UserInputError, ValidationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
