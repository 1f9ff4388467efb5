"""The ASGI app of ``chainrun serve``: a chat backend a shop could run as is or copy from.

Routes::

    GET  /                        the chat page (static HTML/CSS/JS, works offline)
    GET  /static/...              its files
    GET  /healthz                 200 {"status": "ok"} while the process serves
    GET  /readyz                  200 once the providers answered their preflight, else 503
                                  (also while the answer's model server cannot be reached,
                                  while every circuit breaker of the answer step is open
                                  ("reason": "breaker_open"), while the run log refuses
                                  writes (its writer losing them or stopped:
                                  "log_refuses_writes"), while callers' identities cannot
                                  be checked ("identity_unavailable"), and, with an
                                  identity source, while the run log is away: every chat
                                  then needs it for its owner check); its "log"
                                  says the run log writer's state (ok, retrying, losing),
                                  queued and lost writes, and the front desk's ("desk":
                                  ok, or away with since when and why); ``file_gone``
                                  with ``lost_turns`` once the log's SQLite file was
                                  deleted; under ``serve --workers N``, "workers" says
                                  how many of the N serve ({"serving": k, "workers": N})
    POST /chat                    one turn as Server-Sent Events (chainrun.serve.chat)
    GET  /v1/models               the OpenAI-compatible face (chainrun.serve.openai_face)
    GET  /v1/models/{id}
    POST /v1/chat/completions
    POST /v1/responses            the Responses API face (chainrun.serve.responses_face)

One :class:`~chainrun.Chain` (one connection pool per provider, one run of kind
``live``) serves every chat. It is opened in the background at start-up, retried every
``retry_s`` until its providers answer, and closed (the run marked ``complete``) at
shutdown. With a token set, every route but ``/``, ``/static``, ``/healthz`` and
``/readyz`` needs ``Authorization: Bearer TOKEN`` (the page asks for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from chainrun.chain import Chain
from chainrun.desk.background import BackgroundRequests
from chainrun.errors import ChainrunError, ConfigError, LogFileGone, LostTurn
from chainrun.runtime.gc_settings import freeze_startup_objects, rare_full_collections
from chainrun.serve import chat, openai_face, responses_face
from chainrun.serve.browsers import CheckedHost, RequestId, RequireJSON, cors
from chainrun.serve.errors import (
    body_too_large,
    body_too_large_response,
    error_body,
    http_error,
)
from chainrun.serve.identity import IdentitySource
from chainrun.serve.provider_watch import LocalModelWatch, ProviderWatch
from chainrun.serve.settings import (
    CHAT_KEEPALIVE_S,
    CONVERSATION_HEADER,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MODEL_ID,
)
from chainrun.serve.turns import TurnObserver, TurnRunner
from chainrun.serve.workers import WorkerSlot

log = logging.getLogger("chainrun.serve")

STATIC_DIR = Path(__file__).parent / "static"
#: routes open without the bearer token (the page itself holds no data)
PUBLIC_PATHS = ("/healthz", "/readyz", "/static/")


class ServeState:
    """The app's shared state: the chain once open, and why it is not (yet).

    Args:
        chain_factory: builds a new (unopened) chain; called again after a failed open.
        observers: told about every logged turn (e.g. the OpenTelemetry exporter).
        model_id: the model id of the OpenAI-compatible face.
        retry_s: wait between attempts to open the chain, in s.
        freeze_gc: once the chain is open, ``gc.freeze()`` the objects alive then and
            make full collections rare (:mod:`chainrun.runtime.gc_settings`; ``chainrun serve``
            does).
        shutdown_grace_s: at shutdown, how long the turns in flight get to finish (s,
            from the stop request: :meth:`request_stop`) before they are cancelled (each
            is logged ``cancelled``); None: wait for them however long they take.
        watch_options: keyword arguments of the
            :class:`~chainrun.serve.provider_watch.LocalModelWatch` started when the
            chain uses the embedded local model (``every_s``; tests give ``find`` and
            ``start``); ``every_s`` is also the
            :class:`~chainrun.serve.provider_watch.ProviderWatch`'s.
        chat_keepalive_s: s between keep-alive comment lines on ``/chat`` (None: none).
        v1_keepalive_s: the same on the OpenAI face's streams; None (the default): none,
            as OpenAI sends none (:mod:`chainrun.serve.sse`).
        fleet: a worker of ``serve --workers N``: its slot on the parent's board
            (:class:`~chainrun.serve.workers.WorkerSlot`), marked serving once the chain
            is open and not once stopping; ``/readyz`` says how many workers serve.
        background: the chat UIs' background requests the OpenAI face recognises
            (:mod:`chainrun.desk.background`; default: Open WebUI's and LibreChat's).
        conversation_header: the request header the OpenAI face reads a conversation
            id from when the body names none (default ``Conversation-Id``).
        step_events: every ``/chat`` stream carries the operator's events (``step``,
            ``tool``, ``grounding``: :func:`chainrun.serve.chat.step_events_wanted`).
    """

    def __init__(
        self,
        chain_factory: Callable[[], Chain],
        *,
        observers: Sequence[TurnObserver] = (),
        model_id: str = DEFAULT_MODEL_ID,
        retry_s: float = 2.0,
        freeze_gc: bool = False,
        shutdown_grace_s: float | None = None,
        watch_options: Mapping[str, Any] | None = None,
        chat_keepalive_s: float | None = CHAT_KEEPALIVE_S,
        v1_keepalive_s: float | None = None,
        fleet: WorkerSlot | None = None,
        background: BackgroundRequests | None = None,
        conversation_header: str = CONVERSATION_HEADER,
        step_events: bool = False,
    ) -> None:
        self.chain_factory = chain_factory
        self.step_events = step_events
        self.background = background if background is not None else BackgroundRequests()
        self.conversation_header = conversation_header.lower()
        #: the Responses face's threads, by response id (its previous_response_id)
        self.response_threads = responses_face.ResponseThreads()
        self.fleet = fleet
        self.chat_keepalive_s = chat_keepalive_s
        self.v1_keepalive_s = v1_keepalive_s
        self.shutdown_grace_s = shutdown_grace_s
        #: time.monotonic() of the first stop request (None: none yet)
        self.stop_requested_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.freeze_gc = freeze_gc
        self.observers = list(observers)
        self.model_id = model_id
        self.retry_s = retry_s
        self.chain: Chain | None = None
        self.runner: TurnRunner | None = None
        self.last_error: str | None = None
        self._opener: asyncio.Task[None] | None = None
        #: watches the embedded local model's server once the chain is open (None: the
        #: chain uses no embedded model)
        self.model_watch: LocalModelWatch | None = None
        self._watch_options = dict(watch_options or {})
        self._watcher: asyncio.Task[None] | None = None
        #: says when the answer step's provider cannot be reached (set once the chain is open)
        self.provider_watch: ProviderWatch | None = None
        self._watch_every = {k: v for k, v in self._watch_options.items() if k == "every_s"}
        #: checks every :attr:`log_check_s` that the log's SQLite file is still there
        self._log_checker: asyncio.Task[None] | None = None
        self.log_check_s = 1.0
        #: the log's SQLite file was found deleted or replaced (said once, on stderr)
        self.log_file_gone = False
        #: set at close when the log's file was gone: the run's turns lost with it
        self.log_gone: LogFileGone | None = None
        #: the config error that ended the opener (None: none); the server stops on it
        self.fatal: ConfigError | None = None
        #: called once :attr:`fatal` is set (``chainrun serve``: stop the server)
        self.on_fatal: Callable[[], None] | None = None

    def not_ready_reason(self) -> str:
        return self.last_error or "starting: the providers have not answered their preflight yet"

    async def _open_until_ready(self) -> None:
        """Open a new chain every :attr:`retry_s` until one opens; ``/readyz`` says the
        last failure. A :class:`~chainrun.errors.ConfigError` (the config cannot start,
        whatever is retried) ends it instead: kept in :attr:`fatal`, and
        :attr:`on_fatal` called (``chainrun serve`` stops and says it in one line).
        Another chainrun error (a provider that does not answer yet) is said in one
        warning line; any other exception (a fault chainrun has no name for, such as
        a database error) is said with its traceback the first time, then in one line,
        and retried too: it must never end the opener, which would leave ``/readyz``
        saying "starting" for good with nothing said."""
        unexpected: set[str] = set()  # exception types already said with a traceback
        while True:
            try:
                chain = self.chain_factory()
                await chain.open()
            except ConfigError as e:  # the config cannot start: no retry would help
                self.last_error = f"{type(e).__name__}: {e}"
                self.fatal = e
                if self.on_fatal is not None:
                    self.on_fatal()
                return
            except ChainrunError as e:
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("chain not ready (%s); retrying in %g s", self.last_error, self.retry_s)
                await asyncio.sleep(self.retry_s)
                continue
            except Exception as e:
                kind = f"{type(e).__module__}.{type(e).__qualname__}"
                self.last_error = f"{type(e).__name__}: {e}"
                log.error("chain not ready: opening it failed (%s); retrying in %g s",
                          self.last_error, self.retry_s,
                          exc_info=e if kind not in unexpected else None)  # fmt: skip
                unexpected.add(kind)
                await asyncio.sleep(self.retry_s)
                continue
            self.chain, self.last_error = chain, None
            self.provider_watch = ProviderWatch(chain.answer_providers(), **self._watch_every)
            self.runner = TurnRunner(
                chain, self.observers, on_finished=[self.provider_watch.turn_finished]
            )
            embedded = chain.embedded_model_providers()
            if embedded:
                self.model_watch = LocalModelWatch(embedded, **self._watch_options)
                self._watcher = asyncio.create_task(self.model_watch.run())
            if chain.store is not None and chain.store.path is not None:
                self._log_checker = asyncio.create_task(self._watch_log_file())
            if self.freeze_gc:
                freeze_startup_objects()
                rare_full_collections()
            if self.fleet is not None and self.stop_requested_at is None:
                self.fleet.mark(True)
            return

    async def _watch_log_file(self) -> None:
        """Said once, when found (a stat every :attr:`log_check_s` s)."""
        while True:
            if self.check_log_file():
                return
            await asyncio.sleep(self.log_check_s)

    def check_log_file(self) -> bool:
        """Whether the log's SQLite file was deleted or replaced since the chain opened it
        (:meth:`chainrun.log.store.Store.file_gone`; one ``stat``). SQLite says nothing
        then and goes on writing into the deleted file, so every turn of the live run,
        before and after, is lost when the process ends: the first time it is found,
        one warning line says so."""
        if self.log_file_gone:
            return True
        chain = self.chain
        if chain is None or chain.store is None or not chain.store.file_gone():
            return False
        self.log_file_gone = True
        if chain.run_id is None:  # no turn yet: the run is made at the first one
            log.warning("run log %s was deleted or replaced while serving (no turn written "
                        "yet): every turn from now on is lost with it; restart serve to log "
                        "again", chain.store.name)  # fmt: skip
            return True
        log.warning("run log %s was deleted or replaced while run %s was writing it: the "
                    "run's %d turns so far and every turn from now on are lost with it; "
                    "restart serve to log again", chain.store.name, chain.run_id,
                    self._turns_in_run(chain))  # fmt: skip
        return True

    @staticmethod
    def _turns_in_run(chain: Chain) -> int:
        """The live run's turns written so far (read through the store's own connection,
        which still holds the deleted file)."""
        if chain.store is None or chain.run_id is None:
            return 0
        n = chain.store.log.scalar("select count(*) from turns where run_id = ?",
                                   [chain.run_id])  # fmt: skip
        return int(n or 0)

    def log_status(self) -> dict[str, Any] | None:
        """``/readyz``'s ``log``: the store's :meth:`~chainrun.log.store.Store.log_status`
        (None without a log); once the SQLite file is gone its ``state`` is
        ``file_gone`` and ``lost_turns`` counts the run's turns that went with it."""
        chain = self.chain
        if chain is None or chain.store is None:
            return None
        status = chain.store.log_status()
        if self.check_log_file():
            lost = self._turns_in_run(chain)
            run = f"run {chain.run_id}" if chain.run_id is not None else "serve"
            status.update(
                state="file_gone",
                lost_turns=lost,
                detail=f"the log file was deleted or replaced while {run} was writing it: "
                f"its {lost} turns and every turn from now on are lost with it; restart serve "
                "to log again",
            )
        return status

    def start(self) -> None:
        """Start opening the chain in the background (``/readyz`` says when it is done)."""
        self._loop = asyncio.get_running_loop()
        self._opener = asyncio.create_task(self._open_until_ready())

    async def ready_to_take_connections(self, poll_s: float = 0.05) -> None:
        """Wait, in the app's start-up, until this process should take connections.

        A worker of ``serve --workers N`` started while another worker serves (one that
        replaces a dead worker) takes none until its chain is open: uvicorn starts
        accepting on the shared socket only once the app's start-up is done, and the
        kernel gives each connection to a process that accepts, so none reaches a
        worker that would answer it 503 ``not_ready``. Returns at once for one
        process and for a worker that no other worker serves beside (the fleet's
        first: it takes connections at once and ``/readyz`` says why it is not ready);
        otherwise once the chain is open, no other worker serves any more, the
        opener ended, or a stop was asked for (``poll_s``: s between looks).
        """
        fleet = self.fleet
        if fleet is None:
            return
        while True:  # polled: the other workers' marks are in memory shared across forks
            opener_ended = self._opener is not None and self._opener.done()
            if (self.chain is not None or self.stop_requested_at is not None
                    or fleet.counts()["serving"] == 0 or opener_ended):  # fmt: skip
                return
            await asyncio.sleep(poll_s)

    def turns_in_flight(self) -> int:
        """Turns running now (answered turns whose checks still run count too)."""
        runner = self.runner
        return sum(1 for t in runner.background if not t.done()) if runner else 0

    def request_stop(self, *, now: bool = False) -> None:
        """The server was told to stop (safe from a signal handler or another thread):
        the grace of the turns in flight starts now (:attr:`shutdown_grace_s`); with
        ``now`` they are cancelled at once (each logs itself ``cancelled``)."""
        first = self.stop_requested_at is None
        if first:
            self.stop_requested_at = time.monotonic()
            if self.fleet is not None:
                self.fleet.mark(False)
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if now:
            loop.call_soon_threadsafe(self._cancel_turns, False)
        elif first and self.shutdown_grace_s is not None:
            grace = self.shutdown_grace_s
            loop.call_soon_threadsafe(lambda: loop.call_later(grace, self._cancel_turns, True))

    def _cancel_turns(self, at_deadline: bool) -> None:
        n = self.runner.cancel() if self.runner is not None else 0
        if n and at_deadline:
            log.warning("cancelled %d turn%s still running at the stop's deadline (logged "
                        "cancelled; one already answered stays ok)",
                        n, "" if n == 1 else "s")  # fmt: skip

    async def wait_ready(self) -> None:
        """Wait until the chain is open (for tests and embedding code)."""
        assert self._opener is not None, "start() first"
        await asyncio.shield(self._opener)

    async def aclose(self) -> None:
        """Stop opening, close the chain (ending its run ``complete``)."""
        for task in (self._opener, self._watcher, self._log_checker):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.provider_watch is not None:
            await self.provider_watch.aclose()
        runner = self.runner
        if runner is not None:
            await self._drain(runner)
        self.runner = None
        chain = self.chain
        if chain is not None:
            await chain.aclose("complete")
            if (
                chain.store is not None
                and chain.run_id is not None
                and (self.log_file_gone or chain.store.file_gone())
            ):
                why = "the log file was deleted or replaced"
                lost = [LostTurn(t.id, t.request_id, why) for t in chain.store.turns(chain.run_id)]
                self.log_gone = LogFileGone(chain.store.name, chain.run_id, lost)
        self.chain = None

    async def _drain(self, runner: TurnRunner) -> None:
        """Wait for the turns in flight, for :attr:`shutdown_grace_s` at most (counted
        from the stop request), then cancel the rest and wait for them to log."""
        if self.shutdown_grace_s is None:
            await runner.drain()
            return
        since = self.stop_requested_at or time.monotonic()
        left = since + self.shutdown_grace_s - time.monotonic()
        drain = asyncio.ensure_future(runner.drain())
        try:
            await asyncio.wait_for(asyncio.shield(drain), max(left, 0.0))
        except TimeoutError:
            self._cancel_turns(True)
        await drain


