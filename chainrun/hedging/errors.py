"""The exceptions the hedging engine raises (or stores in ``HedgeOutcome.error``).

::

    HedgingError            root: catch this to catch everything the engine itself raises
    ├── DeadlineExceeded    no attempt answered inside the policy's deadline (also a TimeoutError)
    ├── CircuitOpen         every target's circuit breaker is open: nothing was sent
    └── NoAcceptableAnswer  every attempt answered, but no answer passed the quality gate

Errors raised by the attempts themselves are passed through unchanged. The engine is
generic: it does not import ``chainrun.errors``; the chain maps these onto that tree.
"""

from __future__ import annotations

from collections.abc import Sequence


class HedgingError(Exception):
    """Root of the exceptions the hedging engine produces on its own account."""


class DeadlineExceeded(HedgingError, TimeoutError):
    """No attempt answered (with an accepted value) inside ``deadline_s`` seconds.

    A subclass of the builtin ``TimeoutError`` so that generic timeout handling catches it.
    """

    def __init__(self, deadline_s: float) -> None:
        super().__init__(f"no answer within the deadline of {deadline_s:g} s")
        #: the deadline that was exceeded, in seconds
        self.deadline_s = deadline_s


class CircuitOpen(HedgingError):
    """The circuit breakers of all candidate targets are open, so no attempt was sent.

    Fail fast (Nygard's circuit breaker): the targets failed repeatedly and are cooling down.
    """

    def __init__(self, targets: Sequence[str]) -> None:
        super().__init__(f"circuit open for every target: {', '.join(targets)}")
        #: the targets whose breakers refused the attempt
        self.targets = tuple(targets)


class NoAcceptableAnswer(HedgingError):
    """Every attempt that answered failed the quality gate (``accept`` returned False)."""

    def __init__(self, rejected: int) -> None:
        super().__init__(f"{rejected} answer(s) failed the quality gate, none was accepted")
        #: how many answers were rejected
        self.rejected = rejected
