"""Run an eval set through the chain (a run of kind ``eval``) and score it.

Each case runs ``repeat`` times as separate turns with request id ``"<case id>#<k>"``;
nothing is cached between repeats, so verdict flips measure the chain's own
non-determinism. The ``llm-rubric`` grader is built from its pinned
:class:`~chainrun.evals.GraderConfig` (temperature 0, fixed seed) on a provider of the
chain's configuration, and that configuration is stored with every verdict.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from chainrun.config import ChainConfig
from chainrun.conversations.history import HistoryTurn
from chainrun.errors import ConfigError, ProviderError, ProviderUnavailable
from chainrun.evals.assertions import Grade, GraderConfig
from chainrun.evals.cases import EvalCase
from chainrun.evals.scoring import eval_request_id, match_run, score_run
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest, ChatStream, Provider
from chainrun.providers.factory import open_provider
from chainrun.replay.run import ReplayRequest, run_requests
from chainrun.steps import Retriever

#: The seed an eval run sends with every model call that sets none (llama.cpp's server
#: and OpenAI's Chat Completions take ``seed``; with temperature 0 a server that is
#: deterministic at all answers the same case the same way)
EVAL_SEED = 0


def deterministic(config: ChainConfig) -> ChainConfig:
    """``config`` with every model step at temperature 0 and, where it sets no seed,
    :data:`EVAL_SEED`: an eval compares answers, and a small model's sampling noise at
    temperature 0.7 flipped 9 of 31 assertions between three runs of one chain (the
    verdicts of a change then drown in it). Steps without a temperature (retrieval,
    rules) are unchanged."""
    steps = {}
    for name, step in config.steps.items():
        if hasattr(step, "temperature") and hasattr(step, "seed"):
            seed = step.seed if step.seed is not None else EVAL_SEED
            step = step.model_copy(update={"temperature": 0.0, "seed": seed})
        steps[name] = step
    return config.model_copy(update={"steps": steps})


def eval_requests(cases: Sequence[EvalCase], repeat: int) -> list[ReplayRequest]:
    """One request per case and repeat, repeats interleaved (all cases, then again).

    A conversation's cases keep their ``conversation_id`` (with ``#k`` for repeat k, so
    repeats are conversations of their own) and ``turn``; the replay runs them in turn
    order with the chain's own earlier answers as history."""
    return [
        ReplayRequest(
            id=eval_request_id(case.id, k),
            message=case.message,
            conversation_id=eval_request_id(case.conversation_id, k)
            if case.conversation_id is not None
            else None,
            turn=case.turn,
            history=tuple(HistoryTurn(h.message, h.answer) for h in case.history)
            if case.history is not None
            else None,
        )
        for k in range(repeat)
        for case in cases
    ]


def needs_grader(cases: Sequence[EvalCase]) -> bool:
    """Whether any case has an ``llm-rubric`` assertion (only those call a grader)."""
    return any(a.type == "llm-rubric" for case in cases for a in case.asserts)


def _grader_config_error(config: ChainConfig, e: ConfigError) -> ConfigError:
    """``e`` about the grader's provider, saying it is the grader's and naming the file."""
    where = f"{config.path}: " if config.path is not None and e.path is None else ""
    return ConfigError(f"{where}grader: {e}", path=e.path or config.path, line=e.line)


@asynccontextmanager
async def grader_from_config(
    config: ChainConfig, grader: GraderConfig, *, quiet: bool = False
) -> AsyncIterator[Grade]:
    """An async ``grade(prompt) -> str`` calling ``grader.provider`` with the pinned settings.

    The provider is built and checked on entry (its key variables, then a ``GET /models``,
    as for the chain's own providers), so a grader that is down fails here, in one line
    that names it as the grader.

    Raises:
        ConfigError: the grader names a provider the chain config does not define, or
            that provider's key variable is not set.
        ProviderUnavailable: the grader's provider cannot be reached or did not answer
            its startup check; the message starts ``grader ([grader] provider = ...)``.
    """
    pc = config.providers.get(grader.provider)
    if pc is None:
        raise ConfigError(
            f"grader.provider: unknown provider {grader.provider!r}; "
            f"expected one of {sorted(config.providers)}"
        )
    try:
        pc.check_env(grader.provider)
        provider = await open_provider(grader.provider, pc, quiet=quiet)
    except ConfigError as e:
        raise _grader_config_error(config, e) from None
    except ProviderError as e:
        raise ProviderUnavailable(
            f"grader ([grader] provider = {grader.provider!r}, model = {grader.model!r}) is "
            f"not usable, so the llm-rubric cases cannot be scored; no case was run: {e}"
        ) from None

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


async def check_grader(
    config: ChainConfig,
    cases: Sequence[EvalCase],
    grader: GraderConfig | None = None,
    *,
    quiet: bool = False,
) -> None:
    """Preflight: when a case has an ``llm-rubric``, open the grader (``grader``, else
    ``config.grader``) and close it again; a no-op otherwise. Lets a caller fail before it
    creates a log file at all (:func:`run_eval` checks the grader again before any case).

    Raises:
        ConfigError, ProviderUnavailable: as :func:`grader_from_config`.
    """
    if needs_grader(cases):
        async with grader_from_config(config, grader or config.grader, quiet=quiet):
            pass


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
    act: bool = False,
    as_configured: bool = False,
) -> dict[str, Any]:
    """Run every case ``repeat`` times as one eval run, score it, return the summary
    (``act``: carry out tools with side effects; default: stub them). The chain's model
    steps run :func:`deterministic` (temperature 0, a seed) unless ``as_configured``.

    Returns :func:`~chainrun.evals.score_run`'s summary plus ``n_cases`` and ``repeat``.
    ``grader`` defaults to ``config.grader``; ``grade`` replaces the grading call built
    from it (a test double). ``on_run`` gets the run id once the run exists (see
    :func:`chainrun.replay.run_requests`).

    When a case has an ``llm-rubric`` (and ``grade`` is None), the grader is opened and
    checked before any case runs, so a grader that is down fails with no run written.

    Raises:
        ProviderUnavailable: a provider could not be reached (the run is marked failed),
            or the grader could not (before any run exists).
        ConfigError: the grader's provider is unknown or its key variable is not set.
    """
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    grader = grader or config.grader
    if not as_configured:
        config = deterministic(config)
    async with AsyncExitStack() as stack:
        if grade is None and needs_grader(cases):
            # the grader is checked before any case runs: a grader that is down must not
            # cost the whole eval set's model calls and leave an unscorable run behind
            grade = await stack.enter_async_context(
                grader_from_config(config, grader, quiet=quiet)
            )
        run_id = await run_requests(
            config, eval_requests(cases, repeat), store, kind="eval", concurrency=concurrency,
            label=label, source=source, providers=providers, retriever=retriever,
            on_turn=on_turn, quiet=quiet, on_run=on_run, act=act,
        )  # fmt: skip
        summary = await score_existing(store, run_id, cases, config, grader=grader,
                                       grade=grade, catalog_ids=catalog_ids,
                                       quiet=quiet)  # fmt: skip
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
    if grade is not None or not needs_grader(cases):
        return await score_run(store, run_id, cases, grade, grader=grader,
                               catalog_ids=catalog_ids)  # fmt: skip
    match_run(store, run_id, cases)  # a wrong run fails before any grader starts
    async with grader_from_config(config, grader, quiet=quiet) as made:
        return await score_run(store, run_id, cases, made, grader=grader,
                               catalog_ids=catalog_ids)  # fmt: skip
