"""``chainrun serve``: the chain as a chat backend (SSE chat, OpenAI-compatible face, chat page)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from chainrun.cli import DEFAULT_DB_PATH, ConfigOpt, DbOpt, app, fail, handle_errors
from chainrun.serve.settings import (
    CHAT_KEEPALIVE_S,
    CONVERSATION_HEADER,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MODEL_ID,
    IDENTITY_KEY_ENV,
    LEEWAY_S,
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
                     f"{IDENTITY_KEY_ENV} set, an HS256 token signed with that key, of at "
                     "least 32 bytes; with --identity-jwks, an identity provider's RS256 "
                     "or ES256 token) and bind each conversation to the identity that "
                     "started it (another gets 403). Without it no identity is taken: "
                     "whoever knows a conversation id can continue it."),
    ] = None,
    identity_jwks: Annotated[
        str | None,
        typer.Option(help="The identity provider's JSON Web Key Set: a URL (fetched at "
                     "start and again when a token names a key it lacks) or a file."),
    ] = None,
    identity_issuer: Annotated[
        str | None, typer.Option(help="The iss a token must carry (not checked if unset).")
    ] = None,
    identity_audience: Annotated[
        str | None, typer.Option(help="The aud a token must carry (not checked if unset).")
    ] = None,
    identity_leeway_s: Annotated[
        float,
        typer.Option(min=0, max=600, help="Seconds of clock skew allowed on a token's exp, "
                     "nbf and iat."),
    ] = LEEWAY_S,
    background_pattern: Annotated[
        list[str] | None,
        typer.Option(help="A regular expression that makes a /v1 request a chat UI's "
                     "background request (a title, tags: it decides no pending action and "
                     "acts on nothing), besides Open WebUI's and LibreChat's; repeatable."),
    ] = None,
    conversation_header: Annotated[
        str, typer.Option(help="The header /v1 reads a conversation id from when the body's "
                          "metadata.conversation_id names none (e.g. X-OpenWebUI-Chat-Id).")
    ] = CONVERSATION_HEADER,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(help="A Host name the server answers to besides --host's own (and "
                     "localhost's, on loopback); any other Host is refused 400, so a DNS "
                     "name rebound to this address reaches nothing. With --host 0.0.0.0 "
                     "and none given, any Host is taken. Repeatable; *.example.com takes "
                     "its subdomains."),
    ] = None,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(help="An origin (scheme://host[:port]) whose pages may call the "
                     "server from a browser (CORS: preflights answered for Authorization, "
                     "Content-Type, Idempotency-Key and the identity and conversation "
                     "headers). Repeatable. Without it no page but serve's own can."),
    ] = None,
    step_events: Annotated[
        bool,
        typer.Option(help="Every /chat stream carries the operator's events (each step's "
                     "output, tool calls, the grounding check's reasons: the chat page's "
                     "waterfall). Without it a stream carries what the shopper may see, "
                     "and a request gets them with the header Chainrun-Events: steps and "
                     "the bearer token."),
    ] = False,
) -> None:
    """Serve the chain until Ctrl-C: POST /chat (SSE), /v1/chat/completions, /v1/responses,
    /v1/models, the chat page at /, /healthz and /readyz. Every turn is logged to --db as a run of
    kind live; the bearer token, if any, comes from the environment (CHAINRUN_SERVE_TOKEN).
    """
    from chainrun.config import load_config
    from chainrun.desk.background import BackgroundRequests
    from chainrun.log.reads import SeedWindows
    from chainrun.serve.server import WorkersFailed, serve
    from chainrun.telemetry.otel import otel_requested, telemetry_from_env

    cfg = load_config(config)
    observers: list[TurnObserver] = []
    wanted = otel_requested() if otel is None else otel
    token = os.environ.get(TOKEN_ENV) or None
    seeds = SeedWindows() if seed_windows else None
    identity = _identity_source(identity_header, identity_jwks, identity_issuer,
                                identity_audience, identity_leeway_s)  # fmt: skip
    try:
        background = BackgroundRequests.with_extra(background_pattern or [])
    except ValueError as e:
        fail(f"--background-pattern: {e}", 2)
        raise  # fail() exits
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
                  identity=identity, background=background,
                  conversation_header=conversation_header, allowed_host=allowed_host or (),
                  cors_origins=cors_origin or (), step_events=step_events)  # fmt: skip
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
              v1_keepalive_s=v1_keepalive_s, identity=identity, background=background,
              conversation_header=conversation_header, allowed_host=allowed_host or (),
              cors_origins=cors_origin or (), step_events=step_events)  # fmt: skip
    finally:
        if telemetry is not None:
            telemetry.shutdown()


def _identity_source(
    header: str | None, jwks: str | None, issuer: str | None, audience: str | None,
    leeway_s: float,
) -> IdentitySource | None:  # fmt: skip
    """``--identity-header`` in the mode its options and :data:`IDENTITY_KEY_ENV` ask for
    (:mod:`chainrun.serve.identity`), said in one line on stderr; a key or a token option
    without the header, an empty or weak key, or a JWKS that cannot be read refuse to
    start in one line (exit 2)."""
    from chainrun.serve.identity import (
        IdentitySource,
        IdentityUnavailable,
        JwksKeys,
        TokenRules,
        TokenVerifier,
    )

    key = os.environ.get(IDENTITY_KEY_ENV)
    if header is None:
        if key:
            fail(f"{IDENTITY_KEY_ENV} is set but --identity-header is not: name the header "
                 "that carries the signed token", 2)  # fmt: skip
        if jwks or issuer or audience:
            fail("--identity-jwks, --identity-issuer and --identity-audience check the token "
                 "in --identity-header: name that header", 2)  # fmt: skip
        return None
    if key is not None and jwks is not None:
        fail(f"{IDENTITY_KEY_ENV} and --identity-jwks: give one (the shop's own key, or the "
             "identity provider's keys)", 2)  # fmt: skip
    try:
        rules = TokenRules(issuer, audience, leeway_s)
        if key is not None:
            verifier: TokenVerifier | None = TokenVerifier.hs256(key, rules)
        elif jwks is not None:
            keys = JwksKeys(jwks)
            keys.load()
            verifier = TokenVerifier.from_jwks(keys, rules)
        elif issuer or audience:
            fail("--identity-issuer / --identity-audience check a signed token: set "
                 f"{IDENTITY_KEY_ENV} or --identity-jwks", 2)  # fmt: skip
            raise AssertionError  # fail() exits
        else:
            verifier = None
        source = IdentitySource(header, verifier)
    except (ValueError, IdentityUnavailable) as e:
        where = IDENTITY_KEY_ENV if key is not None else "--identity-jwks" if jwks else (
            "--identity-header")  # fmt: skip
        fail(f"{where}: {e}", 2)
        raise  # fail() exits
    return source  # its mode is said at start, after the address (chainrun.serve.server)
