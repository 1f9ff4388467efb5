"""The grounding check of an answer step, per turn: its sources read from the turn state.

The check itself is :mod:`chainrun.checks.grounding` (text and rows in, claims and a
verdict out); this module gives it a turn's sources, all chainrun's own:

- the products the answer step was handed: the turn-state field ``products`` (rows with
  id, title, price, currency, sizes with stock, colours, as the retrieve step hands them
  on; a field that holds the prompt's product lines, ``- [ID] Title | category | €49.95
  | navy/black | in stock: S, M``, is read from those lines);
- the turn's tool results: every turn-state field named ``tool_results`` or ending in
  ``_results`` (what a tool step hands on);
- the shop's policy: the policy file's text (``policy_file``, default the sample shop's)
  and the turn's ``policy`` field;
- the catalogue (every product: a fact about one the turn did not show is judged
  against its row) and the products the conversation's earlier turns showed (the
  ``history`` field's turns' product ids).

Never the conversation's history: on the OpenAI-compatible face earlier assistant turns
come from the client, and a price they state is what the client says the assistant said.

:class:`AnswerGrounding` is built when the chain opens (it reads the catalogue's titles
once, so a product the turn was not handed is also caught by its title) and gives each
turn's answer a :class:`GroundingCheck`: a
:class:`~chainrun.checks.grounding.StreamGrounding` as an entry of the answer's checks
(:mod:`chainrun.checks.stream`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from chainrun.checks.config import GroundingConfig
from chainrun.checks.grounding import (
    GroundingSources,
    PolicyFacts,
    ProductRow,
    StreamGrounding,
    TitleIndex,
)
from chainrun.checks.holdback import WindowVerdict
from chainrun.checks.stream import StreamCheck, StreamFigures, apply_redactions
from chainrun.money import DEFAULT_LOCALE, find_money

__all__ = [
    "AnswerGrounding", "GroundingCheck", "apply_redactions", "open_grounding", "product_rows",
    "tool_results",
]

_LINE = re.compile(r"^- \[(?P<id>[^\]]+)\] (?P<title>.+)$")


def product_rows(
    value: Any, currency: str = "EUR", locale: str = DEFAULT_LOCALE
) -> list[ProductRow]:
    """The product rows of a turn-state ``products`` value: rows (objects or dicts) as
    they are, or the prompt's product lines parsed (the price column read as ``locale``
    writes ``currency``, :func:`chainrun.money.find_money`; sizes listed ``in stock``
    get a stock of 1, as the lines give no counts; the column after the price,
    ``navy/black``, is the colours). None or ``(none)``: no row."""
    if value is None:
        return []
    if isinstance(value, str):
        rows = []
        for line in value.splitlines():
            parts = line.strip().split(" | ")
            m = _LINE.match(parts[0]) if parts else None
            found = find_money(parts[2], currency, locale) if m and len(parts) >= 3 else []
            if m is None or len(found) != 1 or found[0].amount is None:
                continue
            price = float(found[0].amount)
            sizes: dict[str, int] = {}
            colours: tuple[str, ...] = ()
            for part in parts[3:]:
                if part.startswith("in stock: "):
                    sizes = {s.strip(): 1 for s in part[len("in stock: "):].split(",")}
                elif part != "sold out":
                    colours = tuple(c.strip() for c in part.split("/") if c.strip())
            rows.append(ProductRow(m["id"], m["title"], price, currency, sizes, colours))
        return rows
    if isinstance(value, Mapping):
        value = [value]
    return [ProductRow.of(p) for p in value]


def tool_results(values: Mapping[str, Any]) -> list[str]:
    """The turn's tool results as text: the turn-state fields named ``tool_results`` or
    ending in ``_results``."""
    return [str(v) for k, v in values.items()
            if v is not None and (k == "tool_results" or k.endswith("_results"))]  # fmt: skip


class GroundingCheck(StreamCheck):
    """The grounding check of one answer as an entry of the answer's checks
    (:class:`~chainrun.checks.stream.StreamCheck`): the sentences' claims judged as
    they complete (:class:`~chainrun.checks.grounding.StreamGrounding`, ``grounding``),
    its report the step's ``detail["grounding"]``."""

    def __init__(self, grounding: StreamGrounding) -> None:
        self.grounding = grounding

    def released(self, piece: str) -> None:
        self.grounding.released(piece)

    async def check(self, text: str, final: bool) -> WindowVerdict:
        return await self.grounding(text, final)

    def finish(self, figures: StreamFigures) -> dict[str, Any]:
        """The grounding report (:meth:`StreamGrounding.report`)."""
        return self.grounding.report()

    def on_block(self) -> tuple[str | None, bool]:
        """``replace``: the safe text (the turn ``replaced``); ``refuse``: the chain's
        refusal."""
        if self.grounding.action == "replace":
            return self.grounding.safe_text, True
        return None, False

    def replacement_texts(self) -> tuple[str, ...]:
        return (self.grounding.safe_text,)


