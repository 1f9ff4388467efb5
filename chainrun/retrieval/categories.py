"""The category vocabulary: which words of a message name which categories of *this*
catalogue.

A shop's catalogue has its own categories (``outerwear`` where the sample catalogue has
``jackets`` and ``coats``). The vocabulary the filter parser uses is built from the
catalogue the search runs on (:meth:`CategoryVocabulary.for_catalogue`):

1. every category of the catalogue names itself (singular or plural: ``outerwear``,
   ``dress`` / ``dresses``);
2. the shop's synonyms (``category_synonyms`` in ``[steps.retrieve.retrieval]``:
   category → words or phrases, e.g. ``outerwear = ["rain jacket", "anorak", "parka"]``);
3. the built-in garment words (:data:`GARMENT_WORDS`, written for the sample catalogue),
   kept only where they point to a category the catalogue has, and cut down to those.

A word whose categories are all missing from the catalogue names nothing, so a category
filter never holds a category the catalogue lacks: such a filter could only empty a
search that would otherwise find products ("rain jacket" in a shop whose jackets are
``outerwear`` finds "Storm Rain Jacket" by its words).

Without a catalogue (:data:`BUILTIN_VOCABULARY`) the built-in words are used as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

#: word or phrase (singular, lower case) → the categories of the sample catalogue it
#: points to. A jacket can be sold as a coat or as sportswear, so some words name several.
GARMENT_WORDS: dict[str, tuple[str, ...]] = {
    # multi-word and hyphenated names first (matched on the text before single words)
    "t-shirt": ("tops", "sportswear"),
    "tshirt": ("tops", "sportswear"),
    "belt bag": ("bags",),
    "bum bag": ("bags",),
    "sports bra": ("sportswear",),
    "swim shorts": ("sportswear",),
    "rain coat": ("jackets", "coats"),
    # single words
    "jacket": ("jackets", "coats", "sportswear"),
    "raincoat": ("jackets", "coats"),
    "anorak": ("jackets",),
    "windbreaker": ("jackets",),
    "poncho": ("jackets",),
    "blazer": ("jackets",),
    "coat": ("coats", "jackets"),
    "overcoat": ("coats",),
    "parka": ("coats",),
    "trench": ("coats",),
    "dress": ("dresses",),
    "jeans": ("jeans",),
    "trousers": ("trousers",),
    "pants": ("trousers", "jeans"),
    "chinos": ("trousers",),
    "joggers": ("trousers",),
    "skirt": ("skirts",),
    "shirt": ("shirts",),
    "blouse": ("shirts",),
    "tee": ("tops", "sportswear"),
    "top": ("tops",),
    "hoodie": ("tops",),
    "polo": ("tops",),
    "henley": ("tops",),
    "jumper": ("knitwear",),
    "sweater": ("knitwear",),
    "pullover": ("knitwear",),
    "cardigan": ("knitwear",),
    "knitwear": ("knitwear",),
    "shoe": ("shoes",),
    "footwear": ("shoes",),
    "boot": ("shoes",),
    "sneaker": ("shoes",),
    "trainer": ("shoes",),
    "sandal": ("shoes",),
    "loafer": ("shoes",),
    "heel": ("shoes",),
    "flat": ("shoes",),
    "wellies": ("shoes",),
    "wellington": ("shoes",),
    "espadrille": ("shoes",),
    "bag": ("bags",),
    "backpack": ("bags",),
    "rucksack": ("bags",),
    "tote": ("bags",),
    "handbag": ("bags",),
    "duffel": ("bags",),
    "scarf": ("accessories",),
    "scarves": ("accessories",),
    "hat": ("accessories",),
    "beanie": ("accessories",),
    "cap": ("accessories",),
    "glove": ("accessories",),
    "belt": ("accessories",),
    "umbrella": ("accessories",),
    "sunglasses": ("accessories",),
    "sock": ("accessories",),
    "accessory": ("accessories",),
    "accessories": ("accessories",),
    "leggings": ("sportswear",),
    "swimsuit": ("sportswear",),
    "swimwear": ("sportswear",),
    "bikini": ("sportswear",),
    "sportswear": ("sportswear",),
}

_WORD = re.compile(r"[a-z]+(?:-[a-z]+)*")


def _key(phrase: str) -> str:
    return re.sub(r"\s+", " ", phrase.strip().lower())


def _singular(word: str) -> str:
    """A plural's singular by the common English endings ("dresses" → "dress")."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


