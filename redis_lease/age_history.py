"""A run's oldest eligible age over time: a capped series sampled by the tick and
the exporter, read by the dashboard's chart.

Each sample is one stream entry at ``<prefix>:run:{<run>}:ages`` with the age in
seconds and the done and unfinished counts. Samples closer together than
``MIN_INTERVAL_MS`` are skipped, so a tick and a scrape in the same moment add
one point; the stream keeps about ``CAP`` entries (a day at one a minute) and
expires with the run's other keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from .connection import as_text
from .lease import RunStatus
from .store import LeaseStore

#: Entries kept per run (XADD MAXLEN ~).
CAP = 1440
#: The least time between two samples.
MIN_INTERVAL_MS = 10_000


@dataclass(frozen=True)
class AgeSample:
    """One point of the series."""

    at_ms: int
    oldest_eligible_age_seconds: float
    done: int
    unfinished: int


def key(store: LeaseStore, run_id: str) -> str:
    """The run's series key (same hash tag as the run's record)."""
    return f"{store.keys.run(run_id)}:ages"


def record(store: LeaseStore, status: RunStatus, now_ms: int) -> bool:
    """Adds a sample of ``status`` at ``now_ms``; False when the last one is too recent."""
    series = key(store, status.run_id)
    with store.translating_errors(status.run_id):
        last = _entries(store.client.xrevrange(series, count=1))
        if last and abs(now_ms - _sample(last[0][1]).at_ms) < MIN_INTERVAL_MS:
            return False
        store.client.xadd(
            series,
            {
                "at": now_ms,
                "age": f"{status.oldest_eligible_age_seconds:.3f}",
                "done": status.counts.get("done", 0),
                "unfinished": status.unfinished,
            },
            maxlen=CAP,
            approximate=True,
        )
    return True


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
