"""Facts from data, prose from the model: what an answer step renders after its model's text.

A small model connects a question to what it is shown well enough, and gets facts
wrong: the embedded 270M model dumped raw catalogue lines cut mid-line, wrote one
product's price for another and "10 days." for a 2-4 day delivery. With ``facts`` set on
the answer step (:class:`FactsConfig`), chainrun writes the facts itself, from the rows
the turn already holds, after the model's sentence:

- the **products** the answer is about (:func:`answer_products`: those the model's text
  names first, then the rest of what the search showed, in its order), one line each with
  title, id, price, colours and the sizes in stock (:func:`product_line`), and as data in
  the turn's ``products`` event;
- the **policy lines** that answer the question (:func:`quote_policy`: the lines of the
  turn's policy section nearest the message, by the cosine of their MiniLM embeddings,
  or by shared words when the model is not installed), quoted as the policy writes them.

The model's part (its prose) stays what it wrote; the shopper reads the prose, then the
facts, in one answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from chainrun.retrieval.embeddings import MiniLMEmbedder
from chainrun.retrieval.products import ShownProduct

__all__ = [
    "FactsConfig",
    "RenderedFacts",
    "after",
    "answer_products",
    "closing",
    "policy_lines",
    "product_line",
    "quote_policy",
    "render_facts",
]

#: How much nearer than the next line the best policy line must be for the quote to
#: stop at one line (cosine): lines within it answer the question as well (delivery
#: time and express delivery for "how long, and is express available?"). Chosen on the
#: sample shop's policy and the replay sets' questions.
SECOND_LINE_MARGIN = 0.1
#: The best line's cosine below which nothing is quoted: the section does not answer
#: the message (all-MiniLM-L6-v2 puts unrelated English sentences near 0-0.15).
MIN_QUOTE_COSINE = 0.2


class FactsConfig(BaseModel):
    """``[steps.ANSWER.facts]``: the facts the answer step renders from the turn's data
    after its model's text (see the module text). Zero turns a part off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: false: no facts (the model writes the whole answer), as if the table were absent
    enabled: bool = True
    #: products listed at most (0: none)
    products: int = Field(default=3, ge=0, le=20)
    #: policy lines quoted at most (0: none)
    policy_lines: int = Field(default=2, ge=0, le=10)
    #: the words the model's sentence starts with, by what the turn shows (``products``:
    #: a search's products; ``policy``: no products), written at the end of the prompt
    #: for the model to continue and shown as the answer's start ("prefilling" the
    #: answer): a completion-style model then connects the shopper's words to what is
    #: shown instead of inventing a reply of its own. Only for a transcript prompt (the
    #: embedded model's); empty: none.
    lead: dict[Literal["products", "policy"], str] = Field(default_factory=dict)

    def lead_for(self, shown: Sequence[ShownProduct]) -> str:
        """The lead for a turn that shows ``shown`` ("" when none is configured)."""
        return self.lead.get("products" if shown else "policy", "")


@dataclass(frozen=True)
class RenderedFacts:
    """What an answer step rendered: ``text`` (appended to the answer after a blank line;
    "" when nothing), the ``products`` listed (in order) and the policy ``quoted`` lines."""

    text: str
    products: tuple[ShownProduct, ...] = ()
    quoted: tuple[str, ...] = ()


def after(lead: str, text: str) -> str:
    """``text`` continuing ``lead`` (a space between them when ``text`` starts a word)."""
    return lead + ("" if not text or text[0].isspace() or text[0] in ".,;:!?" else " ") + text


def closing(prose: str) -> str:
    """What closes the model's last sentence before the facts: "." when ``prose`` ends
    without terminal punctuation (a stop sequence such as ". " is not part of the
    text), else ""."""
    end = prose.rstrip()
    return "" if not end or end.endswith((".", "!", "?", "…", ":")) else "."


def _money(amount: float, currency: str, locale: str | None = None) -> str:
    """``amount`` as the shop writes it: its currency in its catalogue's locale
    (:func:`chainrun.money.format_money`; ``€44.95`` by default, ``CHF 1'299.00`` in
    ``de_CH``)."""
    from chainrun.money import DEFAULT_LOCALE, format_money

    return format_money(amount, currency, locale or DEFAULT_LOCALE)


