"""The lease a handler works under: an :class:`ActiveLease`, renewed in the background, and
the :class:`Heartbeat` it is trusted by.

The worker's :class:`~redis_lease.fleet.worker.lease_keeper.LeaseKeeper` renews every held
lease (conditional on its token) and sends the shard job's heartbeat. A lease
that cannot be renewed is marked lost: a thread handler then gets
:class:`~redis_lease.errors.LeaseLost` at its next :meth:`ActiveLease.check`,
:meth:`~ActiveLease.effect` or :meth:`~ActiveLease.renew`, and an async handler's task
is cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from ...errors import EffectFailed, LeaseLost
from ...limits import CONCURRENCY_MAX, DEAD_AFTER
from ...protocol.leases import Lease
from ...protocol.store.lease_store import LeaseStore
from ..effects.ledger import apply_effect

log = logging.getLogger("redis_lease.worker")

#: Guards every lease's lost flag and callbacks (rarely taken, never for long).
_LOST_LOCK = threading.Lock()
_LEDGER: list[ThreadPoolExecutor] = []


def _ledger_threads() -> ThreadPoolExecutor:
    """The threads that run effect_async's ledger calls (made on first use, grown on demand)."""
    with _LOST_LOCK:
        if not _LEDGER:
            _LEDGER.append(ThreadPoolExecutor(CONCURRENCY_MAX, "redis-lease-ledger"))
        return _LEDGER[0]


class Heartbeat:
    """Until when this process's heartbeat surely lives, by its monotonic clock.

    A beat lives :data:`~redis_lease.limits.DEAD_AFTER` seconds from when the server got
    it, so surely until ``DEAD_AFTER`` after it was sent; until then no other worker can take
    this process's shard job for stopped and end its leases. A process that was paused,
    or could not beat, knows from this that its leases may be another's.
    """

    def __init__(self) -> None:
        self.valid_until = time.monotonic() + DEAD_AFTER
        #: Lapses so far: times the beats stopped long enough for a takeover. A lease
        #: held across a lapse is trusted again only once a renewal after it got through.
        self.epoch = 0

    def beaten(self, sent_at: float, lapsed: bool = False) -> None:
        """A beat sent at ``sent_at`` (monotonic) was stored; ``lapsed``: the one before it
        had surely died when it was sent."""
        if lapsed:
            self.epoch += 1
        self.valid_until = max(self.valid_until, sent_at + DEAD_AFTER)

    @property
    def alive(self) -> bool:
        """True while the last stored beat surely lives."""
        return time.monotonic() < self.valid_until


