"""The tick leader's lease on a store, and the one lock of a job's tick, fenced by the
leader's token when a leader ticks.

One worker of a fleet ticks (``redis-lease worker --job``): the one that holds the lease
of ``tick_leader.lua`` (:func:`hold_leadership`). The lease's holder is a worker process's
own id (:func:`process_holder`: its name and an id made when it starts), so two processes
given one name never share it. Each new holder gets a greater fencing token. Its tick
takes each job's lock through ``tick_lock.lua`` (:func:`job_tick_lock`), which refuses an
older token once a newer one took the lock; and between its steps the tick asks
:func:`lead_state`. So a leader paused past its lease, resumed after another took over,
changes nothing more (docs/concepts/tick-leader.md says what it can still do); and a plain
tick (cron, rq-scheduler) takes the same lock through the same script with no token: when
it holds a job's lock it stops the leader's tick of that job, never its leadership.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import redis

from ...limits import WORKER_NAME_MAX, bound
from ..connection.clients import as_text
from ..replies import LeaderLease
from ..validation import clip
from .store_client import StoreBase

#: The longest holder the lease keeps, in UTF-8 bytes (the script's bound on it).
HOLDER_MAX = bound("key_length")[1]
#: What ``tick_lock.lua`` answers: taken, held by another tick, refused for good.
TAKEN, BUSY, STALE = 1, 0, -1
#: What a leader's tick finds before each step (:func:`lead_state`): it leads and holds the
#: job's lock; it leads but another tick (a plain one: cron, rq-scheduler) holds the job's
#: lock, so its tick of that job stops; it no longer leads.
LEADING, LOCK_LOST, NOT_LEADING = "leading", "lock_lost", "not_leading"
#: Between a worker's name and its process's id in the lease's holder.
_ID_MARK = "#"
_PROCESS_ID = re.compile(r"#[0-9a-f]{32}\Z")


@dataclass(frozen=True)
class Leadership:
    """A tick leader's lease as its holder knows it: the holder (its process's id in the
    lease, :func:`process_holder`) and its fencing token."""

    holder: str
    token: int

    @property
    def name(self) -> str:
        """The worker's name, as people see it (:func:`shown_holder`)."""
        return shown_holder(self.holder)


def process_holder(name: str) -> str:
    """A worker process's id in the tick leader's lease: its name (cut to
    :data:`~redis_lease.limits.WORKER_NAME_MAX`) and an id of its own, new for each call, so
    that two processes of one name hold apart."""
    return f"{clip(name, WORKER_NAME_MAX) or '?'}{_ID_MARK}{uuid.uuid4().hex}"


def shown_holder(holder: str) -> str:
    """The worker's name in a lease's holder, for people: the holder without its process's
    id (a holder an earlier release wrote is its name alone)."""
    return holder[: -len(_ID_MARK) - 32] if _PROCESS_ID.search(holder) else holder


def hold_leadership(
    store: StoreBase, holder: str, ttl_ms: int, at_least: int = 1, unticked: str = ""
) -> LeaderLease:
    """Takes the tick leader's lease when it is free (or expired), or renews it when
    ``holder`` holds it, for ``ttl_ms`` on the server's clock; the lease as it is now. Its
    token is at least ``at_least`` when it is held (a floor past a job's fence:
    :func:`fence_floor`). ``unticked``: what the holder says of the declared jobs it does not
    tick (JSON, :func:`redis_lease.protocol.store.declared_jobs.unticked_text`), kept beside
    the lease while it holds it; '' keeps what it said before."""
    with store.translating_errors():
        lease: LeaderLease = store.scripts.call(
            "tick_leader",
            [store.keys.tick_leader],
            [leader_name(holder), "hold", ttl_ms, at_least, unticked],
        )
    return lease


