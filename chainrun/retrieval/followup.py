"""A standalone search query for a turn of a conversation, by rules (no model call).

"Which of those is cheapest?" after "Do you have rain jackets?" searches nothing on its
own. A message that names no product subject is a **follow-up**: no garment word, and
either a word that points back (:data:`FOLLOW_UP_WORDS`: "those", "it", "one",
"similar", ...) or only words that qualify a subject said before
(:data:`QUALIFIER_WORDS`: "cheapest", "in red", "available"; size and price phrases
are cut first: "what about in size M?"). Its query is the query of the nearest earlier
turn that names a subject, followed by the message itself, so the earlier subject and
constraints ("rain jackets", "under 100") and the new ones ("cheapest", "in size M") are
all parsed from it (:func:`chainrun.retrieval.filters.parse_query`). Any other message
is its own query, and so is a follow-up when no earlier turn names a subject. Each
earlier turn's query is worked out the same way, oldest first, so a chain of
follow-ups keeps its subject.

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
    "FOLLOW_UP_WORDS",
    "QUALIFIER_WORDS",
    "PriceOrder",
    "is_follow_up",
    "names_subject",
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

#: words that only qualify a subject said before (price order, colour, stock): a message
#: of these alone ("any in red?", "which is cheapest?") names no subject of its own
QUALIFIER_WORDS = frozenset(
    """cheapest cheap least expensive priciest price prices cost costs affordable budget
    available availability stock colour colours color colors size sizes fit
    black white navy blue red green grey gray yellow pink beige brown camel cream teal
    orange purple burgundy khaki olive ivory tan silver gold""".split()
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


def _query(message: str, earlier_queries: Sequence[str]) -> str:
    if names_subject(message):
        return message
    for q in reversed(earlier_queries):
        if names_subject(q):
            return f"{q.rstrip()} {message.lstrip()}"
    return message


def standalone_query(message: str, earlier: Sequence[str] = ()) -> str:
    """The search query for ``message`` after the earlier turns' messages ``earlier``
    (oldest first): the message itself, or the nearest earlier subject followed by it.

    >>> standalone_query("Which of those is cheapest?", ["Do you have rain jackets?"])
    'Do you have rain jackets? Which of those is cheapest?'
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
