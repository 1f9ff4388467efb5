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
    "lead_subject",
    "lead_topic",
    "line_scores",
    "policy_lines",
    "product_line",
    "quote_policy",
    "render_facts",
    "with_lead",
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
    #: the model's part ends after this many sentences, its call cancelled (the answer's
    #: ``sentences`` check: chainrun.checks.sentences); None: no limit
    sentences: int | None = Field(default=None, ge=1)
    #: the words the model's sentence starts with, by what the turn shows (``products``:
    #: a search's products; ``policy``: no products), written at the end of the prompt
    #: for the model to continue and shown as the answer's start ("prefilling" the
    #: answer) as soon as the model's first token arrives: a completion-style model
    #: then connects the shopper's words to what is shown instead of inventing a reply
    #: of its own. ``{subject}`` in it is what the
    #: shopper asked for in the shown products' words (:func:`lead_subject`, "rain
    #: jackets"), ``{topic}`` the policy's subject (:func:`lead_topic`, "returns"); a
    #: placeholder with nothing to say leaves the answer without a lead. Only for a
    #: transcript prompt (the embedded model's); empty: none.
    lead: dict[Literal["products", "policy"], str] = Field(default_factory=dict)

    def lead_for(self, shown: Sequence[ShownProduct]) -> str:
        """The lead's template for a turn that shows ``shown`` ("" when none is
        configured)."""
        return self.lead.get("products" if shown else "policy", "")

    async def render_lead(
        self, *, message: str, shown: Sequence[ShownProduct], policy: str,
        embedder: MiniLMEmbedder | None = None,
    ) -> str:
        """The lead of one answer: :meth:`lead_for`'s template with ``{subject}`` and
        ``{topic}`` filled; "" when there is no template or a placeholder it holds has
        nothing to say."""
        template = self.lead_for(shown)
        if not template:
            return ""
        values = {"subject": "", "topic": ""}
        if "{subject}" in template:
            values["subject"] = lead_subject(message, shown)
        if "{topic}" in template:
            values["topic"] = await lead_topic(message, policy, embedder)
        if any(f"{{{k}}}" in template and not v for k, v in values.items()):
            return ""
        return template.format(**values)


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


def with_lead(lead: str, text: str, replacements: Sequence[str] = ()) -> str:
    """``text`` after the answer's ``lead``: continuing it (:func:`after`), or, when
    ``text`` starts with one of the checks' ``replacements`` (the model's sentence was
    dropped), after it as a sentence of its own ("Here are our rain jackets. I could
    not confirm ..."): the check's words never land inside the lead's sentence. A
    replacement counts from its first sentence: the answer's sentence limit may have
    cut the rest of it."""
    if not lead:
        return text
    if any(r and text.lstrip().startswith(_first_sentence(r)) for r in replacements):
        return lead.rstrip() + closing(lead) + " " + text.lstrip()
    return after(lead, text)


def _first_sentence(text: str) -> str:
    """``text`` up to and with its first sentence's end (". ", "! ", "? "), or whole."""
    end = re.search(r"[.!?](?=\s)", text.strip())
    return text.strip()[: end.end()] if end else text.strip()


def closing(prose: str) -> str:
    """What closes the model's last sentence before the facts: "." when ``prose`` ends
    without terminal punctuation (a stop sequence such as ". " is not part of the
    text), else ""."""
    end = prose.rstrip()
    return "" if not end or end.endswith((".", "!", "?", "…", ":")) else "."


#: Words of a message that name no product (articles, pronouns, the question's verbs).
_NOT_SUBJECT = frozenset(
    "a an and any are around be can could do does for from good have how i ideally in is "
    "it me my of on or our should some that the this to under what which will with would "
    "you your size".split()
)


def _plain_words(text: str) -> list[str]:
    """Lower-case words of ``text`` (two letters or more, no digit in them: a pack size
    such as ``80g`` is no word), a hyphenated word split (``Wool-Blend``: wool, blend),
    text in brackets left out (a title's colour)."""
    plain = re.sub(r"\(.*?\)", " ", text).lower().replace("-", " ")
    return re.findall(r"(?<![\w])[a-z]{2,}(?![\w])", plain)


