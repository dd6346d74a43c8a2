"""The tick leader's lease on a store, and the lock of one job's tick fenced by its token.

One worker of a fleet ticks (``redis-lease worker --job``): the one that holds the lease
of ``tick_leader.lua`` (:func:`hold_leadership`). Each new holder gets a greater fencing
token. Its tick takes each job's lock through ``tick_lock.lua`` (:func:`fenced_lock`),
which refuses an older token once a newer one took the lock; and between its steps the
tick asks :func:`still_leading`. So a leader paused past its lease, resumed after another
took over, changes nothing more (docs/concepts/tick-leader.md says what it can still do).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import redis

from ...limits import bound
from ..connection.clients import as_text
from ..replies import LeaderLease
from ..validation import clip
from .base import StoreBase

#: The longest holder name the lease keeps, in UTF-8 bytes (longer names are cut).
NAME_MAX = bound("key_length")[1]
#: What ``tick_lock.lua`` answers: taken, held by another tick, refused for good.
TAKEN, BUSY, STALE = 1, 0, -1


@dataclass(frozen=True)
class Leadership:
    """A tick leader's lease as its holder knows it: its name and its fencing token."""

    name: str
    token: int


def hold_leadership(store: StoreBase, name: str, ttl_ms: int, at_least: int = 1) -> LeaderLease:
    """Takes the tick leader's lease when it is free (or expired), or renews it when ``name``
    holds it, for ``ttl_ms`` on the server's clock; the lease as it is now. Its token is at
    least ``at_least`` when it is held (a floor past a job's fence: :func:`fence_floor`)."""
    with store.translating_errors():
        lease: LeaderLease = store.scripts.call(
            "tick_leader",
            [store.keys.tick_leader],
            [leader_name(name), "hold", ttl_ms, at_least],
        )
    return lease


def fence_floor(store: StoreBase, jobs: Iterable[str]) -> int:
    """The least token past every fence of ``jobs``' tick locks: what a leader whose tick
    met a fence ahead of its own token (the lease's hash was lost) asks for."""
    with store.translating_errors():
        fences = [store.client.get(store.keys.job_tick_fence(job)) for job in jobs]
    return max((int(as_text(f)) for f in fences if f is not None), default=0) + 1


def release_leadership(store: StoreBase, name: str) -> LeaderLease:
    """Frees the tick leader's lease at once when ``name`` holds it; the lease as it is now."""
    with store.translating_errors():
        lease: LeaderLease = store.scripts.call(
            "tick_leader", [store.keys.tick_leader], [leader_name(name), "release", 1, 1]
        )
    return lease


@contextmanager
def fenced_lock(
    store: StoreBase, job: str, leader: Leadership, ttl_ms: int
) -> Iterator[tuple[int, str]]:
    """Holds the tick lock of job ``job`` for the block, fenced by the leader's token; yields
    what ``tick_lock.lua`` answered (:data:`TAKEN`, :data:`BUSY`: another tick holds it,
    :data:`STALE`: a newer leader took it) and the lock's owner."""
    owner = f"leader-{leader.token}-{uuid.uuid4().hex}"
    lock_key = store.keys.job_tick_lock(job)
    with store.translating_errors():
        taken: int = store.scripts.call(
            "tick_lock", [lock_key, store.keys.job_tick_fence(job)], [owner, leader.token, ttl_ms]
        )
    try:
        yield taken, owner
    finally:
        if taken == TAKEN:
            with suppress(redis.RedisError, OSError):
                store.scripts.call("release_lock", [lock_key], [owner])


def still_leading(
    store: StoreBase, leader: Leadership, job: str = "", owner: str = "", ttl_ms: int = 0
) -> bool:
    """True while ``leader`` holds the tick leader's lease with its token and, when ``job`` is
    given, that job's tick lock is still ``owner``'s (taken again through ``tick_lock.lua``,
    its time to live ``ttl_ms`` started anew, so a long tick keeps its lock): what a
    leader's tick asks before each of its steps."""
    with store.translating_errors():
        holder, token = store.client.hmget(store.keys.tick_leader, ["holder", "token"])
        if as_text(holder) != leader_name(leader.name) or as_text(token) != str(leader.token):
            return False
        if not job:
            return True
        kept: int = store.scripts.call(
            "tick_lock",
            [store.keys.job_tick_lock(job), store.keys.job_tick_fence(job)],
            [owner, leader.token, ttl_ms],
        )
    return kept == TAKEN


def leader_name(name: str) -> str:
    """A worker's name as the lease keeps it (cut to :data:`NAME_MAX` bytes)."""
    return clip(name, NAME_MAX) or "?"
