"""A standalone search query for a turn of a conversation, by rules (no model call).

"Which of those is cheapest?" after "Do you have rain jackets?" searches nothing on its
own. A message that names no product subject is a **follow-up**: no garment word, and
either a word that points back (:data:`FOLLOW_UP_WORDS`: "those", "it", "one",
"similar", ...) or only words that qualify a subject said before
(:data:`QUALIFIER_WORDS`: "cheapest", "in red", "available"; size and price phrases
are cut first: "what about in size M?"). Its query is the query of the nearest earlier
turn that names a subject, followed by what the message adds (its words without those
that point back or only ask: "Which of those is cheapest?" adds "cheapest"), so the
earlier subject and constraints ("rain jackets", "under 100") and the new ones
("cheapest", "in size M") are all parsed from it
(:func:`chainrun.retrieval.filters.parse_query`). Any other message is its own query,
and so is a follow-up when no earlier turn names a subject. Each earlier turn's query
is worked out the same way, oldest first, so a chain of follow-ups keeps its subject.

A follow-up that **points back** at what the shopper was shown ("Which of those is
cheapest?", "Is it available in navy?", "Do they come in XL?": a word of
:data:`POINTER_WORDS`, none of :data:`ELSEWHERE_WORDS` such as "other" or "similar")
is about the products the earlier turn showed, not about its whole subject: when those
are known (:attr:`chainrun.conversations.history.HistoryTurn.products`, the nearest
earlier turn that showed some), the search is among them
(:meth:`chainrun.retrieval.stage.RetrievalStage.retrieve_within`): put in price order
when it asks for the cheapest or dearest, narrowed to the colours
(:func:`colours_named`), sizes and prices it names, else in the order shown. When they
are not known (a client that keeps its own thread) it searches its query as above.

Rules rather than a model call: the query decides what the answer can recommend, so it
sits on the answer's critical path; these rules cost microseconds, where a model call
writing the query costs a call's time to first token plus its tokens on every turn
(measured: benchmarks/README.md, "Conversations: the shopper's wait per route").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from chainrun.retrieval.filters import parse_query
from chainrun.retrieval.keyword import query_terms

__all__ = [
    "COLOUR_WORDS",
    "ELSEWHERE_WORDS",
    "FOLLOW_UP_WORDS",
    "POINTER_WORDS",
    "QUALIFIER_WORDS",
    "PriceOrder",
    "colours_named",
    "is_follow_up",
    "names_subject",
    "points_back",
    "price_order",
    "standalone_query",
]

#: how a query asks its products ordered: cheapest first, or dearest first
PriceOrder = Literal["price_asc", "price_desc"]

_PRICE_ORDER: tuple[tuple[re.Pattern[str], PriceOrder], ...] = (
    (re.compile(r"\b(?:most expensive|priciest|dearest|highest[- ]priced?|pricier|"
                r"more expensive)\b", re.I), "price_desc"),
    (re.compile(r"\b(?:cheapest|cheaper|least expensive|lowest[- ]priced?|lowest price|"
                r"most affordable|less expensive|budget)\b", re.I), "price_asc"),
)

#: words that point back to something said before (a message holding one and no garment
#: word is a follow-up)
FOLLOW_UP_WORDS = frozenset(
    """it its they them those these ones one that this other others another same either
    both similar else instead alternative alternatives cheaper pricier""".split()
)

#: colour words a message may narrow the products by ("in navy", "any red ones?")
COLOUR_WORDS = frozenset(
    """black white navy blue red green grey gray yellow pink beige brown camel cream teal
    orange purple burgundy khaki olive ivory tan silver gold""".split()
)

#: words that only qualify a subject said before (price order, colour, stock): a message
#: of these alone ("any in red?", "which is cheapest?") names no subject of its own
QUALIFIER_WORDS = frozenset(
    """cheapest cheap least expensive priciest price prices cost costs affordable budget
    available availability stock colour colours color colors size sizes fit""".split()
) | COLOUR_WORDS

#: words of a follow-up that point at the products the shopper was just shown
POINTER_WORDS = frozenset("it its they them those these one ones that this either both".split())
#: words of a follow-up that ask for other products than those shown ("anything
#: similar?", "another one?"): such a follow-up searches its query, not among them
ELSEWHERE_WORDS = frozenset(
    "other others another else instead alternative alternatives similar different".split()
)
#: words a follow-up only asks with; left out of the query it adds to the subject's
_ASKING_WORDS = frozenset(
    """which what whats is are was were do does did you have has of the a an about there
    any how can could i we me show tell please and so then ok okay""".split()
)

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def names_subject(text: str) -> bool:
    """Whether ``text`` says what it is about: a garment word (a category), or a word
    to search for that only qualifies (:data:`QUALIFIER_WORDS`) and none that points
    back (:data:`FOLLOW_UP_WORDS`)."""
    parsed = parse_query(text)
    if parsed.filters.categories:
        return True
    words = _WORD.findall(parsed.text.lower())
    if any(w in FOLLOW_UP_WORDS for w in words):
        return False
    return any(t not in QUALIFIER_WORDS for t in query_terms(parsed.text))


def is_follow_up(message: str) -> bool:
    """Whether ``message`` needs an earlier turn's subject (see the module text)."""
    return not names_subject(message)


