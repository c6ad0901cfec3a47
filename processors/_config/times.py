"""Times as people write them on a command line or in a setting: ms or ISO 8601."""

from __future__ import annotations

from datetime import UTC, datetime


def time_ms(text: str) -> int | None:
    """Return the time ``text`` names in ms since the epoch, or ``None`` if it names none.

    ``text`` is an integer (ms since the epoch) or an ISO 8601 time
    (``2026-01-31T12:00:00Z``; without an offset it is UTC).
    """
    value = text.strip()
    if value.isdigit():
        return int(value)
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)
