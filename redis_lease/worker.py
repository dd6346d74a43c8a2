"""Working one shard: claim in batches, run the handler under a kept lease, commit or fail.

:func:`process_shard` is the RQ job function. :func:`work_shard` does the work
and can be called without RQ. While a handler runs, a
:class:`~redis_lease.keeper.LeaseKeeper` thread renews the process's leases
(conditional on their tokens) and beats the shard job's heartbeat; a lease that
cannot be renewed is marked lost.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import redis
from rq import get_current_job

from . import dispatch
from .connection import describe, eviction_danger, redis_errors, resilient
from .errors import (
    ConditionFailed,
    InvalidInput,
    LeaseError,
    LeaseLost,
    PermanentError,
    RedisLeaseError,
    RunClosed,
    SlotTimeout,
    Throttled,
)
from .guards import Condition, Write
from .jobs import Job, load_job
from .keeper import ActiveLease, LeaseKeeper
from .lease import CommitOutcome, CommitRequest, Item
from .limits import DEFAULT_PREFIX
from .store import LeaseStore

log = logging.getLogger("redis_lease.worker")

__all__ = ["ActiveLease", "LeaseKeeper", "Outcome", "ShardReport", "process_shard", "work_shard"]

#: Seconds before an item released for want of a provider slot is due again.
SLOT_RETRY_DELAY = 1.0


@dataclass(frozen=True)
class Outcome:
    """A handler's answer with a label (counted as ``outcome_<label>``) or guarded writes."""

    result: Any = None
    conditions: tuple[Condition, ...] = ()
    writes: tuple[Write, ...] = ()
    label: str = ""


@dataclass
class ShardReport:
    """What one pass over a shard did."""

    committed: int = 0
    failed: int = 0
    stale: int = 0
    released: int = 0
    throttled: int = 0
    stopped: bool = False
    drained: bool = False
    closed: bool = False
    errors: list[str] = field(default_factory=list)
    #: Items left to their lease expiry after an error while settling them.
    abandoned: int = 0


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
) -> ShardReport:
    """Claims and handles the shard's due items until drained, stopped or out of budget.

    Commits are sent together, in one round trip, at the end of each batch or
    once the oldest waits ``commit_interval`` seconds; until then their leases
    are kept renewed. On a stop request the current item is finished, the
    waiting commits are sent, and the claimed items not yet started are
    released, so that they are claimable at once.
    """
    if job.handle_item is None:
        raise LeaseError(f"job {job.name!r} has no handler; decorate one with @job.handler")
    report = ShardReport()
    ttl, ends = job.options.lease_ttl, time.monotonic() + budget
    pending = _PendingCommits(store, keeper, report, job.options.commit_interval)
    while not stop.is_set() and time.monotonic() < ends:
        try:
            leases = store.claim_next(
                run_id, worker, shard=shard, limit=job.options.batch_size, ttl=ttl
            )
        except RunClosed:
            report.closed = True
            return report
        if not leases:
            report.drained = True
            return report
        batch = [ActiveLease(store, lease, ttl) for lease in leases]
        for active in batch:
            keeper.hold(active)
        for index, active in enumerate(batch):
            if stop.is_set() or time.monotonic() >= ends:
                pending.flush()
                report.stopped = stop.is_set()
                _release(store, keeper, batch[index:], report)
                return report
            pending.flush_due()  # a finished item's commit does not wait on a slow handler
            request = _handle(store, job, active, report) if not active.lost else None
            if request is None:  # handled (failed, released) or its lease was lost while waiting
                keeper.drop(active)
            else:
                pending.add(active, request)
        pending.flush()
    report.stopped = stop.is_set()
    return report


