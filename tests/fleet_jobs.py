"""Jobs for the fleet, tick, scheduler and SIGTERM tests, found by import path.

Worker processes import this module by path (``tests.fleet_jobs:fleet``), so
the :data:`fleet` job takes its settings from environment variables that the
test passes to the worker processes (options are fixed at import):

- ``FLEET_QUEUE`` the RQ queue, ``FLEET_ITEMS`` item count, ``FLEET_SHARDS``,
  ``FLEET_TTL`` lease seconds, ``FLEET_BATCH`` claim batch, ``FLEET_BUDGET``
  shard budget, ``FLEET_DELAY`` handler seconds per item;
- ``FLEET_SLOW_ITEM`` and ``FLEET_SLOW_SECONDS``: one item whose handler takes
  longer, so that a test can catch a worker inside it; with ``FLEET_SLOW_HOLD=1``
  the first start of that item waits instead until the test releases it
  (:func:`release_slow`), so the test catches it there whatever the machine's speed;
- ``FLEET_SCHEDULE``, ``FLEET_GRACE``: the cron schedule and catch-up grace.

The handler counts its effect per item in ``<prefix>:fleet:effects`` (a hash
under the store's prefix) and records every start of the slow item, with the
process id, in ``<prefix>:fleet:started:<item>`` (a list).

:data:`nightly` is for in-process tick tests: they replace its options with
``monkeypatch`` and steer its planner through :data:`PLAN`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.protocol.leases import Item

ITEMS = int(os.environ.get("FLEET_ITEMS", "20"))
DELAY = float(os.environ.get("FLEET_DELAY", "0"))
SLOW_ITEM = os.environ.get("FLEET_SLOW_ITEM", "")
SLOW_SECONDS = float(os.environ.get("FLEET_SLOW_SECONDS", "1"))
SLOW_HOLD = os.environ.get("FLEET_SLOW_HOLD", "") == "1"
#: How long a held start waits for the test at most (a test that failed never releases it).
HOLD_LIMIT = 300

fleet = Job(
    "fleet",
    shards=int(os.environ.get("FLEET_SHARDS", "4")),
    lease_ttl_seconds=float(os.environ.get("FLEET_TTL", "5")),
    batch_size=int(os.environ.get("FLEET_BATCH", "10")),
    shard_budget_seconds=float(os.environ.get("FLEET_BUDGET", "30")),
    max_attempts=10,
    backoff_base_seconds=0.1,
    backoff_cap_seconds=0.5,
    deadline_after=timedelta(minutes=10),
    # 29 February only: no run of this job falls due by itself while a test runs.
    schedule=os.environ.get("FLEET_SCHEDULE", "0 0 29 2 *"),
    catch_up="latest",
    catch_up_grace_seconds=float(os.environ.get("FLEET_GRACE", "900")),
    max_shard_jobs=16,
    queue=os.environ.get("FLEET_QUEUE", "rltest-fleet"),
)


def item_id(n: int) -> str:
    """The id of the fleet job's item number ``n``."""
    return f"item-{n:04d}"


def effects_key(prefix: str) -> str:
    """The hash of effect counts per item id."""
    return f"{prefix}:fleet:effects"


def started_key(prefix: str, item: str) -> str:
    """The list of process ids that started the handler of ``item``."""
    return f"{prefix}:fleet:started:{item}"


def go_key(prefix: str, item: str) -> str:
    """The list that releases the held first start of ``item``."""
    return f"{prefix}:fleet:go:{item}"


def release_slow(client: Any, prefix: str, item: str) -> None:
    """Lets the held first start of ``item`` go on (see ``FLEET_SLOW_HOLD``)."""
    client.rpush(go_key(prefix, item), "go")


@fleet.planner
def plan_fleet(business_date: date) -> Iterator[Item]:
    """``FLEET_ITEMS`` items."""
    for n in range(ITEMS):
        yield Item(item_id(n), {"n": n, "date": business_date.isoformat()})


@fleet.handler
def handle_fleet(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Counts the effect, works a while, and answers with its process and token."""
    client = lease.store.client
    prefix = lease.store.prefix
    client.hincrby(effects_key(prefix), item.id, 1)
    if item.id == SLOW_ITEM:
        starts = client.rpush(started_key(prefix, item.id), os.getpid())
        if SLOW_HOLD and starts == 1:  # the first start waits for the test
            _wait_for_release(client, go_key(prefix, item.id))
        else:
            time.sleep(SLOW_SECONDS)
    elif DELAY:
        time.sleep(DELAY)
    return {"pid": os.getpid(), "token": lease.token}


def _wait_for_release(client: Any, key: str) -> None:
    """Waits until ``key`` gets an entry, in short blocking reads (within the socket
    timeout), ``HOLD_LIMIT`` seconds at most."""
    ends = time.monotonic() + HOLD_LIMIT
    while time.monotonic() < ends and client.blpop([key], timeout=5) is None:
        pass


class PlannerCrash(BaseException):
    """Stands for the planner's process dying: not an error a planner reports."""


#: The nightly job's planner settings: item count, and where it raises or crashes.
PLAN: dict[str, int | None] = {"items": 4, "fail_after": None, "crash_after": None}

nightly = Job(
    "nightly",
    shards=2,
    lease_ttl_seconds=30,
    schedule="0 2 * * *",
    timezone="UTC",
    deadline_after=timedelta(hours=6),
    catch_up="all",
    catch_up_days=7,
    catch_up_grace_seconds=900,
    max_shard_jobs=4,
    queue="rltest-nightly",
)


@nightly.planner
def plan_nightly(business_date: date) -> Iterator[Item]:
    """``PLAN['items']`` items; raises after ``fail_after``, crashes after ``crash_after``."""
    count = PLAN["items"] or 0
    for n in range(count):
        if PLAN["fail_after"] is not None and n == PLAN["fail_after"]:
            raise RuntimeError("the ledger export is missing")
        if PLAN["crash_after"] is not None and n == PLAN["crash_after"]:
            raise PlannerCrash()
        yield Item(f"night-{n:05d}", {"n": n})


@nightly.handler
def handle_nightly(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Does nothing (the tick tests run no workers)."""
    return {"n": item.payload["n"] if isinstance(item.payload, dict) else None}
