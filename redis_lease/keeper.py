"""The lease a handler works under, and the thread that keeps it renewed.

A :class:`LeaseKeeper` renews every held lease (conditional on its token) and
beats a shard job's heartbeat; a lease that cannot be renewed is marked lost, so
the handler can see :attr:`ActiveLease.lost` and stop early.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import redis

from .connection import redis_errors
from .effects import apply_effect
from .errors import LeaseLost, RedisLeaseError
from .lease import Lease
from .store import LeaseStore

log = logging.getLogger("redis_lease.worker")


class ActiveLease:
    """The lease a handler works under: renewed in the background, and it can be lost.

    Attributes:
        lease: the current Lease (its expiry moves as it is renewed).
    """

    def __init__(self, store: LeaseStore, lease: Lease, ttl: float) -> None:
        self.store = store
        self.lease = lease
        self.ttl = ttl
        self._lost = threading.Event()

    @property
    def token(self) -> int:
        """The fencing token."""
        return self.lease.token

    @property
    def run_id(self) -> str:
        """The run."""
        return self.lease.run_id

    @property
    def item_id(self) -> str:
        """The item."""
        return self.lease.item_id

    @property
    def lost(self) -> bool:
        """True once a renewal was refused: stop early; a commit will be refused anyway."""
        return self._lost.is_set()

    def mark_lost(self) -> None:
        """Marks the lease lost (the keeper does this when a renewal is refused)."""
        self._lost.set()

    def wait_lost(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for the lease to be lost; True if it was."""
        return self._lost.wait(timeout)

    def effect(
        self,
        name: str,
        call: Callable[[str], Any],
        *,
        lookup: Callable[[str], Any] | None = None,
        honours_keys: bool = False,
    ) -> Any:
        """Applies an external effect at most once per idempotency key (see effects.apply_effect).

        ``call`` gets the key (``<run>|<item>|<name>``) and returns the
        provider's result; an ambiguous earlier attempt is reconciled first.
        """
        return apply_effect(
            self.store, self.lease, name, call, lookup=lookup, honours_keys=honours_keys
        )

    def renew(self) -> None:
        """Renews now; raises LeaseLost (and marks the lease lost) when refused."""
        try:
            self.lease = self.store.renew(self.lease, self.ttl)
        except LeaseLost:
            self.mark_lost()
            raise


class LeaseKeeper(threading.Thread):
    """Renews held leases every ``interval`` seconds and beats a heartbeat key."""

    def __init__(
        self,
        store: LeaseStore,
        ttl: float,
        beat_key: str | None = None,
        stop_check: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(name="redis-lease-keeper", daemon=True)
        self.store = store
        self.ttl = ttl
        self.interval = max(0.05, min(ttl / 3, 5.0))
        self.beat_key = beat_key
        self.stop_check = stop_check
        self.on_stop_requested: Callable[[], None] = lambda: None
        self._held: dict[str, ActiveLease] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()

    def hold(self, active: ActiveLease) -> None:
        """Keeps ``active`` renewed until :meth:`drop`."""
        with self._lock:
            self._held[active.item_id] = active

    def drop(self, active: ActiveLease) -> None:
        """Stops renewing ``active`` (not a newer lease on the same item)."""
        with self._lock:
            if self._held.get(active.item_id) is active:
                del self._held[active.item_id]

    def beat(self) -> None:
        """Refreshes the heartbeat key (lives three intervals)."""
        if self.beat_key:
            with redis_errors(self.store.url):
                self.store.client.set(
                    self.beat_key, os.getpid(), px=int(self.interval * 3000) + 500
                )

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.renew_all()
                self.beat()
                if self.stop_check is not None and self.stop_check():
                    self.on_stop_requested()
            except (RedisLeaseError, redis.RedisError) as error:
                log.warning("lease keeper: %s", error)

    def renew_all(self) -> None:
        """Renews every held lease once; marks the refused ones lost."""
        with self._lock:
            held = list(self._held.values())
        renewed = self.store.renew_many([a.lease for a in held], self.ttl)
        for active, lease in zip(held, renewed, strict=True):
            if lease is None:
                active.mark_lost()
                self.drop(active)
            else:
                active.lease = lease

    def close(self) -> None:
        """Stops the thread."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)
