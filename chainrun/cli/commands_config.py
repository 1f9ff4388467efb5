"""``chainrun config show``: the effective chain, the built-in defaults merged with a file."""

from __future__ import annotations

import sys

from chainrun.cli import ConfigOpt, JsonOpt, config_app, handle_errors, print_json


@config_app.command("show")
@handle_errors
def show(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Print the effective chain (the built-in defaults merged with the config file) as
    TOML: every step with its kind, prompts, labels and limits. Loaded as a
    chainrun.toml it gives the same chain."""
    from chainrun.config import effective_toml, load_config  # when it runs (fast --help)

    cfg = load_config(config)
    if as_json:
        print_json(cfg.model_dump(mode="json"))
        return
    source = str(config) if config is not None else cfg.path
    sys.stdout.write(effective_toml(cfg, source))