class _PendingCommits:
    """Commits waiting to be sent together; their leases stay with the keeper meanwhile."""

    def __init__(
        self, store: LeaseStore, keeper: LeaseKeeper, report: ShardReport, interval: float
    ) -> None:
        self.store, self.keeper, self.report, self.interval = store, keeper, report, interval
        self.waiting: list[tuple[ActiveLease, CommitRequest]] = []
        self.oldest = 0.0

    def add(self, active: ActiveLease, request: CommitRequest) -> None:
        """Queues a commit; sends the queue when its oldest has waited long enough."""
        if not self.waiting:
            self.oldest = time.monotonic()
        self.waiting.append((active, request))
        self.flush_due()

    def flush_due(self) -> None:
        """Sends the waiting commits once the oldest has waited ``interval`` seconds."""
        if self.waiting and time.monotonic() - self.oldest >= self.interval:
            self.flush()

    def flush(self) -> None:
        """Sends every waiting commit in one round trip and settles each answer.

        When the round trip fails (Redis gone past the retries) the items are
        left to their lease expiry; the job goes on.
        """
        if not self.waiting:
            return
        waiting, self.waiting = self.waiting, []
        try:
            answers: list[CommitOutcome | LeaseError] = self.store.commit_many(
                [request for _, request in waiting]
            )
        except LeaseError as error:
            answers = [error] * len(waiting)
        for (active, _request), answer in zip(waiting, answers, strict=True):
            self.keeper.drop(active)
            self._settle_answer(active, answer)

    def _settle_answer(self, active: ActiveLease, answer: CommitOutcome | LeaseError) -> None:
        report = self.report
        if isinstance(answer, LeaseLost):
            _stale(active, report, answer)
        elif isinstance(answer, InvalidInput):  # e.g. a result that is not JSON: no retry mends it
            if _settle(self.store.fail, active, report, f"permanent: {answer}", permanent=True):
                report.failed += 1
        elif isinstance(answer, ConditionFailed):
            # What the handler read changed before the commit: back at once, read again.
            if _settle(self.store.release, active, report):
                report.released += 1
        elif isinstance(answer, LeaseError):
            _abandon(active, report, "commit", answer)
        else:
            report.committed += 1


def _handle(
    store: LeaseStore, job: Job, active: ActiveLease, report: ShardReport
) -> CommitRequest | None:
    """Runs the handler; returns the commit to send, or None when the item was settled."""
    assert job.handle_item is not None
    lease = active.lease
    try:
        answer = job.handle_item(Item(lease.item_id, lease.payload), active)
    except PermanentError as error:
        if _settle(store.fail, active, report, f"permanent: {error}", permanent=True):
            report.failed += 1
        return None
    except LeaseLost as error:
        _stale(active, report, error)
        return None
    except Throttled as error:  # not the item's fault: back later, attempt not counted
        if _settle(store.release, active, report, delay=error.delay_ms / 1000):
            report.throttled += 1
        return None
    except SlotTimeout:
        if _settle(store.release, active, report, delay=SLOT_RETRY_DELAY):
            report.throttled += 1
        return None
    except Exception as error:  # the handler is user code: any failure is a failed attempt
        if _settle(store.fail, active, report, f"{type(error).__name__}: {error}"):
            report.failed += 1
        return None
    if isinstance(answer, Outcome):
        return CommitRequest(
            active.lease, answer.result, answer.conditions, answer.writes, answer.label
        )
    return CommitRequest(active.lease, answer)


def _settle(
    call: Callable[..., Any], active: ActiveLease, report: ShardReport, *args: Any, **kw: Any
) -> bool:
    """Fails or releases the item; True when that was done.

    A lease lost meanwhile is counted as stale. Any other error (Redis gone
    past the retries, a refusal) is logged and the item left to its lease
    expiry: the job goes on with the next item.
    """
    try:
        call(active.lease, *args, **kw)
    except LeaseLost as error:
        _stale(active, report, error)
        return False
    except RedisLeaseError as error:
        _abandon(active, report, getattr(call, "__name__", "settle"), error)
        return False
    return True


def _stale(active: ActiveLease, report: ShardReport, error: LeaseLost) -> None:
    """Counts a lease lost meanwhile: the item is another holder's now."""
    active.mark_lost()
    report.stale += 1
    log.info("stale: %s", error)


def _abandon(active: ActiveLease, report: ShardReport, action: str, error: Exception) -> None:
    """Leaves an item to its lease expiry after ``action`` failed; logs it with the item."""
    report.abandoned += 1
    report.errors.append(f"{action} of item {active.item_id!r} failed: {error}")
    log.warning(
        "%s of item %r of run %r (token %s) failed, so it is left to its lease expiry: %s: %s",
        action,
        active.item_id,
        active.run_id,
        active.token,
        type(error).__name__,
        error,
    )


