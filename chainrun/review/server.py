"""Serving the review page until Ctrl-C (uvicorn on loopback)."""

from __future__ import annotations

from collections.abc import Callable

import uvicorn

from chainrun.log.store import Store
from chainrun.review.app import ReviewSession, create_review_app
from chainrun.serve.head_limit import HeadLimitedProtocol
from chainrun.serve.server import bind

__all__ = ["serve_review"]


def serve_review(store: Store, run_a: int, run_b: int, *, reviewer: str, port: int,
                 seed: int, announce: Callable[[str], None]) -> None:  # fmt: skip
    """Serve the review of ``run_b`` against ``run_a`` on 127.0.0.1:``port`` (0: any
    free port) until interrupted; ``announce`` is told the page's URL once bound.

    Raises:
        UserInputError: a run that does not exist; a port that cannot be bound.
    """
    session = ReviewSession(store, run_a, run_b, reviewer, seed)
    sock = bind("127.0.0.1", port)
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_review_app(session), log_level="warning",
                                           access_log=False, http=HeadLimitedProtocol))  # fmt: skip
    announce(f"http://127.0.0.1:{bound}/")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
