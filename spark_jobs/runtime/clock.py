"""Times as the platform writes and reads them: UTC, in ISO-8601 text or epoch milliseconds.

A timestamp without a zone (naive) means UTC everywhere in the platform.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

#: The start of epoch time, 1970-01-01T00:00:00Z.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_ms() -> int:
    """Milliseconds since the epoch, now."""
    return round(time.time() * 1000)


def from_ms(ms: float) -> datetime:
    """Epoch milliseconds -> an aware UTC datetime (exact: no floating-point seconds)."""
    return EPOCH + timedelta(milliseconds=ms)


def to_ms(value: datetime) -> int:
    """A datetime (naive means UTC) -> epoch milliseconds, rounded down (exact)."""
    delta = (value if value.tzinfo else value.replace(tzinfo=UTC)) - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def parse_iso(text: str) -> datetime:
    """ISO-8601 text (``Z``, an offset, or naive for UTC) -> an aware datetime in the zone it names.
    Raises ValueError if it is not a timestamp."""
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def epoch_seconds(value: object) -> float | None:
    """ISO-8601 text -> seconds since the epoch; None if it is not a timestamp (or None)."""
    try:
        return parse_iso(str(value)).timestamp()
    except ValueError:
        return None


def epoch_ms(value: object) -> int | None:
    """ISO-8601 text -> epoch milliseconds (exact); None if it is not a timestamp (or None)."""
    try:
        return to_ms(parse_iso(str(value)))
    except ValueError:
        return None


def _utc(value: datetime | float) -> datetime:
    if not isinstance(value, datetime):
        return datetime.fromtimestamp(value, UTC)
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


def iso(value: datetime | float) -> str:
    """A datetime (naive means UTC) or epoch seconds -> ``2026-01-01T00:00:01Z``."""
    return _utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ms(value: datetime | float) -> str:
    """A datetime (naive means UTC) or epoch seconds -> ``2026-01-01T00:00:01.123Z``."""
    value = _utc(value)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def compact(value: datetime | float) -> str:
    """A datetime (naive means UTC) or epoch seconds -> ``20260101T000001Z`` (for names and ids)."""
    return _utc(value).strftime("%Y%m%dT%H%M%SZ")


def ago(seconds: float | None) -> str:
    """An age in seconds -> ``12s ago``; ``never`` for None."""
    return "never" if seconds is None else f"{seconds:.0f}s ago"
