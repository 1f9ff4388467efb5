"""Run an eval set through the chain (a run of kind ``eval``) and score it.

Each case runs ``repeat`` times as separate turns with request id ``"<case id>#<k>"``;
nothing is cached between repeats, so verdict flips measure the chain's own
non-determinism. The ``llm-rubric`` grader is built from its pinned
:class:`~chainrun.evals.GraderConfig` (temperature 0, fixed seed) on a provider of the
chain's configuration, and that configuration is stored with every verdict.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from chainrun.config import ChainConfig
from chainrun.errors import ConfigError
from chainrun.evals.assertions import Grade, GraderConfig
from chainrun.evals.cases import EvalCase
from chainrun.evals.scoring import eval_request_id, match_run, score_run
from chainrun.providers.base import ChatRequest, ChatStream, Provider
from chainrun.providers.factory import open_provider
from chainrun.replay import ReplayRequest, run_requests
from chainrun.steps import Retriever
from chainrun.store import Store


def eval_requests(cases: Sequence[EvalCase], repeat: int) -> list[ReplayRequest]:
    """One request per case and repeat, repeats interleaved (all cases, then again)."""
    return [
        ReplayRequest(id=eval_request_id(case.id, k), message=case.message)
        for k in range(repeat)
        for case in cases
    ]


@asynccontextmanager
async def grader_from_config(
    config: ChainConfig, grader: GraderConfig, *, quiet: bool = False
) -> AsyncIterator[Grade]:
    """An async ``grade(prompt) -> str`` calling ``grader.provider`` with the pinned settings.

    Raises:
        ConfigError: the grader names a provider the chain config does not define.
    """
    pc = config.providers.get(grader.provider)
    if pc is None:
        raise ConfigError(
            f"grader.provider: unknown provider {grader.provider!r}; "
            f"expected one of {sorted(config.providers)}"
        )
    provider = await open_provider(grader.provider, pc, quiet=quiet)

    async def grade(prompt: str) -> str:
        request = ChatRequest(
            model=grader.model,
            messages=[{"role": "user", "content": prompt}],
            max_output_tokens=grader.max_output_tokens,
            temperature=grader.temperature,
            seed=grader.seed,
        )
        stream = ChatStream(provider, request)
        try:
            await stream.collect()
            return stream.timer.text
        finally:
            await stream.aclose()

    try:
        yield grade
    finally:
        await provider.aclose()


async def run_eval(
    config: ChainConfig,
    cases: Sequence[EvalCase],
    store: Store,
    *,
    repeat: int = 1,
    concurrency: int = 1,
    label: str | None = None,
    source: str | None = None,
    grader: GraderConfig | None = None,
    grade: Grade | None = None,
    providers: Mapping[str, Provider] | None = None,
    retriever: Retriever | None = None,
    catalog_ids: Collection[str] | None = None,
    on_turn: Callable[..., Any] | None = None,
    quiet: bool = False,
    on_run: Callable[[int], Any] | None = None,
) -> dict[str, Any]:
    """Run every case ``repeat`` times as one eval run, score it, return the summary.

    Returns :func:`~chainrun.evals.score_run`'s summary plus ``n_cases`` and ``repeat``.
    ``grader`` defaults to ``config.grader``; ``grade`` replaces the grading call built
    from it (a test double). ``on_run`` gets the run id once the run exists (see
    :func:`chainrun.replay.run_requests`).

    Raises:
        ProviderUnavailable: a provider could not be reached (the run is marked failed).
    """
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    run_id = await run_requests(
        config, eval_requests(cases, repeat), store, kind="eval", concurrency=concurrency,
        label=label, source=source, providers=providers, retriever=retriever,
        on_turn=on_turn, quiet=quiet, on_run=on_run,
    )  # fmt: skip
    summary = await score_existing(store, run_id, cases, config, grader=grader, grade=grade,
                                   catalog_ids=catalog_ids, quiet=quiet)  # fmt: skip
    return {**summary, "n_cases": len(cases), "repeat": repeat}


async def score_existing(
    store: Store,
    run_id: int,
    cases: Sequence[EvalCase],
    config: ChainConfig,
    *,
    grader: GraderConfig | None = None,
    grade: Grade | None = None,
    catalog_ids: Collection[str] | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Score an existing run's turns (a replay, an eval, a window of live turns) without
    calling the chain again; the grader (``grader``, else ``config.grader``) is only
    started if a case has an ``llm-rubric``.

    Raises:
        UserInputError: no such run, or no turn of it matches a case.
    """
    grader = grader or config.grader
    needs_grader = grade is None and any(
        a.type == "llm-rubric" for case in cases for a in case.asserts
    )
    if not needs_grader:
        return await score_run(store, run_id, cases, grade, grader=grader,
                               catalog_ids=catalog_ids)  # fmt: skip
    match_run(store, run_id, cases)  # a wrong run fails before any grader starts
    async with grader_from_config(config, grader, quiet=quiet) as made:
        return await score_run(store, run_id, cases, made, grader=grader,
                               catalog_ids=catalog_ids)  # fmt: skip