class AnswerGrounding:
    """An answer step's grounding check (see the module text).

    Args:
        config: the step's ``grounding`` settings.
        catalogue: the shop's products (dicts or rows), for their titles and for naming
            the product a wrong id belongs to; more than ``catalogue_titles_max``: none.
        policy: the shop's policy text.
    """

    def __init__(
        self, config: GroundingConfig, catalogue: list[Any], policy: str
    ) -> None:
        self.config = config
        rows = [ProductRow.of(p) for p in catalogue]
        self.catalogue = (
            {r.id: r for r in rows} if len(rows) <= config.catalogue_titles_max else {}
        )
        self.policy = policy
        #: the catalogue's titles, indexed once
        self.titles = TitleIndex(self.catalogue.values())
        #: the policy's figures, read once
        self.facts = PolicyFacts.read(policy, config.currency, config.locale)

    def sources(self, values: Mapping[str, Any]) -> GroundingSources:
        """The sources of a turn whose state holds ``values`` (see the module text)."""
        policy, facts = self.policy, self.facts
        turn_policy = values.get("policy")
        if isinstance(turn_policy, str) and turn_policy and turn_policy not in policy:
            policy = f"{policy}\n{turn_policy}"
            facts = PolicyFacts.read(policy, self.config.currency, self.config.locale)
        return GroundingSources(
            product_rows(values.get("products"), self.config.currency, self.config.locale),
            policy=policy,
            tool_results=tool_results(values),
            catalogue=self.catalogue,
            history=self._history_rows(values.get("history")),
            currency=self.config.currency,
            locale=self.config.locale,
            id_pattern=self.config.id_pattern,
            titles=self.titles,
            policy_facts=facts,
        )

    def _history_rows(self, history: Any) -> list[ProductRow]:
        """The catalogue rows of the products the conversation's earlier turns showed
        (the ``history`` field's turns' ``products`` ids)."""
        rows = []
        for turn in getattr(history, "turns", ()) or ():
            for pid in getattr(turn, "products", None) or ():
                row = self.catalogue.get(pid)
                if row is not None:
                    rows.append(row)
        return rows

    def stream_check(self, values: Mapping[str, Any]) -> GroundingCheck:
        """A fresh check for one turn's answer (turn-state ``values``)."""
        grounding = StreamGrounding(
            self.sources(values), self.config.action, safe_text=self.config.safe_text
        )
        return GroundingCheck(grounding)


async def open_grounding(config: GroundingConfig, ctx: Any) -> AnswerGrounding:
    """The grounding check of an answer step, built when its chain opens: the catalogue
    of ``ctx.db`` (read off the event loop) and the policy file's text.

    Raises:
        ConfigError: the policy file cannot be read.
    """
    from chainrun.retrieval.catalog import all_products
    from chainrun.retrieval.reader import reader_for
    from chainrun.shop_policy import load_policy

    sections = load_policy(config.policy_file)
    policy = "\n".join(s.text for s in sections.values())
    try:
        catalogue = await reader_for(ctx.db).run(all_products)
    except Exception:  # no catalogue tables: only the turn's products are known
        catalogue = []
    return AnswerGrounding(config, catalogue, policy)
