"""Optional redaction of personal data in the stored prompts and outputs.

``[log] redact = ["email", "phone", "card"]`` in ``chainrun.toml`` masks those kinds in
every text chainrun writes to the log (turn input and output, step outputs, details and
state updates, call prompts, outputs, reasoning and error messages, verdicts, tool calls'
arguments, results and errors), as ``[email]``, ``[phone]``, ``[card]``. What the model
receives and what the caller streams are not changed: only the record is.

The patterns are the deterministic checks' (:mod:`chainrun.checks.patterns`: cards by
the Luhn checksum, IBANs by mod-97, API-key prefixes, e-mail, phone numbers of 7-15
digits), so ``iban`` and ``api_key`` can be named too. Cards claim text before phones,
so a card number is never half-masked as a phone number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from chainrun.checks.patterns import BUILTIN_CHECKS, PatternCheck, PatternChecker
from chainrun.log.rows import CallRow, TurnLog


class Redactor:
    """Masks the chosen kinds of personal data in text.

    Args:
        kinds: any of :data:`~chainrun.checks.patterns.BUILTIN_CHECKS` (``card``,
            ``iban``, ``api_key``, ``email``, ``phone``).

    Raises:
        ValueError: an unknown kind.
    """

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = frozenset(kinds)
        unknown = self.kinds - set(BUILTIN_CHECKS)
        if unknown:
            raise ValueError(
                f"unknown redaction kind {sorted(unknown)[0]!r}; expected {BUILTIN_CHECKS}"
            )
        self._checker = PatternChecker(
            [PatternCheck.builtin(k, "redact") for k in BUILTIN_CHECKS if k in self.kinds]
        )

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def text(self, value: str | None) -> str | None:
        """``value`` with the chosen kinds masked (None stays None)."""
        if not value or not self.kinds:
            return value
        return self._checker.check(value).text

    def json_text(self, value: str | None) -> str | None:
        """A JSON document with every string inside it masked (non-JSON: as text),
        encoded again as it came (non-ASCII text as UTF-8, not ``\\u`` escapes)."""
        if not value or not self.kinds:
            return value
        try:
            doc = json.loads(value)
        except ValueError:
            return self.text(value)
        return json.dumps(self.value(doc), ensure_ascii=False)

    def value(self, doc: Any) -> Any:
        """Any JSON-like value with every string in it masked."""
        if isinstance(doc, str):
            return self.text(doc)
        if isinstance(doc, list):
            return [self.value(v) for v in doc]
        if isinstance(doc, dict):
            return {k: self.value(v) for k, v in doc.items()}
        return doc


def redact_calls(calls: Iterable[CallRow], r: Redactor) -> None:
    """Mask the texts of call rows in place (the prompt's messages, output, reasoning,
    error). A prompt still held as its message list is masked as data, before its one
    encoding (:func:`chainrun.log.rows.prompt_text`)."""
    for c in calls:
        c.prompt = r.value(c.prompt) if isinstance(c.prompt, list) else r.json_text(c.prompt)
        c.output = r.text(c.output)
        c.reasoning = r.text(c.reasoning)
        c.error_message = r.text(c.error_message)


def redact_turn(log: TurnLog, r: Redactor) -> None:
    """Mask a turn's texts in place, with its steps and calls, before it is logged."""
    if not r:
        return
    turn = log.turn
    turn.input = r.text(turn.input) or ""
    turn.output = r.text(turn.output)
    turn.verdicts = r.value(turn.verdicts)
    for s in log.steps:
        s.output = r.text(s.output)
        s.detail = r.value(s.detail)
        s.updates = r.value(s.updates)
    redact_calls(log.calls, r)
    for t in log.tool_calls:
        t.arguments = r.json_text(t.arguments)
        t.result = r.json_text(t.result)
        t.error_message = r.text(t.error_message)