def _singular(word: str) -> str:
    """``word`` without a plural's "s" (jackets -> jacket; dress stays dress)."""
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def _plural(word: str) -> str:
    """English plural of a product noun (scarf -> scarves, dress -> dresses, socks and
    jeans stay)."""
    if word.endswith("s") and not word.endswith("ss"):
        return word
    if word.endswith(("ss", "x", "sh", "ch")):
        return word + "es"
    if word.endswith("f"):
        return word[:-1] + "ves"
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def lead_subject(message: str, shown: Sequence[ShownProduct]) -> str:
    """What the shopper asked for, in the words of the products shown, plural: the first
    run of ``message``'s words that the shown titles hold and that ends in a title's
    head noun (its last word: "rain jacket" -> "rain jackets"); else the first shown
    title's head noun after the message's words that title holds ("summer" and
    "Men's Linen Summer Blazer" -> "summer blazers"); "" when nothing is shown."""
    titles = [_plain_words(p.title) for p in shown]
    titles = [t for t in titles if t]
    if not titles:
        return ""
    heads = {_singular(t[-1]) for t in titles}
    held = {_singular(w) for t in titles for w in t}
    runs: list[list[str]] = [[]]
    for word in _plain_words(message):
        if word not in _NOT_SUBJECT and _singular(word) in held:
            runs[-1].append(word)
        elif runs[-1]:
            runs.append([])
    for run in runs:
        if run and _singular(run[-1]) in heads:
            return " ".join([*run[:-1], _plural(_singular(run[-1]))])
    first = {_singular(w) for w in titles[0]}
    modifiers = [w for run in runs for w in run if _singular(w) in first]
    return " ".join([*modifiers[:2], _plural(_singular(titles[0][-1]))])


#: A policy line's head: the words before its first ": " ("Standard delivery: 2-4
#: working days ..."), when short and plain.
_LINE_HEAD = re.compile(r"([A-Za-z][A-Za-z ,'/]{2,40}): ")
_SECTION_TITLE = re.compile(r"^Shop policy, ([^:\n]+):", re.M)


async def lead_topic(
    message: str, policy: str, embedder: MiniLMEmbedder | None = None
) -> str:
    """The policy's subject for ``message``, lower case: the head of the policy line that
    answers it best (:func:`quote_policy`; "exchanges for another size or colour"), else
    the title of the turn's policy section ("orders and delivery"); "" without a policy."""
    if not policy.strip():
        return ""
    best = await quote_policy(message, policy, 1, embedder)
    head = _LINE_HEAD.match(best[0]) if best else None
    title = _SECTION_TITLE.search(policy)
    topic = head.group(1) if head else title.group(1) if title else ""
    # the lead says "about" itself: a section titled "About the shop" is "the shop"
    return re.sub(r"^about\s+", "", topic.lower())


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


async def line_scores(
    message: str, lines: Sequence[str], embedder: MiniLMEmbedder | None = None
) -> tuple[list[float], bool]:
    """How near each of ``lines`` is to ``message``: MiniLM's cosine of the two (the
    lines' vectors kept from turn to turn, the message's shared with the classify step),
    or, with no embedder or its files not installed, the share of the message's words
    the line holds (0-1). Returns the scores, in ``lines``' order, and whether they are
    cosines (True) or shared words (False)."""
    if embedder is not None and embedder.available():
        vectors = await embedder.embed_kept(lines)  # the same lines turn after turn
        asked = await embedder.embed([message])
        return [float(s) for s in np.asarray(vectors @ asked[0])], True
    return _overlap_scores(message, lines), False


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
    scores, by_meaning = await line_scores(message, lines, embedder)
    floor, margin = (MIN_QUOTE_COSINE, SECOND_LINE_MARGIN) if by_meaning else (1e-9, 0.0)
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
    any, then the policy lines that answer ``message`` when it has a policy section."""
    products = answer_products(prose, shown, config.products)
    quoted = await quote_policy(message, policy, config.policy_lines, embedder)
    blocks = ["\n".join(product_line(p) for p in products), "\n".join(quoted)]
    return RenderedFacts("\n\n".join(b for b in blocks if b), products, quoted)
