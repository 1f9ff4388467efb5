"""Checks on the critical path that need no model: deterministic pattern checks and the
hold-back engine that runs checks over a stream before its tokens reach the user.

Knows nothing of LLMs or HTTP (like :mod:`chainrun.hedging`): text in, verdicts out.
"""

from chainrun.checks.patterns import (
    BUILTIN_CHECKS,
    CheckResult,
    Finding,
    PatternCheck,
    PatternChecker,
    iban_valid,
    luhn_valid,
)

__all__ = [
    "BUILTIN_CHECKS",
    "CheckResult",
    "Finding",
    "PatternCheck",
    "PatternChecker",
    "iban_valid",
    "luhn_valid",
]
