"""Seat holds and their cleanup job: release a seat only if its hold is still expired.

A hold is a Redis hash ``<prefix>:hold:<id>`` with ``state`` (held | released),
``course``, ``seat``, ``expires_at`` (ms) and ``version``. Learners renew holds
(new ``expires_at``, ``version`` + 1). The cleanup run gets one item per message
"hold H expired at E with version V"; messages may repeat. Its handler treats a
message as a request to check current state: it re-reads the hold and releases
the seat with a guarded commit (the hold is still held, at the same version and
expiry), so a hold renewed after the message was queued is never released, and
a repeated message finds the work already done.

Settings come from the environment (``RESERVATIONS_PREFIX``) so that every
worker process sees the same job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import redis

from redis_lease import ActiveLease, FieldEquals, HandlerResult, Item, Job, Write

PREFIX = os.environ.get("RESERVATIONS_PREFIX", "seats")

cleanup = Job(
    "seat-cleanup",
    shards=4,
    lease_ttl_seconds=5.0,
    max_attempts=5,
    backoff_base_seconds=0.1,
    backoff_cap_seconds=1.0,
    deadline_after=timedelta(minutes=5),
    shard_budget_seconds=30.0,
    batch_size=10,
    queue=os.environ.get("RESERVATIONS_QUEUE", "seat-cleanup"),
)


def hold_key(hold_id: str) -> str:
    """The hash of one hold."""
    return f"{PREFIX}:hold:{hold_id}"


def seats_key(course: str, kind: str) -> str:
    """The set of a course's seats that are ``held`` or ``free``."""
    return f"{PREFIX}:course:{course}:{kind}"


def messages_key() -> str:
    """The queued cleanup messages the planner reads (a list of JSON messages)."""
    return f"{PREFIX}:messages"


def server_ms(client: redis.Redis) -> int:
    """The Redis server's clock in ms."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@cleanup.planner
def plan(business_date: date) -> Iterator[Item]:
    """One item per queued message, read from Redis in pages of 500."""
    client = redis.Redis.from_url(os.environ["RESERVATIONS_REDIS_URL"])
    try:
        start = 0
        while page := client.lrange(messages_key(), start, start + 499):
            for raw in page:
                message = json.loads(raw)
                yield Item(message["msg"], message)
            start += len(page)
    finally:
        client.close()


def _text(hold: dict[Any, Any], name: str) -> str:
    value = hold.get(name.encode(), hold.get(name, b""))
    return value.decode() if isinstance(value, bytes) else str(value)


@cleanup.handler
def handle(item: Item, lease: ActiveLease) -> HandlerResult:
    """Re-reads the hold, then releases it only if it is still expired at the same version."""
    client = lease.store.client
    message = item.payload
    key = hold_key(message["hold"])
    hold = client.hgetall(key)
    if not hold or _text(hold, "state") != "held":
        return HandlerResult({"outcome": "already_handled"}, label="already_handled")
    version, expires = _text(hold, "version"), _text(hold, "expires_at")
    if version != message["version"] or expires != message["expires_at"]:
        return HandlerResult({"outcome": "renewed", "version": version}, label="renewed")
    if int(expires) > server_ms(client):
        return HandlerResult({"outcome": "renewed", "version": version}, label="renewed")
    course, seat = _text(hold, "course"), _text(hold, "seat")
    return HandlerResult(
        {"outcome": "released", "seat": seat},
        conditions=(
            FieldEquals(key, "state", "held"),
            FieldEquals(key, "version", version),
            FieldEquals(key, "expires_at", expires),
        ),
        writes=(
            Write.hset(key, {"state": "released", "released_by": item.id}),
            Write.srem(seats_key(course, "held"), [seat]),
            Write.sadd(seats_key(course, "free"), [seat]),
        ),
        label="released",
    )