def points_back(message: str) -> bool:
    """Whether ``message`` is a follow-up about the products the shopper was shown (see
    the module text): it names no subject, holds a word of :data:`POINTER_WORDS` and
    none of :data:`ELSEWHERE_WORDS`."""
    if not is_follow_up(message):
        return False
    words = {w.lower() for w in _WORD.findall(message)}
    return bool(words & POINTER_WORDS) and not words & ELSEWHERE_WORDS


def colours_named(text: str) -> tuple[str, ...]:
    """The colour words (:data:`COLOUR_WORDS`) ``text`` names, in order, "gray" read as
    "grey"."""
    found = [w.lower() for w in _WORD.findall(text) if w.lower() in COLOUR_WORDS]
    return tuple(dict.fromkeys("grey" if w == "gray" else w for w in found))


def _adds(message: str) -> str:
    """What a follow-up adds to the subject it carries: its words without those that
    point back (:data:`POINTER_WORDS`) or only ask, and without the final punctuation
    ("Which of those is cheapest?" adds "cheapest", "What about in size M?" adds "in
    size M"; "in" and the size's capital stay for the size parser)."""
    kept = [t for t in message.split() if t.strip("?!.,;:").lower() not in
            POINTER_WORDS | _ASKING_WORDS]  # fmt: skip
    return " ".join(kept).strip(" ?!.,;:")


def _query(message: str, earlier_queries: Sequence[str]) -> str:
    if names_subject(message):
        return message
    for q in reversed(earlier_queries):
        if names_subject(q):
            adds = _adds(message)
            return f"{q.rstrip()} {adds}" if adds else q.rstrip()
    return message


def standalone_query(message: str, earlier: Sequence[str] = ()) -> str:
    """The search query for ``message`` after the earlier turns' messages ``earlier``
    (oldest first): the message itself, or the nearest earlier subject followed by what
    the message adds.

    >>> standalone_query("Which of those is cheapest?", ["Do you have rain jackets?"])
    'Do you have rain jackets? cheapest'
    """
    queries: list[str] = []
    for m in earlier:
        queries.append(_query(m, queries))
    return _query(message, queries)


def price_order(text: str) -> tuple[PriceOrder | None, str]:
    """The price order a query asks for and the query without its words: "cheapest",
    "cheaper", "least expensive", "lowest price", "most affordable", "budget" ask for
    ``price_asc``; "most expensive", "priciest", "pricier", "highest price" for
    ``price_desc``; the last such phrase in the text wins (a follow-up's own wish comes
    after the subject it carries). ``(None, text)`` when it asks for none.

    >>> price_order("Do you have rain jackets? Which of those is cheapest?")
    ('price_asc', 'Do you have rain jackets? Which of those is ?')
    """
    found: list[tuple[int, PriceOrder]] = []
    for pattern, order in _PRICE_ORDER:
        found.extend((m.start(), order) for m in pattern.finditer(text))
    if not found:
        return None, text
    rest = text
    for pattern, _ in _PRICE_ORDER:
        rest = pattern.sub("", rest)
    return max(found)[1], re.sub(r"\s{2,}", " ", rest)