class ActiveLease:
    """The lease a handler works under: renewed in the background, and it can be lost.

    Attributes:
        lease: the current Lease (its expiry moves as it is renewed).
    """

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        ttl: float,
        sent_at: float | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.store = store
        self.lease = lease
        self.ttl = ttl
        #: When the lease runs out by this process's monotonic clock: ``ttl`` after the
        #: claim or last renewal was sent (``sent_at``; now by default), so never later
        #: than the server's expiry (each renewal moves it on).
        self.valid_until = (time.monotonic() if sent_at is None else sent_at) + ttl
        #: The shard job's heartbeat: once it may have died, another worker may have ended the
        #: lease (None: no heartbeat, as outside a shard job).
        self.heartbeat = heartbeat
        #: The heartbeat's lapses when this lease was last known good.
        self.epoch = heartbeat.epoch if heartbeat is not None else 0
        self._lost = False
        self._event: threading.Event | None = None  # made by wait_lost only
        self._on_lost: list[Callable[[], object]] = []

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
    def trace_id(self) -> str:
        """The attempt's trace id, as the attempt log records it (see
        redis_lease.protocol.tracing)."""
        return self.lease.trace_id

    @property
    def lost(self) -> bool:
        """True once a renewal was refused: stop early; a commit will be refused anyway."""
        return self._lost

    def mark_lost(self) -> None:
        """Marks the lease lost (the keeper does this when a renewal is refused).

        Runs the callbacks given to :meth:`on_lost` once.
        """
        with _LOST_LOCK:
            if self._lost:
                return
            self._lost = True
            callbacks, self._on_lost, event = self._on_lost, [], self._event
        if event is not None:
            event.set()
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a callback's failure must not stop the keeper's renewals
                log.exception("a lost-lease callback of item %r failed", self.item_id)

    def on_lost(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Calls ``callback`` (from the keeper's thread) when the lease is lost; now if it is.

        Returns a function that takes the callback back (when its work has ended).
        """
        with _LOST_LOCK:
            if not self._lost:
                self._on_lost.append(callback)
                return lambda: self._forget(callback)
        callback()
        return lambda: None

    def _forget(self, callback: Callable[[], object]) -> None:
        with _LOST_LOCK:
            if callback in self._on_lost:
                self._on_lost.remove(callback)

    def wait_lost(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for the lease to be lost; True if it was."""
        with _LOST_LOCK:
            if self._lost:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    @property
    def held(self) -> bool:
        """Neither lost (a renewal was refused) nor run out by this process's clock, and
        its shard job's heartbeat surely alive (else another worker may have ended it)."""
        if self._lost or time.monotonic() >= self.valid_until:
            return False
        beat = self.heartbeat
        return beat is None or (beat.alive and beat.epoch == self.epoch)

    def renewed(self, lease: Lease, sent_at: float, epoch: int | None = None) -> None:
        """Takes the lease a renewal sent at ``sent_at`` (monotonic) returned; ``epoch``:
        the heartbeat's lapses it was sent after (known good since)."""
        self.lease = lease
        self.valid_until = sent_at + self.ttl
        if epoch is not None:
            self.epoch = epoch

    def check(self) -> None:
        """Raises LeaseLost when a renewal was refused, or when the lease ran out by this
        process's clock (no renewal got through in time: Redis slow or cut off, the
        process paused), or no heartbeat got through for ``DEAD_AFTER`` seconds (another
        worker may have taken the item over). Call it between steps to stop early."""
        if not self.held:
            self.mark_lost()  # once: a lease that ran out stays lost
            raise LeaseLost(
                f"the lease on item {self.item_id!r} of run {self.run_id!r} (token {self.token}) "
                "was lost: another holder may have it; stop and write nothing",
                run_id=self.run_id,
                item_id=self.item_id,
                token=self.token,
            )

    def effect(
        self,
        name: str,
        call: Callable[[str], Any],
        *,
        lookup: Callable[[str], Any] | None = None,
        honours_keys: bool = False,
    ) -> Any:
        """Applies an external effect under the lease, reconciling any doubt before it sends.

        ``call`` gets the key (``<run>|<item>|<name>``) and returns the provider's
        result. The intent is recorded, and the lease checked and renewed for its TTL,
        in one script right before the call, so the item can be taken over only while
        the call is under way. What holds (:func:`~redis_lease.fleet.effects.ledger.apply_effect`;
        the table in docs/concepts/effects-and-idempotency.md):

        - ``honours_keys=True`` (the provider dedupes by key): applied at most once, always.
        - ``lookup`` only: at most once, except a call still on its way when its item is
          taken over (this worker paused, cut off or killed mid-call past its lease or
          heartbeat, or the lease lost with the data): it can be applied a second time.
        - neither: at most once; any doubt (an earlier attempt left open, an ambiguous
          answer, a run made again after a loss of data) raises NeedsReconciliation.

        Raises LeaseLost at once when the lease is known to be lost.
        """
        self.check()
        return apply_effect(
            self.store,
            self.lease,
            name,
            call,
            lookup=lookup,
            honours_keys=honours_keys,
            before_call=self.check_before_call,
            ttl=self.ttl,
        )

    async def effect_async(
        self,
        name: str,
        call: Callable[[str], Awaitable[Any]],
        *,
        lookup: Callable[[str], Any] | None = None,
        honours_keys: bool = False,
    ) -> Any:
        """:meth:`effect` for an async handler: ``call`` and ``lookup`` may return awaitables.

        The same promises as :meth:`effect`. The ledger's Redis calls run off the event
        loop, on threads of their own; the provider call runs on it, checked again just
        before it starts, and is cancelled when the lease is lost.
        """
        self.check()
        loop = asyncio.get_running_loop()
        sync_lookup = partial(self._on_loop, loop, lookup) if lookup is not None else None
        apply = partial(
            apply_effect,
            self.store,
            self.lease,
            name,
            partial(self._on_loop, loop, call),
            lookup=sync_lookup,
            honours_keys=honours_keys,
            ttl=self.ttl,
        )
        # Threads of its own: one waiting here on the provider call must not take the
        # thread that call may need from the loop's default executor.
        return await loop.run_in_executor(_ledger_threads(), apply)

    def check_before_call(self) -> None:
        """Raises EffectFailed (the call is not sent) when the lease is lost or ran out.

        It does not mark the lease lost itself: that would cancel the call it guards,
        and a cancelled call's outcome is unknown, where this one is known unsent.
        """
        if not self.held:
            raise EffectFailed(
                f"not sent: the lease on item {self.item_id!r} (token {self.token}) was lost "
                "or ran out before the call",
                run_id=self.run_id,
                item_id=self.item_id,
                token=self.token,
            )

    def _on_loop(
        self, loop: asyncio.AbstractEventLoop, func: Callable[[str], Any], key: str
    ) -> Any:
        """Runs ``func(key)`` from a ledger thread; an awaitable it returns runs on ``loop``,
        the lease checked again there just before it starts (the loop may have been busy)."""
        self.check()
        result = func(key)
        if not inspect.isawaitable(result):
            return result
        future = asyncio.run_coroutine_threadsafe(_awaited(result, self.check_before_call), loop)
        self.on_lost(future.cancel)
        return future.result()

    def renew(self) -> None:
        """Renews now; raises LeaseLost (and marks the lease lost) when refused."""
        self.check()
        sent_at = time.monotonic()
        try:
            self.renewed(self.store.renew(self.lease, self.ttl), sent_at)
        except LeaseLost:
            self.mark_lost()
            raise


async def _awaited(awaitable: Awaitable[Any], before: Callable[[], None]) -> Any:
    try:
        before()
    except BaseException:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never started: nothing was sent
        raise
    return await awaitable