def _release(
    store: LeaseStore, keeper: LeaseKeeper, batch: list[ActiveLease], report: ShardReport
) -> None:
    """Gives back claimed items that were not started (claimable at once)."""
    for active in batch:
        keeper.drop(active)
        if _settle(store.release, active, report):
            report.released += 1


def worker_name(rq_job_id: str) -> str:
    """A lease owner name: host, process and RQ job."""
    host = "".join(c if c.isalnum() or c in "-._" else "-" for c in socket.gethostname())
    return f"{host or 'host'}:{os.getpid()}:{rq_job_id[-8:]}"


def process_shard(
    job_path: str, run_id: str, shard: int, prefix: str = DEFAULT_PREFIX
) -> dict[str, Any]:
    """The RQ job: works one shard for up to the job's shard budget, then re-enqueues itself.

    Its store talks to RQ's server through a client of its own that retries
    connection errors and timeouts (:func:`~.connection.resilient`), so a reset
    costs a reconnect, not the job. SIGTERM (to this process) or a warm shutdown
    of its RQ worker drains it: the current item is finished and the unstarted
    ones released. Returns a report.
    """
    rq_job = get_current_job()
    if rq_job is None:
        raise LeaseError("process_shard runs inside an RQ worker; use work_shard directly")
    job = load_job(job_path)
    client = resilient(rq_job.connection)
    store = LeaseStore(client, prefix=prefix, url=describe(client))
    _log_danger(store)
    stop = threading.Event()
    beat_key = store.keys.run_beat(run_id, rq_job.id)
    keeper = LeaseKeeper(
        store,
        job.options.lease_ttl,
        beat_key=beat_key,
        stop_check=lambda: _worker_stopping(store, rq_job.worker_name),
    )
    keeper.on_stop_requested = stop.set
    keeper.beat()
    restore = _drain_on_sigterm(stop)
    keeper.start()
    try:
        report = work_shard(
            store,
            job,
            run_id,
            shard,
            worker=worker_name(rq_job.id),
            budget=job.options.shard_budget,
            stop=stop,
            keeper=keeper,
        )
        if not report.drained and not report.closed:
            dispatch.enqueue_shard(
                store, job_path, job.options.queue, run_id, shard, job.options.shard_budget
            )
    finally:
        keeper.close()
        _forget_job(store, run_id, rq_job.id, beat_key)
        restore()
        if client is not rq_job.connection:
            client.close()
    return {
        "run": run_id,
        "shard": shard,
        "committed": report.committed,
        "failed": report.failed,
        "stale": report.stale,
        "released": report.released,
        "abandoned": report.abandoned,
        "stopped": report.stopped,
        "drained": report.drained,
    }


def _forget_job(store: LeaseStore, run_id: str, rq_id: str, beat_key: str) -> None:
    """Removes the job's heartbeat and its entry among the run's jobs.

    Best effort: when Redis is gone, the heartbeat expires by itself and the
    tick forgets the entry of a job that is not live.
    """
    try:
        with redis_errors(store.url, run_id=run_id):
            store.client.delete(beat_key)
            store.client.hdel(store.keys.run_jobs(run_id), rq_id)
    except RedisLeaseError as error:
        log.warning("could not remove the heartbeat of job %s of run %r: %s", rq_id, run_id, error)


_dangers_logged: set[str] = set()


def _log_danger(store: LeaseStore) -> None:
    """Logs, once per server and process, an error when the server may evict keys."""
    if store.url in _dangers_logged:
        return
    _dangers_logged.add(store.url)
    try:
        danger = eviction_danger(store.client)
    except redis.RedisError:  # the check must never stop the work
        return
    if danger:
        log.error("danger: Redis at %s: %s", store.url, danger)


def _worker_stopping(store: LeaseStore, name: str | None) -> bool:
    """True when the RQ worker running this job recorded a warm shutdown request."""
    if not name:
        return False
    with redis_errors(store.url):
        return bool(store.client.hget(f"rq:worker:{name}", "shutdown_requested_date"))


def _drain_on_sigterm(stop: threading.Event) -> Callable[[], None]:
    """Sets ``stop`` on SIGTERM (chaining to the previous handler); returns a restorer."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_term)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
