"""Times as the log holds them, and ``--since``/``--until`` read into that form."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from chainrun.errors import UserInputError

__all__ = ["log_time", "log_window"]


def log_time(when: datetime) -> str:
    """``when`` as the log's ``*_at`` columns hold it (ISO-8601 UTC with ms, as
    :func:`chainrun.log.migrations.utc_now`): text that sorts in time order on both databases."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat(timespec="milliseconds")


def log_window(since: str | None, until: str | None) -> tuple[str | None, str | None]:
    """``--since``/``--until`` (ISO-8601; UTC unless they say otherwise) as the log's time
    text (:func:`log_time`); a date alone as ``until`` includes that whole day.

    Raises:
        UserInputError: a value that is not ISO-8601, or a window that ends before it
            starts (naming the option).
    """
    bounds: list[str | None] = []
    for option, text in (("--since", since), ("--until", until)):
        if text is None:
            bounds.append(None)
            continue
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UserInputError(
                f"{option} {text!r}: expected an ISO-8601 time such as 2026-12-01T15:00 "
                "(UTC unless it says otherwise)"
            ) from None
        if option == "--until" and len(text.strip()) == 10:  # a date alone: the whole day
            when += timedelta(days=1)
        bounds.append(log_time(when))
    lo, hi = bounds
    if lo is not None and hi is not None and hi <= lo:
        raise UserInputError(f"--since {since} --until {until}: the window ends before it starts")
    return lo, hi
