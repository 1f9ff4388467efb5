"""The colour words the grounding check reads as colour claims, and the colour families.

A fixed vocabulary, as data, so that what counts as a colour claim is reviewable and
does not depend on the catalogue loaded:

- the eleven basic colour terms of English (Berlin and Kay, *Basic Color Terms*, 1969:
  black, white, red, green, yellow, blue, brown, purple, pink, orange, grey; "gray" is
  read as "grey");
- the colour names the sample catalogue's ``colours`` use (``chainrun/data/catalog.jsonl``),
  except words that are ordinary English as often as colours ("clear", "natural",
  "stone", "sand", "nude", and the patterns "check", "stripe", "floral", "print",
  "marl", "wash"): those are :data:`NOT_CLAIM_WORDS`, never a claim; a test keeps
  every word of the catalogue's colours in one of the two lists;
- a few common fashion names the catalogue does not use (maroon, turquoise, lavender,
  indigo, mint, peach), so that a colour the catalogue lacks is a claim too.

:data:`FAMILIES` maps a specific name to the basic terms it is a shade of (navy is a
blue), so "the navy jacket comes in blue" is not flagged; the reverse (a "navy" claim
of a blue product) is, since navy is the narrower claim. Modifiers such as "light",
"dark", "pale" (:data:`SHADE_WORDS`) are read with the colour they qualify and not
checked themselves ("light blue" is checked as blue).
"""

from __future__ import annotations

__all__ = ["COLOUR_WORDS", "FAMILIES", "NOT_CLAIM_WORDS", "SHADE_WORDS", "colour_grounded"]

#: basic terms (Berlin and Kay) first, then the catalogue's and common fashion names
COLOUR_WORDS: frozenset[str] = frozenset(
    """black white red green yellow blue brown purple pink orange grey gray
    navy charcoal camel olive cream khaki burgundy sage ivory tan beige teal indigo
    terracotta cognac chocolate emerald silver gold ecru lilac coral taupe mustard plum
    rust champagne oatmeal maroon turquoise lavender mint peach""".split()
)

#: words that qualify a colour ("light blue", "hi-vis yellow"); never a claim alone
SHADE_WORDS: frozenset[str] = frozenset(
    "light dark pale bright deep mid sky powder electric neon hi-vis raw vintage forest".split()
)

#: words of catalogue colours that are no colour claim (ordinary words, or patterns)
NOT_CLAIM_WORDS: frozenset[str] = frozenset(
    """clear natural stone sand nude check stripe floral print marl wash leopard palm
    tortoiseshell""".split()
)

#: a specific colour name → the basic terms it is a shade of
FAMILIES: dict[str, frozenset[str]] = {
    name: frozenset(terms.split())
    for name, terms in {
        "navy": "blue", "indigo": "blue", "teal": "blue green", "turquoise": "blue green",
        "charcoal": "grey", "taupe": "grey brown", "silver": "grey",
        "burgundy": "red purple", "maroon": "red", "plum": "purple", "lilac": "purple",
        "lavender": "purple", "coral": "pink orange", "peach": "pink orange",
        "terracotta": "orange brown red", "rust": "orange brown red",
        "camel": "brown beige", "tan": "brown beige", "chocolate": "brown",
        "cognac": "brown", "khaki": "green beige", "olive": "green", "sage": "green",
        "emerald": "green", "mint": "green", "mustard": "yellow", "gold": "yellow",
        "cream": "white beige", "ivory": "white", "ecru": "white beige",
        "oatmeal": "beige", "champagne": "beige", "beige": "brown",
    }.items()
}  # fmt: skip


def _norm(word: str) -> str:
    w = word.lower()
    return "grey" if w == "gray" else w


def colour_grounded(word: str, colours: tuple[str, ...] | list[str]) -> bool:
    """Whether the colour ``word`` (one of :data:`COLOUR_WORDS`) is said truly of a
    product whose catalogue colours are ``colours`` (e.g. ``["red check", "navy"]``):
    a word of one of them is ``word`` ("red" of "red check"), or a shade of it ("blue"
    of "navy", by :data:`FAMILIES`)."""
    w = _norm(word)
    for colour in colours:
        for part in colour.lower().replace("-", " ").split():
            part = _norm(part)
            if part == w or w in FAMILIES.get(part, ()):
                return True
    return False
