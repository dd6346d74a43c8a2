"""The thread that keeps a worker's leases: :class:`LeaseKeeper`.

It renews every held lease (conditional on its token), sends the shard job's heartbeat and
reads the worker's stop request, all in one round trip per tick (renewals every third of
the TTL, heartbeats every second). A lease that cannot be renewed is marked lost
(:meth:`~redis_lease.fleet.jobs.live_lease.ActiveLease.mark_lost`), which stops its handler. A
heartbeat that finds the shard job no longer registered (it was taken over) calls
:attr:`LeaseKeeper.on_unregistered` once: the shard job stops claiming.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from ...errors import RedisLeaseError
from ...limits import DEAD_AFTER_MS, HEARTBEAT
from ...protocol.connection.clients import as_text, describe
from ...protocol.connection.translate import REDIS_FAILURES, translating_errors
from ...protocol.scripts import Command
from ...protocol.store.lease_store import LeaseStore
from ..full_redis import notice_full
from ..jobs.live_lease import ActiveLease, Heartbeat
from ..transport import takeover

log = logging.getLogger("redis_lease.worker")

__all__ = ["LeaseKeeper"]


class LeaseKeeper(threading.Thread):
    """Renews held leases every third of their TTL, sends a heartbeat every
    :data:`~redis_lease.limits.HEARTBEAT` seconds, and reads a stop request.

    Other workers check the heartbeat. When the registry has had no heartbeat from the
    shard job for :data:`~redis_lease.limits.DEAD_AFTER` seconds by the server's clock
    (outside a stall's grace), another worker ends this process's leases and takes its
    items over (:mod:`redis_lease.fleet.transport.takeover`). The keeper runs in its own thread, so
    a slow handler (one that lets Python run its threads) is never taken for dead.

    Args:
        store: the store of the leases.
        ttl: seconds each renewal extends a lease by.
        beat_key: a key set on every heartbeat to the heartbeat's value (lives
            :data:`~redis_lease.limits.DEAD_AFTER` seconds), for the views.
        stop_flag: ``(hash key, field)``: when the field is set, :attr:`on_stop_requested`
            is called (an RQ worker's warm shutdown request).
        job_id: the RQ id of the registered shard job whose registry heartbeat each tick sends
            (:func:`~redis_lease.fleet.transport.takeover.beat_command`); None for none.
    """

    def __init__(
        self,
        store: LeaseStore,
        ttl: float,
        beat_key: str | None = None,
        stop_flag: tuple[str, str] | None = None,
        job_id: str | None = None,
    ) -> None:
        super().__init__(name="redis-lease-keeper", daemon=True)
        self.store = store
        self.ttl = ttl
        #: Seconds between renewals of the held leases.
        self.renew_every = max(0.05, ttl / 3)
        #: Seconds between ticks: beats (and stop-request reads), renewals when due.
        beats = beat_key is not None or job_id is not None
        self.interval = min(self.renew_every, HEARTBEAT) if beats else self.renew_every
        self.beat_key = beat_key
        self.stop_flag = stop_flag
        self.job_id = job_id
        self.on_stop_requested: Callable[[], None] = lambda: None
        #: Called once, from the keeper's thread, when a beat finds the job unregistered.
        self.on_unregistered: Callable[[], None] = lambda: None
        #: True once a beat found the shard job no longer registered (taken over).
        self.unregistered = False
        self._held: dict[tuple[str, str], ActiveLease] = {}  # by (run, item)
        self._lock = threading.Lock()
        # Held across a tick's choice of leases and its round trip, and by settle: no
        # renewal of a lease goes out after its commit, fail or release (see settle).
        self._sending = threading.Lock()
        self._done = threading.Event()
        self._renewed_at = time.monotonic()
        self._beat_late = False  # the last beat was stored, but too late to count
        #: Until when the beats surely live; leases taken under this keeper share it.
        self.heartbeat: Heartbeat | None = Heartbeat() if beats else None

    def hold(self, active: ActiveLease) -> None:
        """Keeps ``active`` renewed until :meth:`drop`."""
        with self._lock:
            self._held[active.run_id, active.item_id] = active

    def drop(self, active: ActiveLease) -> None:
        """Stops renewing ``active`` (not a newer lease on the same item)."""
        with self._lock:
            if self._held.get((active.run_id, active.item_id)) is active:
                del self._held[active.run_id, active.item_id]

    def settle(self, actives: list[ActiveLease]) -> None:
        """Stops renewing ``actives``, whose commits, fails or releases go out next.

        It first waits for a renewal under way, so that no renewal of theirs reaches Redis
        after the commit (a renewal behind a commit would be refused, and counted stale)."""
        with self._sending:
            for active in actives:
                self.drop(active)

    def beat(self) -> None:
        """Sets the heartbeat key now (it lives :data:`~redis_lease.limits.DEAD_AFTER` s)."""
        if self.beat_key and self.heartbeat is not None:
            sent_at = time.monotonic()
            with translating_errors(self.store.url):
                self.store.client.set(self.beat_key, self.beat_value(), px=DEAD_AFTER_MS)
            self.heartbeat.beaten(sent_at)

    def beat_value(self) -> str:
        """The heartbeat's value: this process's id and how many leases it holds.

        ``redis-lease workers`` shows it."""
        with self._lock:
            held = len(self._held)
        return json.dumps({"pid": os.getpid(), "held": held})

    def run(self) -> None:
        while not self._done.wait(0.0 if self._beat_late else self.interval):
            self._beat_late = False
            try:
                self.tick()
            except (RedisLeaseError, *REDIS_FAILURES) as error:
                if not notice_full(error, "lease keeper"):
                    log.warning("lease keeper: %s", error)

    def tick(self) -> None:
        """One round trip: beats, reads the stop request and, every third of the TTL,
        renews every held lease (one script call per shard)."""
        with self._sending:
            sent_at, held, replies, lapsed = self._send()
        renewed, (stored, flag) = replies
        heartbeat = self.heartbeat
        epoch = None if heartbeat is None else heartbeat.epoch + (1 if lapsed else 0)
        for active, lease in zip(held, renewed, strict=True):
            if lease is None:
                self.drop(active)
                active.mark_lost()
            else:
                active.renewed(lease, sent_at, epoch)
        if heartbeat is not None and stored:
            heartbeat.beaten(sent_at, lapsed)
            # Stored too late to count (Redis stalled, or this process was paused): beat
            # again at once, so the leases are trusted again within a round trip.
            self._beat_late = not heartbeat.alive
        if stored is False and not self.unregistered:
            self.unregistered = True
            log.warning(
                "shard job %s is no longer registered (taken over, or its entry was lost): "
                "it stops claiming",
                self.job_id,
            )
            self.on_unregistered()
        if flag is not None and not isinstance(flag, redis.ResponseError) and as_text(flag):
            self.on_stop_requested()

    def _send(self) -> tuple[float, list[ActiveLease], tuple[list[Any], tuple[Any, Any]], bool]:
        """The tick's round trip: when it was sent, the leases renewed, the renewals'
        answers with the beat's (True: stored; False: the job is not registered; None:
        none sent or stored) and the stop flag's, and whether the beats had lapsed."""
        due = time.monotonic() - self._renewed_at >= self.renew_every - self.interval / 2
        # Heartbeats stopped long enough for another worker to end the leases (the process was
        # paused, Redis out of reach): renew them all now to learn which are still held.
        lapsed = self.heartbeat is not None and not self.heartbeat.alive
        due = due or lapsed
        with self._lock:
            held = list(self._held.values()) if due else []
        commands: list[Command] = []
        if self.beat_key:
            commands.append(Command(("SET", self.beat_key, self.beat_value(), "PX", DEAD_AFTER_MS)))
        if self.job_id:
            commands.append(takeover.beat_command(self.store, self.job_id))
        # RQ's worker record rides along unless RQ has a Redis of its own (a cluster's store).
        flag_apart = self.stop_flag is not None and self.store.rq is not self.store.client
        if self.stop_flag and not flag_apart:
            commands.append(Command(("HGET", *self.stop_flag)))
        if due:
            self._renewed_at = time.monotonic()
        sent_at = time.monotonic()
        renewed: list[Any] = []
        replies: list[Any] = []
        if held or commands:
            renewed, replies = self.store.renew_with([a.lease for a in held], self.ttl, commands)
        stored: bool | None = None
        if self.job_id:
            stored = takeover.beat_reply(self.store, replies[1 if self.beat_key else 0])
        elif self.beat_key:
            stored = replies[0] is True
        flag = None
        if self.stop_flag:
            if flag_apart:
                with translating_errors(describe(self.store.rq)):  # RQ's server, not the store's
                    flag = self.store.rq.hget(*self.stop_flag)
            else:
                flag = replies[-1]
        return sent_at, held, (renewed, (stored, flag)), lapsed

    def close(self) -> None:
        """Stops the thread."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)
