"""The jobs behind the dashboard's browser tests, imported by path by the worker processes.

:data:`settlement` settles 60 accounts over 6 shards through a provider gate: every
fifth account fails once with a provider timeout and then succeeds; every ninth fails
once and is then refused for good (it goes dead after two attempts, both in its
attempt log with their trace ids). :data:`hold` has one item whose handler waits until
the test sets :func:`release_key`, so that a worker stays busy while the test looks.
The tests run on a private Redis, so the names and queues here are fixed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

from redis_lease.errors import PermanentError
from redis_lease.fleet.effects.provider_gate import ProviderGate
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.protocol.leases import Item

SETTLEMENT_PATH = "tests.browser.jobs:settlement"
HOLD_PATH = "tests.browser.jobs:hold"
ACCOUNTS = 60
#: The longest the held item's handler waits for its release.
HOLD_SECONDS = 300.0

settlement = Job(
    "settlement",
    shards=6,
    lease_ttl_seconds=10,
    batch_size=4,
    max_attempts=5,
    backoff_base_seconds=0.1,
    backoff_cap_seconds=0.3,
    deadline_after=timedelta(minutes=30),
    # 29 February only: no run falls due by itself while a test runs.
    schedule="0 0 29 2 *",
    catch_up="latest",
    max_shard_jobs=8,
    queue="dash-settlement",
)

hold = Job(
    "hold",
    shards=1,
    lease_ttl_seconds=10,
    deadline_after=timedelta(minutes=30),
    schedule="0 0 29 2 *",
    catch_up="latest",
    queue="dash-hold",
)


def account(n: int) -> str:
    """The item id of account ``n`` (ids may hold ':', which URLs must quote)."""
    return f"acct:eu-{n:04d}"


def retried(n: int) -> bool:
    """Accounts that fail once with a provider timeout, then succeed."""
    return n % 5 == 1


def refused(n: int) -> bool:
    """Accounts that fail once, then are refused for good (they end dead)."""
    return n % 9 == 4


def release_key(prefix: str) -> str:
    """The key whose existence lets the held item's handler return."""
    return f"{prefix}:hold:release"


@settlement.planner
def plan_settlement(business_date: date) -> Iterator[Item]:
    """One item per account."""
    for n in range(ACCOUNTS):
        yield Item(account(n), {"n": n, "date": business_date.isoformat()})


@settlement.handler
def settle(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Settles one account through the acquirer's gate (at most 4 calls in flight)."""
    n = int(item.payload["n"])
    attempt = lease.lease.attempt
    with ProviderGate(lease.store, "acquirer", 4).slot():
        time.sleep(0.02)
        if (retried(n) or refused(n)) and attempt == 1:
            raise RuntimeError("provider 503: upstream timeout")
        if refused(n):
            raise PermanentError("acquirer refused: account closed")
    return {"settled": n, "token": lease.token}


@hold.planner
def plan_hold(business_date: date) -> Iterator[Item]:
    """One item."""
    yield Item("ledger-export", {"date": business_date.isoformat()})


@hold.handler
def wait_for_release(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Keeps its worker busy until the test sets the release key."""
    client = lease.store.client
    deadline = time.monotonic() + HOLD_SECONDS
    while not client.exists(release_key(lease.store.prefix)):
        if time.monotonic() > deadline:
            raise RuntimeError("never released")
        time.sleep(0.05)
    return {"released": True}