def product_line(p: ShownProduct) -> str:
    """One product as the shopper reads it: ``- Women's City Drizzle Packable Rain Jacket
    (red), JKT-008: €44.95; red; in stock in XS, S, M, L, XL.`` (``sold out`` when no
    size is in stock)."""
    parts = [f"- {p.title}, {p.id}: {_money(p.price, p.currency, p.locale)}"]
    if p.colours:
        parts.append(", ".join(p.colours))
    if p.sizes:
        stocked = p.sizes_in_stock
        parts.append(f"in stock in {', '.join(stocked)}" if stocked else "sold out")
    elif p.stock == 0:
        parts.append("sold out")
    return "; ".join(parts) + "."


def answer_products(
    prose: str, shown: Sequence[ShownProduct], limit: int
) -> tuple[ShownProduct, ...]:
    """The products an answer is about, at most ``limit``: those ``prose`` names (by id
    or title, case ignored) in the order shown, then the others in the order shown."""
    if limit <= 0 or not shown:
        return ()
    low = prose.lower()
    named = [p for p in shown if p.id.lower() in low or p.title.lower() in low]
    rest = [p for p in shown if p not in named]
    return tuple((named + rest)[:limit])


def policy_lines(policy: str) -> list[str]:
    """The fact lines of a policy text as the policy step writes it (sections of a title
    line, then lines of facts, separated by blank lines): every non-blank line but each
    section's title."""
    lines: list[str] = []
    for block in re.split(r"\n\s*\n", policy.strip()):
        rows = [r.strip() for r in block.strip().splitlines() if r.strip()]
        lines.extend(rows[1:] if len(rows) > 1 else rows)
    return lines


def _words(text: str) -> set[str]:
    """Words of three letters or more, a plural's "s" dropped (refund, refunds)."""
    return {w.removesuffix("s") for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2}


def _overlap_scores(message: str, lines: Sequence[str]) -> list[float]:
    """Shared words over the message's words (0-1): the fallback without MiniLM."""
    asked = _words(message)
    return [len(asked & _words(line)) / max(1, len(asked)) for line in lines]


async def quote_policy(
    message: str, policy: str, limit: int, embedder: MiniLMEmbedder | None = None
) -> tuple[str, ...]:
    """The lines of ``policy`` that answer ``message``, at most ``limit``, in the policy's
    order: the nearest line, and the next ones within :data:`SECOND_LINE_MARGIN` of it;
    none when the nearest is below :data:`MIN_QUOTE_COSINE` (MiniLM) or shares no word.

    Args:
        embedder: MiniLM (None, or its files not installed: shared words decide).
    """
    lines = policy_lines(policy)
    if limit <= 0 or not lines:
        return ()
    if embedder is not None and embedder.available():
        vectors = await embedder.embed(lines)
        asked = await embedder.embed([message])
        scores = [float(s) for s in np.asarray(vectors @ asked[0])]
        floor, margin = MIN_QUOTE_COSINE, SECOND_LINE_MARGIN
    else:
        scores = _overlap_scores(message, lines)
        floor, margin = 1e-9, 0.0
    ranked = sorted(range(len(lines)), key=lambda i: -scores[i])
    best = scores[ranked[0]]
    if best < floor:
        return ()
    keep = [i for i in ranked[:limit] if scores[i] >= best - margin]
    return tuple(lines[i] for i in sorted(keep))


async def render_facts(
    config: FactsConfig,
    *,
    prose: str,
    message: str,
    shown: Sequence[ShownProduct],
    policy: str,
    embedder: MiniLMEmbedder | None = None,
) -> RenderedFacts:
    """The facts of one answer (see the module text): the products when the turn showed
    any, else the policy lines that answer ``message`` when it has a policy section."""
    products = answer_products(prose, shown, config.products)
    if products:
        return RenderedFacts("\n".join(product_line(p) for p in products), products)
    quoted = await quote_policy(message, policy, config.policy_lines, embedder)
    return RenderedFacts("\n".join(quoted), quoted=quoted)
