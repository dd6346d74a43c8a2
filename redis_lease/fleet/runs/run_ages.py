"""A run's oldest eligible age over time: a capped series sampled by the tick (the
exporter only reads Redis), read by the dashboard's chart.

Each sample is one stream entry at ``<prefix>:run:{<run>}:ages`` with the age in
seconds and the done and unfinished counts. Samples closer together than
``MIN_INTERVAL_MS`` are skipped, so two ticks in the same moment add one point; the
stream keeps about ``CAP`` entries (a day at one a minute) and expires with the run's
other keys. A sample is one script on the run's slot (``lua/record_age.lua``): none is
added once the run is final or its record is gone, and the series takes the record's
time to live, so a sample racing the run's retirement never leaves a key that does not
expire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ...limits import AGE_INTERVAL_MS, AGE_SAMPLES
from ...protocol.connection.clients import as_text
from ...protocol.leases import RunStatus
from ...protocol.store.lease_store import LeaseStore

#: Entries kept per run (XADD MAXLEN ~).
CAP = AGE_SAMPLES
#: The least time between two samples.
MIN_INTERVAL_MS = AGE_INTERVAL_MS


@dataclass(frozen=True)
class AgeSample:
    """One point of the series."""

    at_ms: int
    oldest_eligible_age_seconds: float
    done: int
    unfinished: int


def key(store: LeaseStore, run_id: str) -> str:
    """The run's series key (same hash tag as the run's record)."""
    return store.keys.run_ages(run_id)


def record(store: LeaseStore, status: RunStatus, now_ms: int) -> bool:
    """Adds a sample of ``status`` at ``now_ms``; False when the last one is too recent or
    the run is no longer open (final, or its record gone)."""
    keys = [store.keys.run(status.run_id), key(store, status.run_id)]
    args: list[int | str] = [
        now_ms,
        MIN_INTERVAL_MS,
        CAP,
        f"{status.oldest_eligible_age_seconds:.3f}",
        status.counts.get("done", 0),
        status.unfinished,
    ]
    with store.translating_errors(status.run_id):
        added: bool = store.scripts.call("record_age", keys, args)
    return added


def read(store: LeaseStore, run_id: str, limit: int = CAP) -> list[AgeSample]:
    """The newest ``limit`` samples, oldest first."""
    with store.translating_errors(run_id):
        entries = _entries(store.client.xrevrange(key(store, run_id), count=limit))
    return [_sample(fields) for _entry_id, fields in reversed(entries)]


def _entries(reply: object) -> list[tuple[Any, dict[Any, Any]]]:
    return cast(list[tuple[Any, dict[Any, Any]]], reply or [])


def _sample(fields: dict[Any, Any]) -> AgeSample:
    values = {as_text(k): as_text(v) for k, v in fields.items()}
    return AgeSample(
        at_ms=int(values.get("at", "0")),
        oldest_eligible_age_seconds=float(values.get("age", "0")),
        done=int(values.get("done", "0")),
        unfinished=int(values.get("unfinished", "0")),
    )
