"""``chainrun serve``: the chain as a chat backend (SSE chat, OpenAI-compatible face, chat page)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from chainrun.cli import DEFAULT_DB_PATH, ConfigOpt, DbOpt, app, handle_errors
from chainrun.serve.settings import DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL_ID, TOKEN_ENV

if TYPE_CHECKING:
    from chainrun.serve.turns import TurnObserver


@app.command("serve")
@handle_errors
def serve_command(
    host: Annotated[
        str, typer.Option(help=f"Address to listen on (beyond loopback needs {TOKEN_ENV}).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free).")] = 8000,
    config: ConfigOpt = None,
    db: DbOpt = DEFAULT_DB_PATH,
    model_id: Annotated[
        str, typer.Option(help="The chain's model id on /v1 (the OpenAI-compatible face).")
    ] = DEFAULT_MODEL_ID,
    otel: Annotated[
        bool | None,
        typer.Option(
            "--otel/--no-otel",
            # help text is rich markup: "[otel]" must be escaped or it is taken as a tag
            help="Export spans and metrics by OTLP/HTTP (default: when "
            "OTEL_EXPORTER_OTLP_ENDPOINT is set; needs the otel extra, chainrun\\[otel]).",
        ),
    ] = None,
    max_body_bytes: Annotated[
        int,
        typer.Option(min=1, help="Largest request body in bytes; a larger one is answered 413 "
                     "without being read (default 1 MiB)."),
    ] = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Serve the chain until Ctrl-C: POST /chat (SSE), /v1/chat/completions, /v1/models,
    the chat page at /, /healthz and /readyz. Every turn is logged to --db as a run of
    kind live; the bearer token, if any, comes from the environment (CHAINRUN_SERVE_TOKEN).
    """
    from chainrun.config import load_config
    from chainrun.serve.server import serve
    from chainrun.telemetry import otel_requested, telemetry_from_env

    cfg = load_config(config)
    observers: list[TurnObserver] = []
    wanted = otel_requested() if otel is None else otel
    telemetry = telemetry_from_env(model_id) if wanted else None
    if telemetry is not None:
        observers.append(telemetry)
    try:
        serve(cfg, db, host=host, port=port, token=os.environ.get(TOKEN_ENV) or None,
              model_id=model_id, observers=observers, max_body_bytes=max_body_bytes)  # fmt: skip
    finally:
        if telemetry is not None:
            telemetry.shutdown()
