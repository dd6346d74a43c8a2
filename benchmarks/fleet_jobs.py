"""No-op jobs for ``benchmarks/bench_fleet.py``, imported by its worker processes.

``noop_job`` is a redis-lease Job whose handler does nothing; ``noop`` is the RQ
baseline's job function. Worker processes import this module as
``benchmarks.fleet_jobs`` (run them with the repository root on ``PYTHONPATH``).

The job's options come from environment variables read at import time, so the
benchmark process and its workers agree on them: ``BENCH_FLEET_QUEUE`` (the RQ
queue of the shard jobs), ``BENCH_FLEET_SHARDS`` and ``BENCH_FLEET_BATCH``
(items per ``claim_next``). The planner reads ``BENCH_FLEET_ITEMS`` when it runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import date
from typing import TYPE_CHECKING

from redis_lease.fleet.jobs.job import Job, JobOptions
from redis_lease.protocol.leases import Item

if TYPE_CHECKING:
    from redis_lease.fleet.worker.shard_job import ActiveLease

QUEUE_ENV = "BENCH_FLEET_QUEUE"
SHARDS_ENV = "BENCH_FLEET_SHARDS"
BATCH_ENV = "BENCH_FLEET_BATCH"
ITEMS_ENV = "BENCH_FLEET_ITEMS"
JOB_PATH = "benchmarks.fleet_jobs:noop_job"
NOOP_PATH = "benchmarks.fleet_jobs.noop"

noop_job = Job(
    "fleet-noop",
    shards=int(os.environ.get(SHARDS_ENV, "8")),
    batch_size=int(os.environ.get(BATCH_ENV, str(JobOptions().batch_size))),
    queue=os.environ.get(QUEUE_ENV, "redis-lease"),
    lease_ttl_seconds=600,
    shard_budget_seconds=600,
    max_attempts=3,
)


@noop_job.planner
def plan(business_date: date) -> Iterator[Item]:
    """Yields ``BENCH_FLEET_ITEMS`` items with a tiny payload."""
    for number in range(int(os.environ.get(ITEMS_ENV, "1000"))):
        yield Item(f"item-{number:07d}", {"n": number})


@noop_job.handler
def handle(item: Item, lease: ActiveLease) -> None:
    """Does nothing: the benchmark measures the system around the handler."""
    return None


def noop() -> None:
    """The RQ baseline's job: does nothing."""
    return None