class BearerAuth:
    """ASGI middleware: require ``Authorization: Bearer TOKEN`` except on ``/`` and
    :data:`PUBLIC_PATHS` (the token compared in constant time; the scheme's name in any
    case, as RFC 9110 section 11.1 has it). Pure ASGI, so streamed responses and their
    disconnects pass through untouched."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == "/" or path.startswith(PUBLIC_PATHS):
            await self.app(scope, receive, send)
            return
        scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), self._expected):
            scope.setdefault("state", {})["authenticated"] = True  # the operator's events
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            error_body("missing or wrong bearer token", "invalid_request_error",
                       code="invalid_api_key"),
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip
        await response(scope, receive, send)


class _ServeApp(Starlette):
    """Starlette with :class:`~chainrun.serve.browsers.RequestId` outside everything, so
    that every response (a 500 of Starlette's own error middleware too) has its
    ``x-request-id``; its request body limit (``max_body_size``) answers in the one
    error shape: Starlette's own middleware counts the bytes of a body as they are read
    (a chunked body stops at the limit; its 413 comes from :func:`body_too_large`), but
    a ``Content-Length`` over the limit it answers in plain text; :class:`DeclaredLength`
    answers that one first, before anything reads the body."""

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        assert self.max_body_size is not None
        return RequestId(DeclaredLength(stack, self.max_body_size))


class DeclaredLength:
    """Pure ASGI: a request whose ``Content-Length`` is over ``limit`` bytes gets 413 at
    once; its body is never read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            declared = Headers(scope=scope).get("content-length", "")
            if declared.isdigit() and int(declared) > self.limit:
                await body_too_large_response(self.limit)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _page(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _readyz(request: Request) -> Response:
    state: ServeState = request.app.state.serve
    identity: IdentitySource | None = request.app.state.identity
    unchecked = await identity.check() if identity is not None else None
    if state.runner is not None:  # a log the desk last found away: looked at again
        await state.runner.chain.desk.look()
    body, status = _readiness(state, identity, unchecked)
    if state.fleet is not None:  # how many of serve --workers N serve, whatever this one is
        body["workers"] = state.fleet.counts()
    return JSONResponse(body, status_code=status)


def _readiness(
    state: ServeState, identity: IdentitySource | None = None, unchecked: str | None = None
) -> tuple[dict[str, Any], int]:
    """``/readyz``'s body and status; ``unchecked``: why callers' identities cannot be
    checked now (:meth:`~chainrun.serve.identity.IdentitySource.check`)."""
    if state.runner is None:
        return {"status": "starting", "detail": state.not_ready_reason()}, 503
    chain = state.runner.chain
    watch = state.model_watch
    if watch is not None and watch.down is not None:  # no answer can come now
        return {"status": "not_ready", "detail": watch.down}, 503
    away = state.provider_watch.down if state.provider_watch is not None else {}
    if away:
        return {"status": "not_ready", "detail": "; ".join(away.values())}, 503
    shut = chain.answer_breakers_open()
    if shut:  # every turn fails circuit_open until one cools down
        return {"status": "not_ready", "reason": "breaker_open",
                "detail": f"the answer step's circuit breakers are open ({', '.join(shut)}): "
                "its servers failed repeatedly, and turns fail until one cools down"}, 503
    if unchecked is not None:  # every chat needs the caller's identity checked
        return {"status": "not_ready", "reason": "identity_unavailable",
                "detail": f"callers' identities cannot be checked: {unchecked}"}, 503
    log_status = state.log_status()
    if log_status is not None:
        log_status["desk"] = chain.desk.status()
    if log_status is not None and log_status.get("state") in ("losing", "stopped"):
        # turns would be answered and never logged (streams cut where a write is waited on)
        return {"status": "not_ready", "reason": "log_refuses_writes",
                "detail": f"the run log refuses writes (its writer is {log_status['state']}, "
                f"{log_status.get('lost_writes', 0)} writes lost)", "log": log_status}, 503
    log_away = _log_away(log_status)
    if log_away is not None and identity is not None:
        # every chat needs the log for its owner check: refused 503 while it is away
        return {"status": "not_ready", "detail": f"the run log is away ({log_away}): chats "
                "with an identity are refused until it answers", "log": log_status}, 503
    # the log is behind the answer: a log database that is away leaves the backend ready
    # (turns are answered); "log" says whether writes are retrying or being dropped
    return {"status": "ready", "run_id": chain.run_id, "steps": list(chain.config.order),
            "model": state.model_id, "log": log_status}, 200


def _log_away(status: dict[str, Any] | None) -> str | None:
    """Why the log is away (its writer retrying or dropping writes, or the front desk's
    last look unanswered), or None: it answers."""
    if status is None:
        return None
    desk = status.get("desk") or {}
    if desk.get("state") == "away":
        return f"the front desk's reads fail for {desk['away_s']:.1f} s: {desk['reason']}"
    if status.get("state") in ("retrying", "losing"):
        return f"its writer is {status['state']} for {status.get('outage_s') or 0:.1f} s"
    return None


def create_app(
    state: ServeState, *, token: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    identity: IdentitySource | None = None, allowed_hosts: Sequence[str] | None = None,
    cors_origins: Sequence[str] = (),
) -> Starlette:
    """The app serving ``state``'s chain; ``token``: require it as a bearer token;
    ``identity``: where the caller's identity is read (:mod:`chainrun.serve.identity`;
    None: no identity is taken and conversations are not bound);
    ``max_body_bytes``: the largest request body, in bytes (Starlette's own
    ``max_body_size``): a ``Content-Length`` over it is answered 413 before any of the
    body is read, a chunked body stops being read once over it (413 too);
    ``allowed_hosts``: the ``Host`` names it answers to (None: any;
    :func:`chainrun.serve.browsers.allowed_hosts`); ``cors_origins``: the origins whose
    pages may call it (none: no page but its own; :func:`chainrun.serve.browsers.cors`).
    Every request with a body must be ``application/json`` (415 else), and every
    response carries ``x-request-id`` (:mod:`chainrun.serve.browsers`).

    The app's lifespan starts opening the chain and closes it at shutdown; a worker
    replacing another takes connections once its chain is open
    (:meth:`ServeState.ready_to_take_connections`).

    Raises:
        ValueError: ``max_body_bytes`` below 1; an origin that is none.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes: expected at least 1, got {max_body_bytes}")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.start()
        await state.ready_to_take_connections()  # a replacement worker: once ready
        try:
            yield
        finally:
            await state.aclose()
            if identity is not None:
                await identity.aclose()

    named_headers = [state.conversation_header, "Chainrun-Events"] + (
        [identity.header] if identity else [])
    middleware = [
        *([Middleware(CheckedHost, hosts=allowed_hosts)] if allowed_hosts is not None else []),
        *([cors(cors_origins, named_headers)] if cors_origins else []),
        *([Middleware(BearerAuth, token=token)] if token else []),
        Middleware(RequireJSON),
    ]
    app = _ServeApp(
        routes=[
            Route("/", _page, methods=["GET"]),
            Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
            Route("/healthz", _healthz, methods=["GET"]),
            Route("/readyz", _readyz, methods=["GET"]),
            Route("/chat", chat.chat, methods=["POST"]),
            Route("/v1/models", openai_face.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", openai_face.model, methods=["GET"]),
            Route("/v1/chat/completions", openai_face.chat_completions, methods=["POST"]),
            Route("/v1/responses", responses_face.responses, methods=["POST"]),
        ],
        middleware=middleware,
        exception_handlers={413: body_too_large, HTTPException: http_error},
        lifespan=lifespan,
        max_body_size=max_body_bytes,
    )
    app.state.serve = state
    app.state.identity = identity
    app.state.max_body_bytes = max_body_bytes
    return app
