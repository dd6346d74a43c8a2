"""The demo job: nightly payment reconciliation, one item per account and cursor.

Each item reconciles one account's provider cursor for the business date: the
handler asks the provider to apply the correction under an idempotency key
derived from the item (never from the token), then commits the provider's
reference under the lease. Settings come from the environment so that every
worker process of a demo sees the same job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import date
from typing import Any

from redis_lease.demo.ledger import Ledger
from redis_lease.jobs import Job
from redis_lease.lease import Item
from redis_lease.worker import ActiveLease

ITEMS = int(os.environ.get("REDIS_LEASE_DEMO_ITEMS", "2000"))
PROVIDER_LATENCY = float(os.environ.get("REDIS_LEASE_DEMO_LATENCY", "0.004"))

reconcile = Job(
    "payment-reconciliation",
    shards=int(os.environ.get("REDIS_LEASE_DEMO_SHARDS", "8")),
    lease_ttl=float(os.environ.get("REDIS_LEASE_DEMO_TTL", "2")),
    max_attempts=5,
    backoff_base=0.2,
    backoff_cap=2.0,
    deadline=os.environ.get("REDIS_LEASE_DEMO_DEADLINE", "50s"),
    schedule="0 2 * * *",
    timezone="UTC",
    shard_budget=20.0,
    batch_size=10,
    max_workers=12,
    queue=os.environ.get("REDIS_LEASE_DEMO_QUEUE", "redis-lease-demo"),
)


@reconcile.planner
def plan(business_date: date) -> Iterator[Item]:
    """One item per account and provider cursor."""
    for n in range(ITEMS):
        yield Item(
            f"acct_{n}:cursor_{n % 7}:{business_date.isoformat()}",
            {"account": n, "cursor": n % 7, "amount_cents": (n * 37) % 10_000},
        )


def idempotency_key(run_id: str, item_id: str, effect: str) -> str:
    """The provider-side key of an effect: job, business date, item and effect name."""
    return f"{run_id}:{item_id}:{effect}"


@reconcile.handler
def handle(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Applies the item's correction at the provider, once per idempotency key."""
    ledger = Ledger(lease.store.client, lease.store.prefix)
    time.sleep(PROVIDER_LATENCY)  # the provider call's latency
    reference, applied = ledger.apply(idempotency_key(lease.run_id, item.id, "correction"))
    return {"reference": reference, "applied_now": applied}
