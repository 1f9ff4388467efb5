"""What a product says it is not, and the attributes a shopper names.

A full-text or embedding search matches words, so "waterproof boots" finds the suede
boots whose description says "Not waterproof", and a search that pads a short result
to ``min_results`` brings products that lack what the shopper asked for. Two rules,
applied by the retrieve stage to every search's hits (:mod:`chainrun.retrieval.stage`):

- **Negation**: a product that says a word of the query only negated ("not
  waterproof", "isn't lined", "without a hood") and never affirms it does not match that
  word. "not only" and "not just" negate nothing. ``non-`` compounds ("non-iron",
  "non-slip") are attributes of their own, as catalogues use them: "non-iron shirts"
  asks for the compound, and a product that only says "iron on low heat" lacks it.
- **Named attributes**: a query word in :data:`ATTRIBUTES` (materials and functional
  properties a product has or has not: "waterproof", "linen", "non-iron") must be
  affirmed by the product's title, description or tags; one the shopper negates ("a
  jumper that is not wool") must not be. Occasions, styles and product types are not
  attributes (they rank, they do not exclude): the category the shopper names is
  already a filter of every search (:func:`chainrun.retrieval.filters.parse_query`).
  An attribute word used as a noun, after an article and before the end of a phrase
  ("a fleece or a beanie", "do you have a waterproof?"), names a kind of product, not
  an attribute every product must have: it ranks, it does not exclude.

Plain word rules (no model, microseconds a product), English only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ATTRIBUTES", "QueryAttributes", "negations", "query_attributes", "why_excluded"]

#: Attributes a product has or has not (materials, functional properties, finishes):
#: named in a query, they must hold for every product the search keeps. Chosen from the
#: sample catalogue's tags and descriptions.
ATTRIBUTES = frozenset(
    """waterproof water-resistant water-repellent windproof insulated breathable reflective
    packable lined padded quilted thermal linen cotton wool merino cashmere lambswool
    leather suede denim silk satin fleece corduroy velvet canvas organic recycled vegan
    non-iron non-slip easy-iron stretch""".split()
)

#: Words that negate the word after them (one optional adverb between: "not very warm").
_NEGATORS = frozenset({"not", "isn't", "isnt", "aren't", "arent", "never", "without"})
_SKIP_AFTER_NEGATOR = frozenset({"very", "fully", "completely", "totally", "100%", "a", "an"})
_NOT_A_NEGATION = frozenset({"only", "just", "merely"})

_TOKEN = re.compile(r"[a-z0-9%]+(?:['’-][a-z0-9]+)*")


def _tokens(text: str) -> list[str]:
    return [t.replace("’", "'") for t in _TOKEN.findall(text.lower())]


def _norm(word: str) -> str:
    """A word's comparison form: plural ``s`` dropped ("jackets" ~ "jacket")."""
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def negations(text: str) -> tuple[set[str], set[str]]:
    """(affirmed, negated) words of ``text`` (normalised: lower case, plural ``s``
    dropped). A word is negated where it follows a negator ("not", "isn't", "aren't",
    "never", "without"; "not only" / "not just" negate nothing); every other occurrence
    affirms it. A hyphenated word ("non-iron", "water-resistant") is one word, and its
    parts are affirmed too unless it is a ``non-`` compound."""
    tokens = _tokens(text)
    affirmed: set[str] = set()
    negated: set[str] = set()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in _NEGATORS and i + 1 < len(tokens) and tokens[i + 1] not in _NOT_A_NEGATION:
            j = i + 1
            if tokens[j] in _SKIP_AFTER_NEGATOR and j + 1 < len(tokens):
                j += 1
            negated.add(_norm(tokens[j]))
            i = j + 1
            continue
        affirmed.add(_norm(tok))
        if "-" in tok and not tok.startswith("non-"):
            affirmed.update(_norm(p) for p in tok.split("-") if p)
        i += 1
    return affirmed, negated


@dataclass(frozen=True)
class QueryAttributes:
    """What a query asks for beyond its words' ranking.

    Attributes:
        terms: the query's words the shopper did not negate (normalised).
        wanted: of those, the :data:`ATTRIBUTES` (each must hold for a kept product).
        unwanted: attributes the shopper negated ("not wool"; a kept product must not
            affirm them).
        search_text: the query without its negated phrases (what the searches see).
    """

    terms: frozenset[str]
    wanted: frozenset[str]
    unwanted: frozenset[str]
    search_text: str


#: an attribute word used as a noun: after an article, before the end of the phrase
_NOUN_USE = re.compile(r"\b(?:a|an|the|some|any)\s+([a-z-]+)(?=\s*(?:$|[,.;:?!)]|or\b|and\b))")


def query_attributes(query: str) -> QueryAttributes:
    """The :class:`QueryAttributes` of ``query`` (see the module text)."""
    affirmed, negated = negations(query)
    nouns = {_norm(m.group(1)) for m in _NOUN_USE.finditer(query.lower())}
    attrs = {_norm(a) for a in ATTRIBUTES} - nouns
    # "not wool": the searches should not look for wool
    search_text = query
    for word in negated:
        search_text = re.sub(
            rf"\b(?:{'|'.join(map(re.escape, _NEGATORS))})\s+(?:\w+\s+)?{re.escape(word)}s?\b",
            " ",
            search_text,
            flags=re.I,
        )
    return QueryAttributes(
        terms=frozenset(affirmed - negated),
        wanted=frozenset((affirmed - negated) & attrs),
        unwanted=frozenset(negated & attrs),
        search_text=" ".join(search_text.split()),
    )


def _product_text(product: Mapping[str, Any]) -> str:
    tags: Iterable[Any] = product.get("tags") or ()
    return " ".join(
        [str(product.get("title") or ""), str(product.get("description") or ""),
         " ".join(str(t) for t in tags)]
    )  # fmt: skip


def why_excluded(product: Mapping[str, Any], wanted: QueryAttributes) -> str | None:
    """Why ``product`` (a catalogue row: title, description, tags) does not fit the query
    (None: it does): ``"negates waterproof"`` (it says the word only negated), ``"lacks
    linen"`` (a named attribute it does not affirm), ``"is wool"`` (an attribute the
    shopper negated)."""
    affirmed, negated = negations(_product_text(product))
    for term in sorted(wanted.terms):
        if term in negated and term not in affirmed:
            return f"negates {term}"
    for attr in sorted(wanted.wanted):
        if attr not in affirmed:
            return f"lacks {attr}"
    for attr in sorted(wanted.unwanted):
        if attr in affirmed:
            return f"is {attr}"
    return None
