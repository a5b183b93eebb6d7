"""Times and fractions as people read them, spelled the same by every tool: the agent's
command line, the reconciler's texts and alerts, the dashboard.

Times are UTC, given in ms since the epoch. Percentages are rounded *down* to a tenth: a
window that lost one record in a million shows 99.9%, never 100.0%.
"""

from __future__ import annotations

import datetime as dt


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def utc_iso(ms: int, *, millis: bool = False) -> str:
    """``2026-11-23T07:10:00Z`` (RFC 3339); ``millis``: ``2026-11-23T07:10:00.123Z``."""
    text = _utc(ms).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if millis else f"{text}Z"


def utc_minute(ms: int) -> str:
    """``2026-11-23T07:10Z``: a window start, short enough for a subject line."""
    return _utc(ms).strftime("%Y-%m-%dT%H:%MZ")


def window_label(ms: int) -> str:
    """A window's start: ``2026-11-23T07:10Z``, with its seconds only when they are not 0."""
    return utc_iso(ms) if ms % 60_000 else utc_minute(ms)


def utc_text(ms: int) -> str:
    """``2026-11-23 07:10:00 UTC``: a time in a line of a command's report."""
    return _utc(ms).strftime("%Y-%m-%d %H:%M:%S UTC")


def _tenths(per_mille: int) -> str:
    return f"{per_mille // 10}.{per_mille % 10}%"


def percent_of(actual: int, expected: int) -> str:
    """``actual / expected`` with one decimal, rounded down (99.99% is 99.9%); nothing
    expected is 100.0% when nothing came, ``-`` otherwise."""
    if not expected:
        return "100.0%" if actual == 0 else "-"
    return _tenths(actual * 1000 // expected)


def percent(fraction: float | None) -> str:
    """A fraction (0.9991) as ``99.9%``, rounded down; None (not known) as ``–``."""
    if fraction is None:
        return "–"
    return _tenths(int(fraction * 1000))
