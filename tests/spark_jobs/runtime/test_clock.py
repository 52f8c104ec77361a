"""Times as the platform writes and reads them (spark_jobs.runtime.clock): the texts stay the
ones already in its files, and milliseconds are exact."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from spark_jobs.runtime import clock

PARIS = timezone(timedelta(hours=1))


def test_iso_texts() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)
    assert clock.iso(at) == "2026-01-02T03:04:05Z"
    assert clock.iso(at.replace(tzinfo=None)) == "2026-01-02T03:04:05Z"  # naive means UTC
    assert clock.iso(at.astimezone(PARIS)) == "2026-01-02T03:04:05Z"
    assert clock.iso(at.timestamp()) == "2026-01-02T03:04:05Z"  # epoch seconds
    assert clock.iso_ms(at) == "2026-01-02T03:04:05.678Z"
    assert clock.iso_ms(at.astimezone(PARIS)) == "2026-01-02T03:04:05.678Z"
    assert clock.compact(at) == "20260102T030405Z"
    assert clock.compact(at.replace(tzinfo=None)) == "20260102T030405Z"


def test_iso_is_what_the_pages_and_ledgers_wrote_before() -> None:
    for seconds in (0.0, 1.999, 1_767_225_599.5, 1_767_225_600.0):
        assert clock.iso(seconds) == datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace(
            "+00:00", "Z")


def test_milliseconds_are_exact() -> None:
    assert clock.from_ms(0) == clock.EPOCH == datetime(1970, 1, 1, tzinfo=UTC)
    assert clock.from_ms(1_500) == datetime(1970, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)
    for ms in (0, 1, 999, 1_767_225_601_123, 253_402_300_799_999, -1, -1_001):
        assert clock.to_ms(clock.from_ms(ms)) == ms
        assert clock.from_ms(ms).tzinfo is UTC
    assert clock.to_ms(datetime(1970, 1, 1, 0, 0, 1, 999_999)) == 1_999  # naive means UTC; rounded down
    assert clock.to_ms(datetime(1970, 1, 1, 1, tzinfo=PARIS)) == 0
    assert clock.iso_ms(clock.from_ms(1_767_225_601_123)) == "2026-01-01T00:00:01.123Z"


def test_parsing() -> None:
    assert clock.parse_iso("2026-01-01T00:00:01Z") == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert clock.parse_iso("2026-01-01T00:00:01.123Z") == datetime(2026, 1, 1, 0, 0, 1, 123_000, tzinfo=UTC)
    assert clock.parse_iso("2026-01-01T00:00:01") == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)  # naive: UTC
    paris = clock.parse_iso("2026-01-01T01:00:00+01:00")
    assert paris.utcoffset() == timedelta(hours=1) and paris == datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError):
        clock.parse_iso("yesterday")
    assert clock.epoch_seconds("1970-01-01T00:01:00Z") == 60.0
    assert clock.epoch_seconds("1970-01-01T00:00:01.5") == 1.5
    assert clock.epoch_ms("1970-01-01T00:00:01.5Z") == 1_500
    for nothing in (None, "", "not a time", 17):
        assert clock.epoch_seconds(nothing) is None
        assert clock.epoch_ms(nothing) is None


def test_now_and_ages() -> None:
    before = time.time() * 1000
    now = clock.now_ms()
    assert isinstance(now, int) and before - 1 <= now <= time.time() * 1000 + 1
    assert clock.ago(None) == "never"
    assert clock.ago(12.4) == "12s ago" and clock.ago(0) == "0s ago"
