"""What the RQ views and actions share: RQ's Redis, its errors translated, and the queues
and registries a URL may name (404 for others)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from flask import current_app

from ...errors import NotFound
from ...protocol.connection.urls import safe_url
from ...protocol.store.lease_store import LeaseStore
from . import rq_data, rq_jobs

#: Where the RQ views are mounted.
RQ_PREFIX = "/rq"


def store() -> LeaseStore:
    """The dashboard's store."""
    found: LeaseStore = current_app.extensions["redis_lease_store"]
    return found


@contextmanager
def reading() -> Iterator[redis.Redis]:
    """RQ's Redis (the store's, or its queue URL's on a cluster), what it raises translated
    into the library's errors (an unreachable Redis is a 503 page)."""
    with store().translating_errors():
        yield store().rq


def location() -> str:
    """Where RQ's data is, for the pages: the store's URL masked, or on a cluster (RQ on
    the queue URL's Redis) that Redis's address, never its password."""
    lease_store = store()
    if lease_store.rq is lease_store.client:
        return safe_url(lease_store.url)
    options = lease_store.rq.connection_pool.connection_kwargs
    if options.get("path"):
        return f"unix://{options['path']}?db={options.get('db', 0)}"
    return f"redis://{options.get('host', '?')}:{options.get('port', '?')}/{options.get('db', 0)}"


def known_registry(registry: str) -> str:
    """``registry`` when it is one the pages show; NotFound (404) otherwise."""
    if registry not in rq_data.REGISTRY_KEYS:
        names = ", ".join(rq_data.REGISTRIES)
        raise NotFound(f"no RQ registry {registry!r}: one of {names}")
    return registry


def known_queue(conn: redis.Redis, name: str) -> rq_data.QueueCounts:
    """The queue ``name`` with its counts; NotFound (404) when RQ knows no such queue."""
    found = rq_data.queue_counts(conn, name)
    if found is None:
        raise NotFound(f"no RQ queue {name!r}: it is not in RQ's list of queues and holds no jobs")
    return found


def known_job(conn: redis.Redis, job_id: str) -> rq_jobs.RqJob:
    """The job ``job_id``; NotFound (404) when it is not in Redis."""
    job = rq_jobs.read_job(conn, job_id)
    if job is None:
        raise NotFound(f"no RQ job {job_id!r}: it has expired or was deleted, or never was")
    return job
