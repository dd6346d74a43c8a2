"""The count of RQ jobs workers failed without running (see :mod:`redis_lease.bad_jobs`),
kept in Redis for the exporter: the hash ``<prefix>:rq:bad_jobs``, one field
``<reason>:<queue>`` per reason and queue.

Apart from the worker's module so that the exporter reads it without importing RQ.
"""

from __future__ import annotations

from collections.abc import Iterable

from .connection import as_text
from .store import LeaseStore

#: Why a job is bad: RQ cannot read its hash or data / its function does not import.
UNREADABLE = "unreadable"
UNIMPORTABLE = "unimportable"
REASONS = (UNREADABLE, UNIMPORTABLE)


def start_at_zero(store: LeaseStore, queues: Iterable[str]) -> None:
    """Makes the counts of ``queues`` exist, at 0 when new: ``increase()`` sees the first."""
    pipe = store.client.pipeline(transaction=False)
    for queue in queues:
        for reason in REASONS:
            pipe.hincrby(store.keys.bad_jobs, f"{reason}:{queue}", 0)
    with store.translating_errors():
        pipe.execute()


def count(store: LeaseStore, queue: str, reason: str) -> None:
    """Counts one bad job of ``queue`` failed for ``reason``."""
    with store.translating_errors():
        store.client.hincrby(store.keys.bad_jobs, f"{reason}:{queue}", 1)


def read(store: LeaseStore) -> dict[tuple[str, str], int]:
    """Every count, by ``(queue, reason)``."""
    with store.translating_errors():
        raw = store.client.hgetall(store.keys.bad_jobs)
    counts = {}
    for field, value in raw.items():
        reason, _, queue = as_text(field).partition(":")
        counts[(queue, reason)] = int(value)
    return counts


__all__ = ["REASONS", "UNIMPORTABLE", "UNREADABLE", "count", "read", "start_at_zero"]
