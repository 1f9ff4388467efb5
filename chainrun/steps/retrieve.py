"""The retrieve step: early-exit search over the shop's catalogue (``kind = "retrieve"``).

It reads the message and the conversation's history (and the classify label when
``retrieval.use_label = true``) and writes ``products``: the found products as data
(:class:`~chainrun.retrieval.products.ShownProduct`: id, title, price, currency,
colours, sizes with stock; the compose prompt shows them as lines of text), and
``query``: what it searched for. With ``follow_ups``
(the default) a follow-up that names no subject of its own ("Which of those is
cheapest?") searches the subject of the earlier turn it follows too, by rules and
without a model call (:func:`chainrun.retrieval.followup.standalone_query`); price and
category filters and a price order are parsed from that query. A follow-up that points
back at what the shopper was shown ("Which of those is cheapest?", "Is it available in
navy?") searches among the products the nearest earlier turn showed, when the history
knows them (:meth:`chainrun.retrieval.stage.RetrievalStage.retrieve_within`: in price
order, or narrowed by colour, size or price, as it asks); the row's ``detail`` then
has ``within`` (those ids). The searches themselves
live in :mod:`chainrun.retrieval`; the catalogue in the log database (the sample
catalogue is loaded there when the database has none).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any, Literal

from pydantic import Field, model_validator

from chainrun.errors import ChainrunError, ProviderError, error_type
from chainrun.retrieval import build_retriever
from chainrun.retrieval.base import Retriever
from chainrun.retrieval.followup import points_back, standalone_query
from chainrun.retrieval.products import (
    PRODUCTS_FIELD,
    products_json,
    render_products,
    render_products_again,
    shown_products,
)
from chainrun.retrieval.settings import RetrievalSettings
from chainrun.steps.base import (
    BuildContext,
    StateField,
    Step,
    StepContext,
    StepItem,
    StepNeeds,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.config import StepConfig

logger = logging.getLogger(__name__)

#: The products a turn was shown: a tuple of ShownProduct, in the order found; a prompt's
#: ``{products}`` shows them one a line (``(none)`` when nothing was found or the search
#: failed), the writing step's row logs them as a list of JSON objects. A kind of its own
#: that searches declares this same field to hand its products on.
PRODUCTS = StateField(
    PRODUCTS_FIELD,
    "the products the turn was shown, as data (the prompt shows them one a line)",
    empty="(none)", render=render_products, dump=products_json,
    again=render_products_again,
)  # fmt: skip


class RetrieveConfig(StepConfig):
    """A ``retrieve`` step (``[steps.NAME]`` with ``kind = "retrieve"``)."""

    kind: Literal["retrieve"] = "retrieve"
    #: deadline for the whole search (every search in priority order), in s
    deadline_s: float = Field(default=60.0, gt=0)
    #: searches in priority order, ``min_results`` (early exit), ``k``, fallbacks
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    #: search a follow-up ("Which of those is cheapest?") with the subject of the earlier
    #: turn it follows (rules on the history, no model call); false: the message alone
    follow_ups: bool = True

    @model_validator(mode="before")
    @classmethod
    def _no_hedge(cls, data: Any) -> Any:
        if isinstance(data, dict) and "hedge" in data:
            raise ValueError(
                "hedge: a retrieve step is not hedged this way; name a fallback in "
                "retrieval.fallbacks instead"
            )
        return data


@register_step_kind
class RetrieveStep(Step):
    """Products for the shopper's message, searches in priority order, early exit."""

    kind = "retrieve"
    config_model = RetrieveConfig
    config: RetrieveConfig
    state_fields = (
        PRODUCTS,
        StateField(
            "query",
            "what the catalogue was searched for: the message, or a follow-up with the "
            "subject of the turn it follows",
        ),
    )

    def __init__(self, name: str, config: RetrieveConfig) -> None:
        super().__init__(name, config)
        self.retriever: Retriever | None = None
        self._owned: Any = None

    @property
    def reads(self) -> frozenset[str]:
        fields = {"message", "history"} if self.config.follow_ups else {"message"}
        return frozenset(fields | {"label"} if self.config.retrieval.use_label else fields)

    def query(self, state: TurnState) -> str:
        """What the turn searches for (see the module text)."""
        if not self.config.follow_ups:
            return state.message
        return standalone_query(state.message, [t.message for t in state.history.turns])

    def within(self, state: TurnState) -> tuple[str, ...] | None:
        """The products a follow-up that points back searches among: those the nearest
        earlier turn that showed any showed (None: the message does not point back, or
        the history does not know them; see the module text)."""
        if not self.config.follow_ups or not points_back(state.message):
            return None
        for turn in reversed(state.history.turns):
            if turn.products:
                return turn.products
        return None

    def needs(self) -> StepNeeds:
        """The catalogue."""
        return StepNeeds(catalogue=True)

    async def open(self, ctx: BuildContext) -> None:
        """Use the injected retriever, or build the searches over the catalogue in the
        log database (the chain loaded the sample catalogue when it had none)."""
        if ctx.retriever is not None:
            self.retriever = ctx.retriever
            return
        built = build_retriever(self.config.retrieval, ctx.db)
        self._owned = self.retriever = built
        try:
            await built.warm()  # embeds the catalogue once (cached in the database)
        except ProviderError as e:
            if not ctx.quiet:
                logger.warning("vector search unavailable (%s)", e)

    async def aclose(self) -> None:
        if self._owned is not None:
            await self._owned.aclose()
            self._owned = self.retriever = None

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        row = ctx.row
        result = StepResult()
        if self.retriever is None:
            row.detail = {"results": [], "searches": [], "stopped_after": None}
        else:
            label = state.label if self.config.retrieval.use_label else None
            query = self.query(state)
            result.updates["query"] = query
            within = self.within(state)
            among = getattr(self.retriever, "retrieve_within", None)
            try:
                async with asyncio.timeout(self.config.deadline_s):
                    if within is not None and among is not None:
                        found = await among(within, state.message, query)
                    else:
                        found = await self.retriever.retrieve(query, label=label)
                row.detail = {"standalone_query": query, **found.as_json()}
                result.updates["products"] = shown_products(found.items)
                row.output = json.dumps([item["id"] for item in row.detail.get("results", [])])
            except (ChainrunError, TimeoutError) as e:
                result.error = e
                row.error_type = error_type(e)
        row.duration_ms = ctx.elapsed_ms()
        yield result