@dataclass(frozen=True)
class CategoryVocabulary:
    """Words and phrases (lower case) → the categories they name.

    Attributes:
        words: word or phrase → categories, in the order they were added; phrases with a
            space or a hyphen are matched before single words.
        categories: the catalogue's categories (empty: not restricted to a catalogue).
    """

    words: Mapping[str, tuple[str, ...]]
    categories: frozenset[str] = frozenset()

    @cached_property
    def _phrases(self) -> list[tuple[str, tuple[str, ...]]]:
        # longest first, so that "rain jacket" is matched before "jacket" could be
        multi = [(p, c) for p, c in self.words.items() if " " in p or "-" in p]
        return sorted(multi, key=lambda pc: -len(pc[0]))

    @classmethod
    def for_catalogue(
        cls,
        categories: Iterable[str],
        synonyms: Mapping[str, Sequence[str]] | None = None,
    ) -> CategoryVocabulary:
        """The vocabulary of a catalogue with these ``categories`` (see the module docstring).

        Args:
            categories: the catalogue's distinct categories (lower case, as stored).
            synonyms: category → words or phrases the shop uses for it. Synonyms of a
                category the catalogue does not have are left out (they could only
                empty a search).
        """
        have = frozenset(_key(c) for c in categories if c.strip())
        words: dict[str, list[str]] = {}

        def add(phrase: str, cats: Iterable[str]) -> None:
            kept = [c for c in cats if c in have]
            if kept and phrase:
                slot = words.setdefault(phrase, [])
                slot.extend(c for c in kept if c not in slot)

        for category in sorted(have):
            add(category, (category,))
            add(_singular(category), (category,))
            if category.endswith("ves"):  # scarves → scarf, knives → knife (gloves → glove above)
                add(category[:-3] + "f", (category,))
                add(category[:-3] + "fe", (category,))
        for category, phrases in (synonyms or {}).items():
            for phrase in phrases:
                add(_key(phrase), (_key(category),))
        for phrase, cats in GARMENT_WORDS.items():
            add(phrase, cats)
        return cls({k: tuple(v) for k, v in words.items()}, have)

    def word_categories(self, word: str) -> tuple[str, ...]:
        """Categories of one lower-case word, trying it as a plural too ("boots" → "boot")."""
        plural = (word[:-1] if word.endswith("s") else "", word[:-2], _singular(word))
        for candidate in (word, *plural):
            if candidate and candidate in self.words:
                return self.words[candidate]
        return ()

    def find(self, text: str, label: str | None = None) -> tuple[str, ...]:
        """The categories ``text`` names (first mention first, each once), and the
        classify ``label``'s when the label is a category or a word of the vocabulary."""
        low = text.lower()
        found: list[str] = []
        for phrase, cats in self._phrases:
            pattern = rf"\b{re.escape(phrase)}s?\b"
            if re.search(pattern, low):
                found.extend(cats)
                low = re.sub(pattern, " ", low)
        for word in _WORD.findall(low):
            found.extend(self.word_categories(word))
        if label:
            lab = _key(label)
            known = self.categories or {c for cats in self.words.values() for c in cats}
            found.extend((lab,) if lab in known else self.word_categories(lab))
        return tuple(dict.fromkeys(found))


#: The built-in words as they are, for a search with no catalogue at hand.
BUILTIN_VOCABULARY = CategoryVocabulary(dict(GARMENT_WORDS))

__all__ = ["BUILTIN_VOCABULARY", "GARMENT_WORDS", "CategoryVocabulary"]
