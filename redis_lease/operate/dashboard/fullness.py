"""Whether Redis is full, for the banner every page shows and for ``/healthz``.

A Redis whose used memory has reached its ``maxmemory`` under ``noeviction`` refuses every
write (workers' claims and commits, the dashboard's requeue, resume and RQ actions) and
still answers reads, so the pages still show what is stored. It is seen in ``INFO memory``
(on a cluster, any primary's), or in a :class:`~redis_lease.errors.RedisFull` met while
answering. A Redis user without ``INFO`` (the documented reader and admin users) shows the
banner only when a write is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import flask
from redis.cluster import RedisCluster
from redis.exceptions import OutOfMemoryError

from ...errors import RedisLeaseError
from ...protocol.store.lease_store import LeaseStore

#: What to do about a full Redis, as every page and refusal says it.
FULL_ADVICE = "free memory, raise maxmemory, or finish or delete old runs"
#: The policy under which a full Redis refuses writes (any other evicts keys instead).
REFUSING_POLICY = "noeviction"
log = logging.getLogger("redis_lease.dashboard.fullness")  # the name logging configs know


def memory_full(info: Mapping[str, Any]) -> bool:
    """Whether one server's ``INFO memory`` shows it full: used memory at or over a
    ``maxmemory`` that is set, under ``noeviction``."""
    try:
        used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    except (TypeError, ValueError):
        return False
    policy = info.get("maxmemory_policy", "")
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    return 0 < limit <= used and policy == REFUSING_POLICY


def redis_full(store: LeaseStore) -> bool | None:
    """Whether the store's Redis is full (on a cluster: any primary); None when ``INFO``
    cannot be read (refused to this Redis user, or Redis unreachable)."""
    try:
        with store.translating_errors():
            if store.on_cluster:
                reply: Any = store.client.info("memory", target_nodes=RedisCluster.PRIMARIES)
            else:
                reply = store.client.info("memory")
    except RedisLeaseError as error:
        log.debug("INFO memory cannot be read: %s", error)
        return None
    replies = [reply] if "used_memory" in reply else list(reply.values())
    return any(memory_full(one) for one in replies)


def refuse_when_full(store: LeaseStore) -> None:
    """Raises :class:`~redis_lease.errors.RedisFull` when ``INFO memory`` shows the store's
    Redis full: before a change made of steps a full Redis refuses in part.

    RQ's requeue removes a job from its failed registry, then enqueues it: a full Redis
    allows the removal and refuses the rest, and the job would be in neither.
    """
    if redis_full(store):
        refused = OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
        raise store.translating_errors().error(refused)


def met_full() -> None:
    """Notes that Redis refused a call of this request as full (the page's banner shows)."""
    flask.g.redis_full = True


def full_now(store: LeaseStore) -> bool:
    """Whether this request's page shows the banner: a refusal met, else ``INFO memory``
    (read once per request)."""
    known: bool | None = flask.g.get("redis_full")
    if known is None:
        known = bool(redis_full(store))
        flask.g.redis_full = known
    return known


def not_asked() -> None:
    """Notes that Redis is not to be asked this request (it did not answer)."""
    flask.g.redis_full = False
