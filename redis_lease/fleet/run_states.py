"""A run's states and how long a finished run is kept: defined once, for the modules
that change runs (:mod:`redis_lease.fleet.runs`), count them (:mod:`redis_lease.fleet.job_tallies`)
and export them (:mod:`redis_lease.metrics`)."""

from __future__ import annotations

from ..limits import DEFAULT_RETENTION_DAYS

#: States of a run still being worked.
OPEN_STATES = ("planning", "running")
#: States a run ends in.
FINAL_STATES = ("succeeded", "partial", "failed", "canceled")
#: What views show for a run whose record vanished and that was not made again.
LOST_STATE = "lost"
DAY_MS = 86_400_000


def retention_days(info: dict[str, str]) -> int:
    """Days a finished run is kept, from its record; the default when the record has no
    valid ``retention_days`` (a whole number above 0)."""
    text = info.get("retention_days", "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_RETENTION_DAYS


def kept_until_ms(info: dict[str, str]) -> int | None:
    """When a final run's retention ends (ms), from its record; None while it is open
    or when the record does not say when it ended."""
    if info.get("state") not in FINAL_STATES or not info.get("state_at", "").isdigit():
        return None
    return int(info["state_at"]) + retention_days(info) * DAY_MS


__all__ = ["DAY_MS", "FINAL_STATES", "LOST_STATE", "OPEN_STATES", "kept_until_ms", "retention_days"]
