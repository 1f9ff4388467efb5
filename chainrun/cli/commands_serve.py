"""``chainrun serve``: the chain as a chat backend (SSE chat, OpenAI-compatible face, chat page)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from chainrun.cli import DEFAULT_DB_PATH, ConfigOpt, DbOpt, app, fail, handle_errors
from chainrun.serve.settings import (
    CHAT_KEEPALIVE_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MODEL_ID,
    IDENTITY_KEY_ENV,
    TOKEN_ENV,
)

if TYPE_CHECKING:
    from chainrun.serve.identity import IdentitySource
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
            help="Export spans and metrics by OTLP/HTTP (default: when "
            "OTEL_EXPORTER_OTLP_ENDPOINT is set; needs the otel extra, chainrun[otel]).",
        ),
    ] = None,
    max_body_bytes: Annotated[
        int,
        typer.Option(min=1, help="Largest request body in bytes; a larger one is answered 413 "
                     "without being read (default 1 MiB)."),
    ] = DEFAULT_MAX_BODY_BYTES,
    seed_windows: Annotated[
        bool,
        typer.Option(
            "--seed-windows/--no-seed-windows",
            help="Before the first turn, fill each hedged step's latency window from the "
            "log's recent calls of that step to the same servers and model (the last 200 "
            "within 10 minutes, any process): hedge at the fleet's percentile from the "
            "first call instead of the warm-up delay. On by default.",
        ),
    ] = True,
    workers: Annotated[
        int,
        typer.Option(min=1, help="Worker processes sharing the port, each with its own live "
                     "run in the one log (use a PostgreSQL --db to share it widely)."),
    ] = 1,
    chat_keepalive_s: Annotated[
        float,
        typer.Option(min=0, help="Seconds between keep-alive comment lines on /chat's stream "
                     "(0: none)."),
    ] = CHAT_KEEPALIVE_S,
    v1_keepalive_s: Annotated[
        float,
        typer.Option(min=0, help="Seconds between keep-alive comment lines on the "
                     "OpenAI-compatible face's streams (default 0: none, as OpenAI sends "
                     "none and some clients reject them)."),
    ] = 0.0,
    identity_header: Annotated[
        str | None,
        typer.Option(help="Take the shopper's identity from this request header on /chat "
                     "and /v1 (the user id as the shop's gateway sets it; with "
                     f"{IDENTITY_KEY_ENV} set, an HS256 token signed with that key) and "
                     "bind each conversation to the identity that started it (another "
                     "gets 403). Without it no identity is taken: whoever knows a "
                     "conversation id can continue it."),
    ] = None,
) -> None:
    """Serve the chain until Ctrl-C: POST /chat (SSE), /v1/chat/completions, /v1/models,
    the chat page at /, /healthz and /readyz. Every turn is logged to --db as a run of
    kind live; the bearer token, if any, comes from the environment (CHAINRUN_SERVE_TOKEN).
    """
    from chainrun.config import load_config
    from chainrun.log.reads import SeedWindows
    from chainrun.serve.server import WorkersFailed, serve
    from chainrun.telemetry.otel import otel_requested, telemetry_from_env

    cfg = load_config(config)
    observers: list[TurnObserver] = []
    wanted = otel_requested() if otel is None else otel
    token = os.environ.get(TOKEN_ENV) or None
    seeds = SeedWindows() if seed_windows else None
    identity = _identity_source(identity_header)
    if workers > 1:
        # each worker builds its own exporter after the fork (its threads would not survive
        # one); serve shuts it down (flushing it) as the worker stops
        def per_worker() -> list[TurnObserver]:
            return [telemetry_from_env(model_id)] if wanted else []

        try:
            serve(cfg, db, host=host, port=port, token=token, model_id=model_id,
                  max_body_bytes=max_body_bytes, workers=workers,
                  observer_factory=per_worker, seed_windows=seeds,
                  chat_keepalive_s=chat_keepalive_s, v1_keepalive_s=v1_keepalive_s,
                  identity=identity)  # fmt: skip
        except WorkersFailed as e:  # 2 when a worker said a chainrun error, else the worst
            fail(str(e), e.exit_code)
        return
    telemetry = telemetry_from_env(model_id) if wanted else None
    if telemetry is not None:
        observers.append(telemetry)
    try:
        serve(cfg, db, host=host, port=port, token=token, model_id=model_id,
              observers=observers, max_body_bytes=max_body_bytes,
              seed_windows=seeds, chat_keepalive_s=chat_keepalive_s,
              v1_keepalive_s=v1_keepalive_s, identity=identity)  # fmt: skip
    finally:
        if telemetry is not None:
            telemetry.shutdown()


def _identity_source(header: str | None) -> IdentitySource | None:
    """``--identity-header`` with the key in :data:`IDENTITY_KEY_ENV`, if any; a key
    without the option is refused (it would be ignored without a word)."""
    from chainrun.serve.identity import IdentitySource

    key = os.environ.get(IDENTITY_KEY_ENV) or None
    if header is None:
        if key is not None:
            fail(f"{IDENTITY_KEY_ENV} is set but --identity-header is not: name the header "
                 "that carries the signed token", 2)  # fmt: skip
        return None
    try:
        return IdentitySource(header, key.encode() if key is not None else None)
    except ValueError as e:
        fail(f"--identity-header: {e}", 2)
        raise  # fail() exits
