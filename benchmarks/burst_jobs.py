"""The job of ``benchmarks/burst.py``, imported by its worker processes.

``burst_job`` (``benchmarks.burst_jobs:burst_job``) is a redis-lease Job whose
handler sleeps a fixed latency and then fails a fixed fraction of its attempts.
Which attempts fail is decided by a hash of the item id and the attempt number,
so a run's failures do not depend on which worker takes which item.

The benchmark and its workers agree on the job's settings through one
environment variable, ``BURST_SETTINGS`` (JSON of :class:`Settings`), read when
this module is imported. Items are not planned: the benchmark feeds them into
the run over the burst window with ``LeaseStore.add``.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING

from redis_lease.fleet.jobs.job import Job
from redis_lease.protocol.leases import Item

if TYPE_CHECKING:
    from redis_lease.fleet.jobs.live_lease import ActiveLease

SETTINGS_ENV = "BURST_SETTINGS"
JOB_PATH = "benchmarks.burst_jobs:burst_job"
JOB_NAME = "burst"
#: Claims of an item before it goes dead: with independent failures at rate q an item
#: goes dead with probability q**MAX_ATTEMPTS (1e-13 at q = 0.05).
MAX_ATTEMPTS = 10
#: A failed attempt is due again after 0.5x to 1x of BACKOFF_BASE * 2**(attempt - 1)
#: seconds (at most BACKOFF_CAP): retries come back within the burst.
BACKOFF_BASE = 0.2
BACKOFF_CAP = 1.0
#: Seconds a shard job works its shard before it re-enqueues itself: short, so that
#: shard jobs rotate over the consumers and no shard waits behind a busy one.
SHARD_BUDGET = 1.0
LEASE_TTL = 30.0
#: One item per claim: an item waiting for its consumer stays eligible (pending) rather
#: than leased in someone's batch, so the oldest eligible age is the whole wait.
BATCH_SIZE = 1


@dataclass(frozen=True)
class Settings:
    """What the benchmark and its workers agree on for one trial."""

    queue: str = "burst"
    shards: int = 1
    handler_ms: float = 50.0
    retry_rate: float = 0.0

    def to_env(self) -> dict[str, str]:
        """The environment variable that hands these settings to worker processes."""
        return {SETTINGS_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> Settings:
        """The settings in ``BURST_SETTINGS``, or the defaults when it is not set."""
        raw = os.environ.get(SETTINGS_ENV)
        return cls(**json.loads(raw)) if raw else cls()


def fails(item_id: str, attempt: int, rate: float) -> bool:
    """True when this attempt of this item is one of the planned failures (about ``rate``)."""
    digest = zlib.crc32(f"{item_id}#{attempt}".encode())
    return digest < rate * 2**32


class PlannedFailure(Exception):
    """A failed attempt the benchmark asked for: the item is retried after its backoff."""


def make_job(settings: Settings) -> Job:
    """The burst job with ``settings``: a sleeping, sometimes failing handler."""
    job = Job(
        JOB_NAME,
        shards=settings.shards,
        queue=settings.queue,
        batch_size=BATCH_SIZE,
        lease_ttl_seconds=LEASE_TTL,
        max_attempts=MAX_ATTEMPTS,
        backoff_base_seconds=BACKOFF_BASE,
        backoff_cap_seconds=BACKOFF_CAP,
        shard_budget_seconds=SHARD_BUDGET,
        commit_interval_seconds=0.0,
        deadline_after=timedelta(hours=1),
        max_shard_jobs=64,
    )

    @job.planner
    def plan(business_date: date) -> Iterator[Item]:
        """Plans nothing: the benchmark feeds the items over the burst window."""
        return iter(())

    @job.handler
    def handle(item: Item, lease: ActiveLease) -> None:
        """Sleeps the handler latency; then fails the planned fraction of attempts."""
        time.sleep(settings.handler_ms / 1000)
        attempt = lease.lease.attempt
        if fails(item.id, attempt, settings.retry_rate):
            raise PlannedFailure(f"planned failure of attempt {attempt}")

    return job


burst_job = make_job(Settings.from_env())
