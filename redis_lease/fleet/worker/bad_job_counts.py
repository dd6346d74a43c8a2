"""The count of RQ jobs workers failed without running (see
:mod:`redis_lease.fleet.worker.bad_jobs`),
kept in Redis for the exporter: the hash ``<prefix>:rq:bad_jobs``, one field
``<reason>:<queue>`` per reason and queue, made by the first bad job (a worker with no
bad job writes nothing). The prefix is the worker's store's (``--prefix``): a job
that cannot be read does not say whose it is.

Apart from the worker's module so that the exporter reads it without importing RQ.
"""

from __future__ import annotations

from ...protocol.connection.clients import as_text
from ...protocol.store.lease_store import LeaseStore

#: Why a job is bad: RQ cannot read its hash or data / its function does not import.
UNREADABLE = "unreadable"
UNIMPORTABLE = "unimportable"
REASONS = (UNREADABLE, UNIMPORTABLE)


def count(store: LeaseStore, queue: str, reason: str) -> None:
    """Counts one bad job of ``queue`` failed for ``reason``."""
    with store.translating_errors():
        store.client.hincrby(store.keys.bad_jobs, f"{reason}:{queue}", 1)


def read(store: LeaseStore) -> dict[tuple[str, str], int]:
    """Every count, by ``(queue, reason)``: each reason of each queue counted at all (0 for
    the reasons it has none of), so that ``increase()`` sees the first of each."""
    with store.translating_errors():
        raw = store.client.hgetall(store.keys.bad_jobs)
    counts = {}
    for field, value in raw.items():
        reason, _, queue = as_text(field).partition(":")
        counts.update({(queue, other): 0 for other in REASONS if (queue, other) not in counts})
        counts[(queue, reason)] = int(value)
    return counts


__all__ = ["REASONS", "UNIMPORTABLE", "UNREADABLE", "count", "read"]
