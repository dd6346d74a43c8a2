"""The store an RQ job of this project works on, in a worker process.

By default it is RQ's own Redis (the job's connection): lease state and queues
share one server. A worker started with a queue URL of its own (RQ on a plain
Redis, the lease state on a cluster) names the lease store's URL here with
:func:`use_lease_url`; its jobs, forked or not, then open that store, with
RQ's connection for what they enqueue.
"""

from __future__ import annotations

import redis

from ..limits import DEFAULT_PREFIX
from ..protocol.connection.clients import client_from_url, describe, resilient
from ..protocol.store.lease_store import LeaseStore

_lease_url: str | None = None


def use_lease_url(url: str | None) -> None:
    """The lease store's URL for this process's jobs (None: RQ's own Redis)."""
    global _lease_url
    _lease_url = url


def job_store(rq_connection: redis.Redis, prefix: str = DEFAULT_PREFIX) -> LeaseStore:
    """A store of the job's own, whose connections retry (:func:`~.connection.resilient`).

    Close it with :meth:`LeaseStore.close` when the job ends; RQ's connection is left open.
    """
    rq_client = resilient(rq_connection)
    if _lease_url is None:
        return LeaseStore(rq_client, prefix=prefix, url=describe(rq_client))
    try:
        client = client_from_url(_lease_url)
    except BaseException:
        if rq_client is not rq_connection:
            rq_client.close()
        raise
    return LeaseStore(client, prefix=prefix, url=_lease_url, rq_client=rq_client)


def close_job_store(store: LeaseStore, rq_connection: redis.Redis) -> None:
    """Closes what :func:`job_store` opened, not RQ's own connection."""
    if store.client is not rq_connection:
        store.client.close()
    if store.rq is not rq_connection and store.rq is not store.client:
        store.rq.close()