def fence_floor(store: StoreBase, jobs: Iterable[str]) -> int:
    """The least token past every fence of ``jobs``' tick locks: what a leader whose tick
    met a fence ahead of its own token (the lease's hash was lost) asks for."""
    with store.translating_errors():
        fences = [store.client.get(store.keys.job_tick_fence(job)) for job in jobs]
    return max((int(as_text(f)) for f in fences if f is not None), default=0) + 1


def release_leadership(store: StoreBase, holder: str) -> LeaderLease:
    """Frees the tick leader's lease at once when ``holder`` holds it; the lease as it is now."""
    with store.translating_errors():
        lease: LeaderLease = store.scripts.call(
            "tick_leader", [store.keys.tick_leader], [leader_name(holder), "release", 1, 1]
        )
    return lease


@contextmanager
def job_tick_lock(
    store: StoreBase, job: str, ttl_ms: int, leader: Leadership | None = None
) -> Iterator[tuple[int, str]]:
    """Holds the tick lock of job ``job`` for the block, the one lock of a job's tick; yields
    what ``tick_lock.lua`` answered (:data:`TAKEN`; :data:`BUSY`: another tick holds it;
    :data:`STALE`: a newer leader took it) and the lock's owner. A leader's tick is fenced
    by its token; a tick with no leader (``leader`` None: cron, rq-scheduler) takes the lock
    only when it is free, and is never :data:`STALE`. The lock is released through
    ``release_lock.lua``, only while it is still the owner's; releasing is best effort (when
    Redis is gone the lock expires by itself)."""
    owner = f"leader-{leader.token}-{uuid.uuid4().hex}" if leader else uuid.uuid4().hex
    lock_key = store.keys.job_tick_lock(job)
    token = leader.token if leader else ""
    with store.translating_errors():
        taken: int = store.scripts.call(
            "tick_lock", [lock_key, store.keys.job_tick_fence(job)], [owner, token, ttl_ms]
        )
    try:
        yield taken, owner
    finally:
        if taken == TAKEN:
            with suppress(redis.RedisError, OSError):
                store.scripts.call("release_lock", [lock_key], [owner])


def lead_state(
    store: StoreBase, leader: Leadership, job: str = "", owner: str = "", ttl_ms: int = 0
) -> str:
    """What a leader's tick asks before each of its steps: :data:`NOT_LEADING` once the tick
    leader's lease is not ``leader``'s (another holder, or another token); else, when ``job``
    is given, whether that job's tick lock is still ``owner``'s (taken again through
    ``tick_lock.lua``, its time to live ``ttl_ms`` started anew, so a long tick keeps its
    lock): :data:`LEADING`; :data:`LOCK_LOST` when another tick with no newer token holds it
    (a plain tick took it after the lock's time ran out: it changes nothing about who leads);
    :data:`NOT_LEADING` when a newer leader took it."""
    with store.translating_errors():
        holder, token = store.client.hmget(store.keys.tick_leader, ["holder", "token"])
        if as_text(holder) != leader_name(leader.holder) or as_text(token) != str(leader.token):
            return NOT_LEADING
        if not job:
            return LEADING
        kept: int = store.scripts.call(
            "tick_lock",
            [store.keys.job_tick_lock(job), store.keys.job_tick_fence(job)],
            [owner, leader.token, ttl_ms],
        )
    return {TAKEN: LEADING, BUSY: LOCK_LOST}.get(kept, NOT_LEADING)


def still_leading(
    store: StoreBase, leader: Leadership, job: str = "", owner: str = "", ttl_ms: int = 0
) -> bool:
    """True while ``leader`` holds the tick leader's lease with its token and, when ``job`` is
    given, that job's tick lock is still ``owner``'s (:func:`lead_state` says
    :data:`LEADING`)."""
    return lead_state(store, leader, job, owner, ttl_ms) == LEADING


def leader_name(holder: str) -> str:
    """A holder as the lease keeps it (cut to :data:`HOLDER_MAX` bytes)."""
    return clip(holder, HOLDER_MAX) or "?"
