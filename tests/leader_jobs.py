"""Jobs of the tick leader's tests, found by import path (tests/test_tick_leader*.py).

:data:`scheduled` takes its settings from environment variables the test passes to the
worker processes (options are fixed at import): ``LEADER_SCHEDULE`` its cron schedule
(six fields, the last the second, so that a run falls due seconds after the workers
start), ``LEADER_QUEUE`` its RQ queue. It catches up nothing (``catch_up="none"``): a
new job's first tick creates no run for yesterday's time, only the one due next. Its
handler counts each item's effect in ``<prefix>:leader:effects`` (a hash).

:data:`bare` has a planner and no handler: a worker refuses to tick it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.jobs.live_lease import ActiveLease
from redis_lease.protocol.leases import Item

#: Items of each run.
ITEMS = 6

scheduled = Job(
    "scheduled",
    shards=2,
    lease_ttl_seconds=5,
    schedule=os.environ.get("LEADER_SCHEDULE", "0 0 29 2 *"),
    timezone="UTC",
    deadline_after=timedelta(minutes=10),
    catch_up="none",
    catch_up_grace_seconds=120,
    max_shard_jobs=2,
    shard_budget_seconds=5,
    queue=os.environ.get("LEADER_QUEUE", "rltest-leader"),
)


def effects_key(prefix: str) -> str:
    """The hash of effect counts per item id."""
    return f"{prefix}:leader:effects"


@scheduled.planner
def plan(business_date: date) -> Iterator[Item]:
    """:data:`ITEMS` items."""
    for n in range(ITEMS):
        yield Item(f"item-{n}", {"n": n})


@scheduled.handler
def handle(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Counts the item's effect."""
    lease.store.client.hincrby(effects_key(lease.store.prefix), item.id, 1)
    return {"pid": os.getpid()}


bare = Job("bare", schedule="0 0 29 2 *")


@bare.planner
def plan_bare(business_date: date) -> Iterator[Item]:
    """One item, which no handler works."""
    yield Item("only", {})


#: Holds :data:`stuck`'s planner until a test sets it (a planner that hangs on I/O).
STUCK = threading.Event()

stuck = Job("stuck", schedule="* * * * *", timezone="UTC", queue="rltest-leader-stuck")


@stuck.planner
def plan_stuck(business_date: date) -> Iterator[Item]:
    """Waits for :data:`STUCK` (30 s at most), then one item."""
    STUCK.wait(30)
    yield Item("item-0", {})


stuck.handler(handle)


#: A second job of this module: a worker that declares it beside :data:`scheduled` gets it
#: ticked by a leader given only :data:`scheduled` (the leader has this module loaded).
other = Job(
    "other",
    shards=1,
    schedule="0 0 29 2 *",
    timezone="UTC",
    queue=os.environ.get("LEADER_QUEUE", "rltest-leader"),
)
other.planner(plan)
other.handler(handle)
