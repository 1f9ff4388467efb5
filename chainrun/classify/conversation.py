"""Classifying a turn of a conversation: a follow-up keeps the label of the turn it follows.

"Which of those is cheapest?" is a product question, but "Is it available in navy?" or
"What about in size S?" say little on their own: their label is the one of the
conversation's subject. A message is classified as the turn it follows when

- it is a **follow-up** (:func:`chainrun.retrieval.followup.is_follow_up`: it names no
  product subject of its own, and either points back, "it", "those", "similar", or only
  qualifies, "in navy", "cheaper"), and
- no keyword rule fires on it (a rule is the message's own signal: "Do they run small?"
  is ``sizing`` whatever came before; with the ``examples`` method there are no rules),
  and
- an earlier turn of the conversation decides on its own (the nearest one that is not
  such a follow-up itself, so a chain of follow-ups keeps its subject).

Any other message is classified alone. The same rules, with the same words, decide
what the retrieve step searches for a follow-up, so a turn's route and its search agree.
Earlier turns' labels are kept in a small cache by message (a conversation's previous
turn was classified by the same step a moment before), so a follow-up costs no more
than one classification.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from chainrun.classify.base import Classification, Classifier
from chainrun.classify.keywords import KeywordRules
from chainrun.retrieval.followup import is_follow_up

__all__ = ["FollowUps"]

#: earlier messages' labels kept (per step), least recently used dropped first
CACHE_SIZE = 512


class FollowUps:
    """A classifier that reads the conversation (see the module docstring).

    Args:
        classifier: classifies one message alone.
        rules: the keyword rules whose firing makes a message decide on its own (None:
            only :func:`~chainrun.retrieval.followup.is_follow_up` decides).
        cache_size: earlier messages' labels kept.
    """

    def __init__(
        self, classifier: Classifier, rules: KeywordRules | None, *, cache_size: int = CACHE_SIZE
    ) -> None:
        self.classifier = classifier
        self.rules = rules
        self.method = classifier.method
        self._cache: OrderedDict[str, Classification] = OrderedDict()
        self._cache_size = cache_size

    @property
    def labels(self) -> Sequence[str]:
        return self.classifier.labels

    def follows(self, message: str) -> bool:
        """Whether ``message`` takes the label of an earlier turn (when there is one):
        a follow-up on which no keyword rule fires."""
        if self.rules is not None and self.rules.hits(message):
            return False
        return is_follow_up(message)

    async def alone(self, message: str) -> Classification:
        """``message`` classified on its own (cached by message)."""
        found = self._cache.get(message)
        if found is not None:
            self._cache.move_to_end(message)
            return found
        found = await self.classifier.classify(message)
        self._cache[message] = found
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return found

    async def subject(self, earlier: Sequence[str]) -> tuple[str, Classification] | None:
        """The conversation's subject: the nearest of the ``earlier`` messages (oldest
        first) that is not a follow-up, with its label on its own (cached); None when
        every earlier message is a follow-up, or there is none."""
        for previous in reversed(earlier):
            if not self.follows(previous):
                return previous, await self.alone(previous)
        return None

    async def classify(self, message: str, earlier: Sequence[str] = ()) -> Classification:
        """The label of ``message`` after the conversation's earlier messages ``earlier``
        (oldest first).

        ``detail["decided_by"]`` is ``"follow_up"`` when an earlier turn decided, with
        ``detail["follows"]`` that turn's message; the classifier's own detail otherwise.
        """
        if earlier and self.follows(message):
            found = await self.subject(earlier)
            if found is not None:
                previous, label = found
                return Classification(
                    label.label,
                    self.method,
                    label.score,
                    {"decided_by": "follow_up", "follows": previous},
                    label.confidences,
                )
        return await self.alone(message)
