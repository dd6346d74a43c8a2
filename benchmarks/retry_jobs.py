"""The job of ``benchmarks/retries.py``, imported by its ``redis-lease worker --job`` processes.

``retry_job`` plans ``RETRY_BENCH_ITEMS`` items over ``RETRY_BENCH_SHARDS`` shards; its
handler sleeps ``RETRY_BENCH_SLEEP_MS`` and, on the first attempt of a deterministic
``RETRY_BENCH_ERROR_PCT`` per cent of the items (by a hash of the id), raises a plain
exception: a transient error, retried after ``backoff_base_seconds``
(``RETRY_BENCH_BACKOFF``). For those items it writes, into the hash
``RETRY_BENCH_KEY`` on ``RETRY_BENCH_URL``, when each attempt started and when the
failed one raised (this machine's clock in ms, ``<item>:fail`` and ``<item>:<attempt>``),
so the benchmark can tell how long a retried item waited.

Its schedule (00:00 UTC every day, catch-up ``latest``) has always passed when a
worker starts, so the tick leader's first tick creates, plans and dispatches the day's
run at once, as it does for a job deployed during the day.

The module imports only redis-lease's public names, so the reference revision's
workers import it as well: ``benchmarks/retries.py`` copies it into a folder of its
own and starts the workers there, as ``retry_jobs:retry_job``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from datetime import date
from typing import Any

import redis

from redis_lease import ActiveLease, Item, Job

ITEMS_ENV = "RETRY_BENCH_ITEMS"
SHARDS_ENV = "RETRY_BENCH_SHARDS"
SLEEP_MS_ENV = "RETRY_BENCH_SLEEP_MS"
ERROR_PCT_ENV = "RETRY_BENCH_ERROR_PCT"
BACKOFF_ENV = "RETRY_BENCH_BACKOFF"
URL_ENV = "RETRY_BENCH_URL"
KEY_ENV = "RETRY_BENCH_KEY"
JOB_NAME = "retries"

retry_job = Job(
    JOB_NAME,
    shards=int(os.environ.get(SHARDS_ENV, "6")),
    backoff_base_seconds=float(os.environ.get(BACKOFF_ENV, "1")),
    schedule="0 0 * * *",
    timezone="UTC",
)

_SLEEP = float(os.environ.get(SLEEP_MS_ENV, "5")) / 1000
_client: Any = None


class TransientError(Exception):
    """A plain exception: the worker fails the attempt and the item is retried."""


def item_ids(items: int) -> list[str]:
    """The ids the planner yields."""
    return [f"item-{n:05d}" for n in range(items)]


def failing(items: int, error_pct: float) -> frozenset[str]:
    """The items whose first attempt raises: ``error_pct`` per cent of them (rounded), the
    ones with the lowest SHA-256 of their id, so spread over the shards at random but the
    same in every round and revision."""
    ids = sorted(item_ids(items), key=lambda i: hashlib.sha256(i.encode()).digest())
    return frozenset(ids[: round(items * error_pct / 100)])


_FAILING = failing(
    int(os.environ.get(ITEMS_ENV, "3000")), float(os.environ.get(ERROR_PCT_ENV, "0"))
)


def _record(field: str) -> None:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ[URL_ENV])
    _client.hset(os.environ[KEY_ENV], field, int(time.time() * 1000))


@retry_job.planner
def plan(business_date: date) -> Iterator[Item]:
    """``RETRY_BENCH_ITEMS`` items with a tiny payload."""
    for number, item_id in enumerate(item_ids(int(os.environ.get(ITEMS_ENV, "3000")))):
        yield Item(item_id, {"n": number})


@retry_job.handler
def handle(item: Item, lease: ActiveLease) -> None:
    """Sleeps; the first attempt of a chosen item raises after its sleep."""
    chosen = item.id in _FAILING
    if chosen:
        _record(f"{item.id}:{lease.lease.attempt}")
    time.sleep(_SLEEP)
    if chosen and lease.lease.attempt <= 1:
        _record(f"{item.id}:fail")
        raise TransientError(f"transient error on the first attempt of {item.id}")
