"""The shard loop: claim in batches, run handlers under renewed leases, commit in batches.

:func:`work_shard` works one shard of a run until it is drained, stopped or out of
budget, running up to ``concurrency`` handlers at once (:mod:`redis_lease.fleet.worker.pool`);
finished items are committed, failed or released together, one round trip per
batch (:mod:`redis_lease.fleet.worker.handler_outcomes`). It needs no RQ:
:func:`redis_lease.worker.process_shard` is the RQ job around it.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque

from ...errors import (
    ClusterBusy,
    LeaseError,
    LeaseLost,
    NotReplicated,
    RedisUnavailable,
    RunClosed,
    SlotTimeout,
    Throttled,
)
from ...protocol.connection.clients import queue_time, time_ms
from ...protocol.leases import ReleaseRequest
from ...protocol.store.lease_store import LeaseStore
from ..full_redis import notice_full
from ..jobs.job import Job, check_concurrency
from ..jobs.live_lease import ActiveLease
from .handler_outcomes import PendingSettlements, ShardReport, mark_stale, settlement_of
from .lease_keeper import LeaseKeeper
from .pool import Finished, Pool, make_pool

log = logging.getLogger("redis_lease.worker")

__all__ = ["work_shard"]

#: Seconds before claiming again after a cluster refused a claim while moving slots.
CLUSTER_RETRY_DELAY = 0.2
#: Seconds before claiming again after Redis could not be reached or was busy.
UNAVAILABLE_RETRY_DELAY = 1.0
#: Seconds past a pending item's due time before the shard loop claims it (after a wait).
DUE_MARGIN = 0.05
#: The longest the shard loop waits for a handler before it looks at the stop request again.
_STOP_POLL = 0.05
#: Seconds of handler work a claim covers, by the recent mean handler time (within the
#: job's batch_size): fast handlers claim many items at once, so the fixed cost
#: of a script call is shared by many; slow ones claim few, so that no claimed item waits
#: long under its lease and other workers of the shard get theirs.
CLAIM_SPAN = 0.2
#: The most items the first claim of a pass takes, before any handler time is known.
FIRST_CLAIM = 20
#: The weight of the newest handler time in the recent mean the claims are sized by: a
#: slowdown after many fast items shrinks the claims within a few dozen items.
RECENT_WEIGHT = 0.1


def work_shard(
    store: LeaseStore,
    job: Job,
    run_id: str,
    shard: int,
    *,
    worker: str,
    budget: float,
    stop: threading.Event,
    keeper: LeaseKeeper,
    concurrency: int | None = None,
    wait_for_backoff: bool = True,
) -> ShardReport:
    """Claims and handles the shard's due items until drained, stopped or out of budget.

    Drained: no item of the shard is pending. One that waits out a back-off (a retry, a
    provider's delay) is waited for, within the budget, and worked when due: a retry
    does not wait for the next tick. ``wait_for_backoff=False``: one pass, which ends
    once nothing is due now.

    Up to ``concurrency`` handlers (default: the job's option) run at once:
    plain handlers on threads, ``async def`` handlers on one event loop. On
    those, the next batch is claimed while a few claimed items still wait for a
    slot (at most ``batch_size`` wait), and a slot whose handler ends starts
    the next waiting item itself, so no slot waits on a claim or commit round
    trip. One plain handler at a time runs inline and claims only when it is
    idle. Commits are sent together, in one
    round trip, when nothing is left to start or once the oldest waits
    ``commit_interval`` seconds; until then their leases are kept renewed. On a
    stop request the running handlers are finished, the waiting commits sent,
    and the claimed items not yet started released, so that they are
    claimable at once.
    """
    if job.handle_item is None:
        raise LeaseError(f"job {job.name!r} has no handler; decorate one with @job.handler")
    size = job.options.concurrency if concurrency is None else check_concurrency(concurrency)
    report = ShardReport()
    ends = time.monotonic() + budget
    pool = make_pool(job.handle_item, size, lambda: not stop.is_set() and time.monotonic() < ends)
    shard_loop = _ShardLoop(store, job, run_id, shard, worker, keeper, pool, size, report)
    shard_loop.wait_for_backoff = wait_for_backoff
    try:
        shard_loop.run(stop, ends)
    finally:
        pool.close()
        shard_loop.settle_finished()  # handlers that ended while the loop was leaving
        shard_loop.pending.flush_all()
    return report


class _ShardLoop:
    """The loop of one pass over a shard: claim items, start handlers, commit results."""

    def __init__(
        self,
        store: LeaseStore,
        job: Job,
        run_id: str,
        shard: int,
        worker: str,
        keeper: LeaseKeeper,
        pool: Pool,
        size: int,
        report: ShardReport,
    ) -> None:
        self.store, self.job, self.run_id, self.shard = store, job, run_id, shard
        self.worker, self.keeper, self.pool, self.size = worker, keeper, pool, size
        self.report = report
        self.pending = PendingSettlements(
            store, keeper, report, job.options.commit_interval_seconds
        )
        #: The recent mean handler time (seconds) of the items that did their work (not
        #: throttled), weighted by RECENT_WEIGHT; None until one has.
        self.recent_seconds: float | None = None
        #: Claimed items not yet handed to the pool (the inline pool takes one at a time).
        self.waiting: deque[ActiveLease] = deque()
        #: Items handed to the pool whose handler has not ended: running or waiting for a slot.
        self.in_pool = 0
        #: Whether items in a back-off are waited for (else the pass ends when none is due).
        self.wait_for_backoff = True

    def run(self, stop: threading.Event, ends: float) -> None:
        """Works until drained, closed, stopped or ``ends`` (monotonic).

        However it leaves (an error included), the claimed items not started are
        given back and the running handlers finished.
        """
        try:
            self._work(stop, ends)
        finally:
            self.report.stopped = stop.is_set()
            self._release_waiting()
            while self.in_pool:  # finish what has started
                self._settle_next(min(self.pending.due_in(), _STOP_POLL))
                self.pending.flush_due()

    def _work(self, stop: threading.Event, ends: float) -> None:
        report, pending, waiting = self.report, self.pending, self.waiting
        exhausted = False  # the last claim found nothing due
        while not stop.is_set() and time.monotonic() < ends:
            claim_below = self.size + self._low_water()  # claimed items held, before a claim
            if not exhausted and self.in_pool + len(waiting) < claim_below:
                try:
                    exhausted = not self._claim()
                except RunClosed:
                    report.closed = True
                    return
                except (ClusterBusy, NotReplicated) as error:  # nothing granted: claim again soon
                    log.info("claim on run %r shard %s: %s", self.run_id, self.shard, error)
                    stop.wait(CLUSTER_RETRY_DELAY)
                except RedisUnavailable as error:  # a stall, a failover, a full Redis: ride it out
                    where = f"claim on run {self.run_id!r} shard {self.shard}"
                    if not notice_full(error, where):
                        log.warning("%s: %s", where, error)
                    stop.wait(UNAVAILABLE_RETRY_DELAY)
            while waiting and (self.pool.queues or self.in_pool < self.size):
                if stop.is_set() or time.monotonic() >= ends:
                    break
                pending.flush_due()  # a finished item's commit does not wait on a slow handler
                self._start(waiting.popleft())
            if not self.in_pool and not waiting:
                pending.flush()
                if exhausted:
                    wait = self._until_next_due() if self.wait_for_backoff else None
                    if wait is None:
                        report.drained = True
                        return
                    # items wait out a back-off: work them when due, not at the next tick
                    stop.wait(min(wait, max(0.0, ends - time.monotonic())))
                    exhausted = False
                continue
            if self.in_pool >= claim_below or exhausted:
                # Wait for a handler to end, waking to send due commits and to see a stop.
                timeout = min(pending.due_in(), _STOP_POLL, max(0.0, ends - time.monotonic()))
                if self._settle_next(timeout):
                    exhausted = False
            self.settle_finished()
            pending.flush_due()

    def _until_next_due(self) -> float | None:
        """Seconds until the shard's first pending item is due (a retry's back-off, a
        provider's delay), on the server's clock, plus a little for the clocks to agree;
        None when no item is pending. One round trip."""
        due = self.store.keys.shard(self.run_id, self.shard)[3]
        try:
            with self.store.translating_errors(self.run_id):
                pipe = self.store.client.pipeline(transaction=False)
                pipe.zrange(due, 0, 0, withscores=True)
                queue_time(pipe)
                first, now = pipe.execute()
        except RedisUnavailable as error:  # a stall: look again soon, as a claim would
            where = f"run {self.run_id!r} shard {self.shard}"
            if not notice_full(error, where):
                log.warning("%s: %s", where, error)
            return UNAVAILABLE_RETRY_DELAY
        if not first:
            return None
        return max(0.0, (float(first[0][1]) - time_ms(now)) / 1000) + DUE_MARGIN

    def _claim_size(self) -> int:
        """The items one claim takes: about CLAIM_SPAN seconds of handler work for the
        slots, by the recent mean handler time (FIRST_CLAIM before one is known), from 1
        to the job's batch_size."""
        most = self.job.options.batch_size
        if self.recent_seconds is None:
            return min(most, FIRST_CLAIM)
        mean = max(self.recent_seconds, 1e-6)
        return max(1, min(most, math.ceil(self.size * CLAIM_SPAN / mean)))

    def _time_handler(self, finished: Finished) -> None:
        """Counts a handler's time in the report and, unless it gave its item back for
        want of capacity (it did no work), in the recent mean."""
        self.report.handled += 1
        self.report.handler_seconds += finished.seconds
        if isinstance(finished.error, (Throttled, SlotTimeout)):
            return
        if self.recent_seconds is None:
            self.recent_seconds = finished.seconds
        else:
            self.recent_seconds += RECENT_WEIGHT * (finished.seconds - self.recent_seconds)

    def _low_water(self) -> int:
        """How few claimed items waiting for a slot trigger the next claim (a quarter of a
        claim, at least one). Inline, nothing waits: the next claim comes when the handler
        is idle. With claims of under 8 (slow handlers) the next claim goes out once no
        claimed item is left waiting, so a slot may wait a round trip, small beside its
        handler."""
        return max(1, self._claim_size() // 4) if self.pool.queues else 0

    def _claim(self) -> bool:
        """Claims a claim's size of items (:meth:`_claim_size`), no more than fill the
        slots with that many waiting; True when some were due."""
        ttl = self.job.options.lease_ttl_seconds
        held = self.in_pool + len(self.waiting)
        size = self._claim_size()
        limit = min(size, self.size + size - held)
        sent_at = time.monotonic()
        leases = self.store.claim_next(
            self.run_id, self.worker, shard=self.shard, limit=limit, ttl=ttl
        )
        for lease in leases:
            active = ActiveLease(self.store, lease, ttl, sent_at, self.keeper.heartbeat)
            self.keeper.hold(active)
            self.waiting.append(active)
        return bool(leases)

    def _start(self, active: ActiveLease) -> None:
        if active.lost:  # lost while waiting to start
            self.keeper.drop(active)
            self.report.stale += 1
            return
        self.in_pool += 1
        self.pool.start(active)
        if self.size == 1:  # an inline handler has ended by now: queue its commit first
            self.settle_finished()

    def _settle_next(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for a handler to end, and queues its settlement."""
        try:
            finished = (
                self.pool.done.get(timeout=timeout) if timeout > 0 else self.pool.done.get_nowait()
            )
        except queue.Empty:
            return False
        self._settle(finished)
        return True

    def settle_finished(self) -> None:
        """Queues the settlement (commit, fail or release) of every handler that has ended."""
        while True:
            try:
                finished = self.pool.done.get_nowait()
            except queue.Empty:
                return
            self._settle(finished)

    def _settle(self, finished: Finished) -> None:
        self.in_pool -= 1
        if not finished.started:  # lost while waiting for a slot
            self.keeper.drop(finished.active)
            self.report.stale += 1
            return
        self._time_handler(finished)
        active = finished.active
        settlement = settlement_of(active, finished.answer, finished.error)
        if settlement is None:  # the lease was lost: the item is another holder's
            self.keeper.drop(active)
            assert isinstance(finished.error, LeaseLost)
            mark_stale(active, self.report, finished.error)
        else:
            self.pending.add(active, *settlement)

    def _release_waiting(self) -> None:
        """Gives back claimed items that were not started (claimable at once), with the
        waiting settlements in one round trip."""
        taken_back = self.pool.take_back()  # first: no slot starts one of them from now on
        self.in_pool -= len(taken_back)
        waiting, self.waiting = [*taken_back, *self.waiting], deque()
        for active in waiting:
            self.pending.waiting.append((active, ReleaseRequest(active.lease), "released"))
        self.pending.flush()
