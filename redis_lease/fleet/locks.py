"""A lock for one tick or one planner: a key set only if absent, deleted only by its owner.

The key holds a random owner token with a TTL, so a holder that dies frees it by
expiry; it is released through the ``release_lock`` script, which deletes it
only while it still holds the owner's token (a lock that expired and was taken
by another is left alone). The release goes through :meth:`Scripts.call`, so a
``SCRIPT FLUSH`` costs a reload, not a lock held until its TTL runs out.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from ..protocol.store.lease_store import LeaseStore


@contextlib.contextmanager
def lock(store: LeaseStore, key: str, ttl_ms: int, run_id: str | None = None) -> Iterator[bool]:
    """Holds ``key`` for the block when it is free; yields whether it was taken.

    Taking it raises the library's error when Redis fails; releasing it is best
    effort (when Redis is gone the key expires by itself, and the block's own
    error is the one that matters).
    """
    owner = uuid.uuid4().hex
    with store.translating_errors(run_id):
        taken = bool(store.client.set(key, owner, nx=True, px=ttl_ms))
        if not taken:
            # the client resends a command whose reply a reset lost: the first SET may
            # have landed, and then the lock is ours
            taken = store.client.get(key) in (owner, owner.encode())
    try:
        yield taken
    finally:
        if taken:
            with contextlib.suppress(redis.RedisError, OSError):
                store.scripts.call("release_lock", [key], [owner])
