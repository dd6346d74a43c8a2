"""The demo job: nightly payment reconciliation, one item per account and cursor.

Each item reconciles one account's provider cursor for the business date. The
handler takes one of the provider's fleet-wide slots, then applies the
correction as a fenced effect: the idempotency key comes from the run and the
item (never the token), an earlier ambiguous attempt is reconciled by a lookup
before anything is re-sent, and the provider's reference is committed under
the lease. Settings come from the environment so that every worker process of
a run sees the same job.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import date
from functools import cache
from typing import Any

from redis_lease.demo.provider import ProviderClient
from redis_lease.fleet.effects.provider_gate import ProviderGate
from redis_lease.fleet.jobs.job import Job, parse_duration
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.protocol.leases import Item

ITEMS = int(os.environ.get("REDIS_LEASE_DEMO_ITEMS", "2000"))
PROVIDER_URL = os.environ.get("REDIS_LEASE_DEMO_PROVIDER", "http://127.0.0.1:8700")
PROVIDER_TIMEOUT = float(os.environ.get("REDIS_LEASE_DEMO_PROVIDER_TIMEOUT", "1.0"))
PROVIDER_CAP = int(os.environ.get("REDIS_LEASE_DEMO_PROVIDER_CAP", "16"))
HONOURS_KEYS = os.environ.get("REDIS_LEASE_DEMO_HONOURS_KEYS", "1") == "1"

reconcile = Job(
    "payment-reconciliation",
    shards=int(os.environ.get("REDIS_LEASE_DEMO_SHARDS", "8")),
    lease_ttl_seconds=float(os.environ.get("REDIS_LEASE_DEMO_TTL", "2")),
    max_attempts=8,
    backoff_base_seconds=0.2,
    backoff_cap_seconds=2.0,
    deadline_after=parse_duration(os.environ.get("REDIS_LEASE_DEMO_DEADLINE", "50s")),
    schedule="0 2 * * *",
    timezone="UTC",
    shard_budget_seconds=20.0,
    batch_size=10,
    max_shard_jobs=12,
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


@cache
def provider() -> ProviderClient:
    """The provider's client (one per process)."""
    return ProviderClient(PROVIDER_URL, timeout=PROVIDER_TIMEOUT)


@reconcile.handler
def handle(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Applies the item's correction at the provider at most once per idempotency key."""
    client = provider()
    gate = ProviderGate(lease.store, "payments-provider", max_concurrency=PROVIDER_CAP)
    with gate.slot(wait=lease.ttl / 2):
        record = lease.effect(
            "correction",
            lambda key: client.apply(key, item.payload),
            lookup=client.lookup,
            honours_keys=HONOURS_KEYS,
        )
    return {"reference": record["id"]}
