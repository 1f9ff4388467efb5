"""The classify step without a model call (``kind = "classify"``): writes ``label``.

Methods (:mod:`chainrun.classify`): ``examples`` (nearest labelled examples on MiniLM
embeddings), ``keywords`` (regular expressions per label), ``combined`` (keyword rules
when exactly one label's rules fire, nearest examples otherwise). The default chain's
classify step is this kind, method ``combined``. To classify with the model itself, use
an ``llm`` step with ``labels`` (:data:`chainrun.config.LLM_CLASSIFY_STEP`; its answer
may be constrained to the label set by ``json_schema``:
:func:`chainrun.classify.label_schema`).

There is no prompt: the step reads the turn's ``message`` and, with ``follow_ups`` (the
default), the conversation's earlier messages (``history``): a follow-up that names no
subject and fires no rule ("Is it available in navy?") takes the label of the turn it
follows (:mod:`chainrun.classify.conversation`).

Settings, in ``[steps.NAME]``::

    kind = "classify"
    method = "combined"      # "examples" | "keywords" | "combined"
    labels = ["sizing", "product_search", "order_status", "returns", "styling", "other"]
    k = 11                   # examples: neighbours that vote
    examples = "shop-examples.jsonl"   # {"label": ..., "message": ...} lines; default:
                                       # the examples shipped with chainrun
    rules = { returns = ["\\brefund", "\\bsend (it )?back\\b"] }   # keywords, by label
    follow_ups = true        # a follow-up keeps the label of the turn it follows
    unsure_below = 0.8       # a label whose confidence is below this is unsure
    out_of_scope_below = 0.38  # resembling no shop example this much: ``other``

**Out of scope.** With the ``examples`` and ``combined`` methods, a message whose most
similar example of a shop label (any label but ``other``) has a cosine similarity below
``out_of_scope_below`` is ``other``, even when a keyword rule of a shop label fired ("how
long does the irs take to issue a tax refund"); then unsure, with that rule's or vote's
label as the runner-up. Chosen on training data (benchmarks/README.md, "Routes on public
corpora"); 0 turns it off.

Besides ``label`` the step writes ``labels``: the labels whose material the turn gets.
A sure label (confidence at least ``unsure_below``) is alone there; an unsure one comes
with its runners-up (:meth:`chainrun.classify.Classification.route_labels`), and a step
routed with ``when = { label = [...] }`` runs when any of them matches (a ``not`` list
skips it only when all do: :func:`chainrun.steps.config.route_problem`). In the default
chain an unsure turn whose runners-up span both routes so gets the policy text and the
search: a wrong label costs a few milliseconds, not the answer's material (but in a
conversation the extra sections are prompt tokens the server computes before the first
answer token). In a conversation (``follow_ups``), an unsure label that the
conversation's subject (the nearest earlier message that is not a follow-up,
:meth:`chainrun.classify.FollowUps.subject`) has surely is taken alone: the two agree,
and the turn stays on its subject's material ("Do I need to print a label?" after "Can
I return them?" gets the returns policy, not the returns, other and order sections and a
product search); the step's detail names that message (``corroborated_by``). The default
threshold is chosen from the cross-validated accuracy-coverage curve of the default
classifier (``python benchmarks/classify_accuracy.py --cv``: the lowest threshold whose
sure labels were right at least 95% of the time; benchmarks/README.md). ``unsure_below
= 0`` makes every label sure (one route, as before).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from chainrun.classify import (
    DEFAULT_EXAMPLES,
    DEFAULT_K,
    DEFAULT_LABELS,
    OUT_OF_SCOPE_BELOW,
    Classification,
    Classifier,
    FollowUps,
    KeywordRules,
    NearestExamples,
    RulesThenExamples,
    read_examples,
)
from chainrun.errors import ChainrunError, ConfigError, error_type
from chainrun.retrieval.embeddings import build_embedder
from chainrun.retrieval.settings import EmbeddingSettings
from chainrun.steps.base import (
    LABEL,
    BuildContext,
    StateField,
    Step,
    StepContext,
    StepItem,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.config import StepConfig

ClassifyMethod = Literal["examples", "keywords", "combined"]

#: the default ``unsure_below``: the lowest threshold at which the default classifier's
#: sure labels were right at least 95% of the time in 5-fold cross-validation (3
#: repeats) over the shipped examples and the regression cases (benchmarks/README.md,
#: "Cross-validated label accuracy")
UNSURE_BELOW = 0.8


class ClassifyConfig(StepConfig):
    """A ``classify`` step (``[steps.NAME]`` with ``kind = "classify"``; see the module
    docstring)."""

    kind: Literal["classify"] = "classify"
    #: how the label is chosen: nearest examples, keyword rules, or rules then examples
    method: ClassifyMethod = "combined"
    #: the labels the step may give (the turn's ``label``)
    labels: list[str] = Field(default_factory=lambda: list(DEFAULT_LABELS), min_length=1)
    #: examples: the number of nearest examples that vote
    k: int = Field(default=DEFAULT_K, ge=1, le=50)
    #: examples: a JSONL file of {"label", "message"} lines (None: the shipped examples
    #: of the step's labels)
    examples: str | None = None
    #: keywords: label → regular expressions, replacing the built-in rules of that label
    rules: dict[str, list[str]] = Field(default_factory=dict)
    #: examples: the embedder (default: MiniLM, run in NumPy)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    #: a follow-up message (it names no subject and fires no keyword rule: "is it
    #: available in navy?") takes the label of the conversation's turn it follows
    follow_ups: bool = True
    #: deadline for one classification, in s
    deadline_s: float = Field(default=5.0, gt=0)
    #: a label whose confidence (0..1) is below this is unsure: the turn's ``labels``
    #: then hold its runners-up too, and it is routed to their steps as well
    unsure_below: float = Field(default=UNSURE_BELOW, ge=0, le=1)
    #: examples, combined: a message whose most similar example of a label other than
    #: ``other`` has a lower cosine similarity is out of scope (``other``); 0: never
    out_of_scope_below: float = Field(default=OUT_OF_SCOPE_BELOW, ge=0, le=1)


def build_classifier(
    labels: Sequence[str], options: ClassifyConfig, *, base_dir: Path | None = None
) -> Classifier:
    """The classifier a ``classify`` step's settings describe, over ``labels``.

    ``base_dir``: where a relative ``examples`` path is read from (the config file's
    directory; None: the working directory).

    Without ``examples``, the shipped examples of the labels in ``labels`` are used.

    Raises:
        ConfigError: a bad keyword pattern, or no shipped example for any of ``labels``
            (and no ``examples`` file). InputFileError: a bad examples file.
    """
    try:
        rules = KeywordRules(labels, options.rules)
    except ValueError as e:
        raise ConfigError(f"classify step: {e}") from None
    if options.method == "keywords":
        return rules
    if options.examples:
        path = Path(options.examples)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        examples = read_examples(path, labels)
    else:  # the shipped examples of the step's labels (a shop may keep only some)
        examples = [e for e in read_examples(DEFAULT_EXAMPLES, DEFAULT_LABELS) if e[0] in labels]
        if not examples:
            raise ConfigError(
                f"classify step: no shipped example has any of the labels {list(labels)}; "
                "give the step its own examples (examples = FILE) or method = 'keywords'"
            )
    nearest = NearestExamples(labels, examples, build_embedder(options.embedding), k=options.k,
                              out_of_scope_below=options.out_of_scope_below)  # fmt: skip
    if options.method == "examples":
        return nearest
    return RulesThenExamples(rules, nearest)


@register_step_kind
class ClassifyStep(Step):
    """The shopper's message → one of ``labels``, with no model call."""

    kind = "classify"
    config_model = ClassifyConfig
    config: ClassifyConfig
    state_fields = (
        LABEL,
        StateField(
            "labels",
            "the labels whose material the turn gets: the label, and its runners-up when "
            "the classifier is unsure",
            render=lambda v: ", ".join(v),
        ),
    )

    def __init__(self, name: str, config: ClassifyConfig) -> None:
        super().__init__(name, config)
        self.labels = list(config.labels)
        self.classifier: FollowUps | None = None

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"message", "history"} if self.config.follow_ups else {"message"})


    async def open(self, ctx: BuildContext) -> None:
        path: str | None = getattr(ctx.config, "path", None)  # ChainConfig's source file
        base = Path(path).parent if path else None  # a relative examples path: beside it
        # reads the examples file: off the event loop
        classifier = await asyncio.to_thread(
            build_classifier, self.labels, self.config, base_dir=base
        )
        rules = classifier if isinstance(classifier, KeywordRules) else getattr(
            classifier, "rules", None)  # fmt: skip
        self.classifier = FollowUps(classifier, rules)
        warm = getattr(classifier, "warm", None)
        if warm is not None:
            await warm()  # embed the examples before the first turn

    async def aclose(self) -> None:
        classifier = self.classifier.classifier if self.classifier is not None else None
        embedder: Any = getattr(getattr(classifier, "examples", None), "embedder", None)
        embedder = embedder or getattr(classifier, "embedder", None)
        close = getattr(embedder, "aclose", None)
        if close is not None:
            await close()

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        assert self.classifier is not None, "ClassifyStep.open() was not called"
        row, result = ctx.row, StepResult()
        try:
            async with asyncio.timeout(self.config.deadline_s):
                earlier = (
                    [t.message for t in state.history.turns] if self.config.follow_ups else []
                )
                found = await self.classifier.classify(state.message, earlier)
            route = found.route_labels(self.config.unsure_below)
            corroborated = None
            if len(route) > 1 and earlier and found.detail.get("decided_by") != "follow_up":
                route, corroborated = await self._corroborated(found, route, earlier)
            conf = found.confidence
            result.updates["label"] = found.label
            result.updates["labels"] = route
            row.output = found.label
            row.detail = {"method": found.method, "score": found.score,
                          "confidence": found.confidence, "confidences": found.confidences,
                          "unsure": conf is not None and conf < self.config.unsure_below,
                          "labels": list(route), **found.detail}  # fmt: skip
            if corroborated is not None:
                row.detail["corroborated_by"] = corroborated
        except (ChainrunError, TimeoutError) as e:
            result.error = e
            row.error_type = error_type(e)
        row.duration_ms = ctx.elapsed_ms()
        yield result

    async def _corroborated(
        self, found: Classification, route: tuple[str, ...], earlier: Sequence[str]
    ) -> tuple[tuple[str, ...], str | None]:
        """An unsure label that the conversation's subject has, surely: ``((label,),
        that earlier message)``; else ``(route, None)`` unchanged."""
        assert self.classifier is not None
        subject = await self.classifier.subject(earlier)
        if subject is None:
            return route, None
        previous, before = subject
        threshold = self.config.unsure_below
        if before.label == found.label and before.route_labels(threshold) == (found.label,):
            return (found.label,), previous
        return route, None


__all__ = ["ClassifyConfig", "ClassifyStep", "build_classifier"]
