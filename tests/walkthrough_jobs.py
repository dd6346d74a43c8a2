"""The job of the 3 a.m. walk-through (docs/how-to/at-3am.md): a payment reconciliation
over twenty accounts, one of which fails on every attempt."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date

from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.protocol.leases import Item

RUN = "payment-reconciliation:2026-12-02"
BROKEN = "acct_0013"
ERROR = "bank gateway 502: upstream timed out"

payments = Job(
    "payment-reconciliation",
    shards=2,
    max_attempts=3,
    backoff_base_seconds=0.02,
    backoff_cap_seconds=0.05,
    schedule="0 0 29 2 *",  # 29 February only: nothing falls due while a test runs
    queue="rltest-walkthrough",
)


@payments.planner
def plan_accounts(business_date: date) -> Iterator[Item]:
    """Twenty accounts."""
    for n in range(1, 21):
        yield Item(f"acct_{n:04d}", {"account": n, "date": business_date.isoformat()})


@payments.handler
def reconcile(item: Item, lease: ActiveLease) -> dict[str, int]:
    """Reconciles an account; one of them fails on every attempt."""
    if item.id == BROKEN:
        raise RuntimeError(ERROR)
    return {"account": item.payload["account"]}
