"""The redis-lease job of ``benchmarks/peers.py``, imported by its worker processes.

Workers import it as ``peer_lease_jobs`` (``benchmarks/peers`` is on their
``PYTHONPATH``). Its options come from environment variables read at import time:
``PEER_LEASE_QUEUE``, ``PEER_LEASE_SHARDS``, ``PEER_LEASE_BATCH``, ``PEER_SLEEP_MS``
(the handler's sleep; 0 is a no-op) and ``PEER_CONCURRENCY`` (items in flight per
worker). The planner reads ``PEER_LEASE_ITEMS``. The harness builds the same job
with :func:`make_job` and explicit values.

A handler that sleeps is ``async`` (``await asyncio.sleep``) when the installed
redis-lease has ``JobOptions.concurrency`` and more than one item may be in
flight; otherwise it is a plain function calling ``time.sleep``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import fields
from datetime import date
from typing import TYPE_CHECKING, Any

from redis_lease.fleet.jobs.job import Job, JobOptions
from redis_lease.protocol.leases import Item

if TYPE_CHECKING:
    from redis_lease.fleet.jobs.live_lease import ActiveLease

QUEUE_ENV = "PEER_LEASE_QUEUE"
SHARDS_ENV = "PEER_LEASE_SHARDS"
BATCH_ENV = "PEER_LEASE_BATCH"
ITEMS_ENV = "PEER_LEASE_ITEMS"
SLEEP_MS_ENV = "PEER_SLEEP_MS"
CONCURRENCY_ENV = "PEER_CONCURRENCY"
JOB_PATH = "peer_lease_jobs:peer_job"

_OPTIONS = {f.name for f in fields(JobOptions)}
#: True when this redis-lease runs several items of a worker at once (``JobOptions.concurrency``).
HAS_CONCURRENCY = "concurrency" in _OPTIONS
#: The option names of this redis-lease (releases before 0.10.0 had no unit in them).
TTL, BUDGET = (
    ("lease_ttl_seconds", "shard_budget_seconds")
    if "lease_ttl_seconds" in _OPTIONS
    else ("lease_ttl", "shard_budget")
)


def make_job(
    queue: str, shards: int, batch_size: int, sleep_ms: float, concurrency: int, items: int
) -> Job:
    """The benchmark's job: ``items`` items, a handler sleeping ``sleep_ms`` (0: no-op)."""
    options: dict[str, Any] = {
        "shards": shards,
        "batch_size": batch_size,
        "queue": queue,
        TTL: 600,
        BUDGET: 600,
        "max_attempts": 3,
    }
    overlap = HAS_CONCURRENCY and concurrency > 1
    if overlap:
        options["concurrency"] = concurrency
    job = Job("peer-work", **options)
    seconds = sleep_ms / 1000

    @job.planner
    def plan(business_date: date) -> Iterator[Item]:
        for number in range(items):
            yield Item(f"item-{number:07d}", {"n": number})

    if seconds <= 0:

        @job.handler
        def noop(item: Item, lease: ActiveLease) -> None:
            return None

    elif overlap:

        @job.handler
        async def nap(item: Item, lease: ActiveLease) -> None:
            await asyncio.sleep(seconds)

    else:

        @job.handler
        def sleep(item: Item, lease: ActiveLease) -> None:
            time.sleep(seconds)

    return job


peer_job = make_job(
    os.environ.get(QUEUE_ENV, "redis-lease"),
    int(os.environ.get(SHARDS_ENV, "8")),
    int(os.environ.get(BATCH_ENV, "20")),
    float(os.environ.get(SLEEP_MS_ENV, "0")),
    int(os.environ.get(CONCURRENCY_ENV, "1")),
    int(os.environ.get(ITEMS_ENV, "0")),
)
