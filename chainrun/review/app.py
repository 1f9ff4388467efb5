"""The review page: two runs' answers to the same request side by side, blind.

``chainrun review A B`` serves it on loopback (Starlette under uvicorn). The reviewer
sees one shared request at a time (in run A's order, the ones they have not judged
first): the message, the conversation's earlier turns, and the two answers with what
each was given, in a random order drawn per reviewer and request (never which run is
which). They pick left better, the same, or right better, may tag each answer and
write a note; the judgement, the order shown and the time go to the log
(``review_judgements``), so stopping and coming back resumes where they were, in the
same process or another.

Routes::

    GET  /            the page (keyboard-driven; chainrun/review/static/review.html)
    GET  /api/state   {"reviewer", "total", "judged", "tags", "item": {...} | null}
    POST /api/judge   {"request_id", "choice": "left"|"same"|"right",
                       "tags": {"left": [...], "right": [...]}, "note"} -> the new state
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from chainrun.log.rows import ReviewJudgementRow
from chainrun.log.store import Store
from chainrun.review.pairs import ReviewPair, shared_pairs
from chainrun.review.summary import TAGS
from chainrun.serve.browsers import CheckedHost, RequireJSON, allowed_hosts
from chainrun.serve.errors import read_json

__all__ = ["ReviewSession", "create_review_app"]


class ReviewSession:
    """One reviewer's review of run ``run_a`` (baseline) against ``run_b``.

    Args:
        store: the log holding both runs (judgements are written to it).
        reviewer: who judges (kept with every judgement).
        seed: the order shown is drawn from ``(seed, reviewer, request id)``: the same
            seed shows the same order again.

    Raises:
        UserInputError: a run that does not exist (from :func:`shared_pairs`).
    """

    def __init__(self, store: Store, run_a: int, run_b: int, reviewer: str,
                 seed: int) -> None:  # fmt: skip
        self.store, self.run_a, self.run_b = store, run_a, run_b
        self.reviewer, self.seed = reviewer, seed
        self.pairs = shared_pairs(store, run_a, run_b)
        self._by_id = {p.request_id: p for p in self.pairs}

    def left_run(self, request_id: str) -> int:
        """The run shown on the left for ``request_id`` (random, fixed by the seed)."""
        rng = random.Random(f"{self.seed}:{self.reviewer}:{request_id}")
        return self.run_a if rng.random() < 0.5 else self.run_b

    def judged(self) -> set[str]:
        return {j.request_id for j in self.store.review_judgements(self.run_a, self.run_b)
                if j.reviewer == self.reviewer}  # fmt: skip

    def state(self) -> dict[str, Any]:
        """The page's state: progress and the next request to judge (None: all done)."""
        done = self.judged()
        nxt = next((p for p in self.pairs if p.request_id not in done), None)
        return {"reviewer": self.reviewer, "total": len(self.pairs), "judged": len(done),
                "tags": list(TAGS), "item": None if nxt is None else self._item(nxt)}

    def _item(self, pair: ReviewPair) -> dict[str, Any]:
        left_is_a = self.left_run(pair.request_id) == self.run_a
        left, right = (pair.a, pair.b) if left_is_a else (pair.b, pair.a)
        return {"request_id": pair.request_id, "message": pair.message,
                "history": [{"message": m, "answer": a} for m, a in pair.history],
                "left": left.as_dict(), "right": right.as_dict()}  # fmt: skip

    def judge(self, body: Any) -> dict[str, Any]:
        """Record one judgement (see the module text for ``body``); returns the new state.

        Raises:
            ValueError: a body that is not that shape, or a request not shared.
        """
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        rid, choice = body.get("request_id"), body.get("choice")
        pair = self._by_id.get(rid) if isinstance(rid, str) else None
        if pair is None or not isinstance(rid, str):
            raise ValueError(f"request_id: {rid!r} is not a request both runs answered")
        if choice not in ("left", "same", "right"):
            raise ValueError("choice: expected 'left', 'same' or 'right'")
        raw_tags = body.get("tags") or {}
        if not isinstance(raw_tags, dict):
            raise ValueError("tags: expected an object")
        left = self.left_run(rid)
        right = self.run_b if left == self.run_a else self.run_a
        tags: dict[str, list[str]] = {"a": [], "b": []}
        for side, run in (("left", left), ("right", right)):
            given = raw_tags.get(side) or []
            if not isinstance(given, list) or any(t not in TAGS for t in given):
                raise ValueError(f"tags.{side}: expected a list of {', '.join(TAGS)}")
            tags["a" if run == self.run_a else "b"] = sorted(set(given))
        note = body.get("note")
        preferred = {"left": left, "right": right, "same": None}[choice]
        self.store.save_review_judgement(ReviewJudgementRow(
            run_a=self.run_a, run_b=self.run_b, request_id=rid, reviewer=self.reviewer,
            judged_at=datetime.now(UTC).isoformat(timespec="milliseconds"), left_run=left,
            choice=choice, preferred_run=preferred, tags=tags,
            note=note if isinstance(note, str) and note.strip() else None,
        ))  # fmt: skip
        return self.state()


def create_review_app(session: ReviewSession, bound: str = "127.0.0.1") -> Starlette:
    """The review page's ASGI app for ``session``, served on the address ``bound``: it
    answers only to that address's names (``Host``), and a judgement must be
    ``application/json`` (415 else), so that no page on another origin can post one
    through the reviewer's browser (:mod:`chainrun.serve.browsers`)."""
    page = resources.files("chainrun.review").joinpath("static/review.html").read_text("utf-8")

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def state(request: Request) -> Response:
        return JSONResponse(session.state())

    async def judge(request: Request) -> Response:
        try:
            body = read_json(await request.body())
            return JSONResponse(session.judge(body))
        except ValueError as e:
            return JSONResponse({"error": {"message": str(e)}}, status_code=400)

    hosts = allowed_hosts(bound) or ()
    return Starlette(routes=[Route("/", index), Route("/api/state", state),
                             Route("/api/judge", judge, methods=["POST"])],
                     middleware=[Middleware(CheckedHost, hosts=hosts),
                                 Middleware(RequireJSON)])  # fmt: skip
