"""Working one shard: claim in batches, run the handler under a kept lease, commit or fail.

:func:`process_shard` is the RQ job function. :func:`work_shard` does the work
and can be called without RQ. While a handler runs, a :class:`LeaseKeeper`
thread renews the process's leases (conditional on their tokens) and beats the
shard job's heartbeat; a lease that cannot be renewed is marked lost.
"""

from __future__ import annotations

import contextlib
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

from .effects import Throttled, apply_effect
from .errors import ConditionFailed, InvalidInput, LeaseError, LeaseLost, RunClosed
from .gate import SlotTimeout
from .guards import Condition, Write
from .jobs import Job, PermanentError, load_job
from .lease import Item, Lease
from .store import CommitRequest, LeaseStore

log = logging.getLogger("redis_lease.worker")


@dataclass(frozen=True)
class Outcome:
    """A handler's answer with a label (counted as ``outcome_<label>``) or guarded writes."""

    result: Any = None
    conditions: tuple[Condition, ...] = ()
    writes: tuple[Write, ...] = ()
    label: str = ""


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

        ``call`` gets the key (``<job>:<date>:<item>:<name>``) and returns the
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
            self.store.client.set(self.beat_key, os.getpid(), px=int(self.interval * 3000) + 500)

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.renew_all()
                self.beat()
                if self.stop_check is not None and self.stop_check():
                    self.on_stop_requested()
            except (LeaseError, redis.RedisError) as error:
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
                report.released += _release(store, keeper, batch[index:])
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
        """Sends every waiting commit in one round trip and settles each answer."""
        if not self.waiting:
            return
        waiting, self.waiting = self.waiting, []
        answers = self.store.commit_many([request for _, request in waiting])
        for (active, _request), answer in zip(waiting, answers, strict=True):
            self.keeper.drop(active)
            if isinstance(answer, LeaseLost):
                active.mark_lost()
                self.report.stale += 1
                log.info("stale: %s", answer)
            elif isinstance(
                answer, InvalidInput
            ):  # e.g. a result that is not JSON: no retry mends it
                _settle(
                    self.store.fail, active, self.report, f"permanent: {answer}", permanent=True
                )
                self.report.failed += 1
            elif isinstance(answer, ConditionFailed):
                # What the handler read changed before the commit: back at once, read again.
                with contextlib.suppress(LeaseLost):
                    self.store.release(active.lease)
                    self.report.released += 1
            elif isinstance(answer, LeaseError):
                self.report.errors.append(str(answer))
                log.warning("commit refused: %s", answer)
            else:
                self.report.committed += 1


def _handle(
    store: LeaseStore, job: Job, active: ActiveLease, report: ShardReport
) -> CommitRequest | None:
    """Runs the handler; returns the commit to send, or None when the item was settled."""
    assert job.handle_item is not None
    lease = active.lease
    try:
        answer = job.handle_item(Item(lease.item_id, lease.payload), active)
    except PermanentError as error:
        _settle(store.fail, active, report, f"permanent: {error}", permanent=True)
        report.failed += 1
        return None
    except LeaseLost as error:
        active.mark_lost()
        report.stale += 1
        log.info("stale: %s", error)
        return None
    except Throttled as error:  # not the item's fault: back later, attempt not counted
        _settle(store.release, active, report, delay=max(0.001, error.retry_after))
        report.throttled += 1
        return None
    except SlotTimeout:
        _settle(store.release, active, report, delay=1.0)
        report.throttled += 1
        return None
    except Exception as error:  # the handler is user code: any failure is a failed attempt
        _settle(store.fail, active, report, f"{type(error).__name__}: {error}"[:4000])
        report.failed += 1
        return None
    if isinstance(answer, Outcome):
        return CommitRequest(
            active.lease, answer.result, answer.conditions, answer.writes, answer.label
        )
    return CommitRequest(active.lease, answer)


def _settle(
    call: Callable[..., Any], active: ActiveLease, report: ShardReport, *args: Any, **kw: Any
) -> None:
    """Fails or releases the item; a lease lost meanwhile is counted as stale."""
    try:
        call(active.lease, *args, **kw)
    except LeaseLost as error:
        active.mark_lost()
        report.stale += 1
        log.info("stale: %s", error)


def _release(store: LeaseStore, keeper: LeaseKeeper, batch: list[ActiveLease]) -> int:
    released = 0
    for active in batch:
        keeper.drop(active)
        try:
            store.release(active.lease)
            released += 1
        except LeaseLost:
            pass
    return released


def worker_name(rq_job_id: str) -> str:
    """A lease owner name: host, process and RQ job."""
    host = "".join(c if c.isalnum() or c in "-._" else "-" for c in socket.gethostname())
    return f"{host or 'host'}:{os.getpid()}:{rq_job_id[-8:]}"


def process_shard(job_path: str, run_id: str, shard: int, prefix: str = "rl") -> dict[str, Any]:
    """The RQ job: works one shard for up to the job's shard budget, then re-enqueues itself.

    SIGTERM (to this process) or a warm shutdown of its RQ worker drains it: the
    current item is finished and the unstarted ones released. Returns a report.
    """
    from . import dispatch

    rq_job = get_current_job()
    if rq_job is None:
        raise LeaseError("process_shard runs inside an RQ worker; use work_shard directly")
    job = load_job(job_path)
    store = LeaseStore(rq_job.connection, prefix=prefix, url=_describe(rq_job.connection))
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
        store.client.delete(beat_key)
        store.client.hdel(store.keys.run_jobs(run_id), rq_job.id)
        restore()
    return {
        "run": run_id,
        "shard": shard,
        "committed": report.committed,
        "failed": report.failed,
        "stale": report.stale,
        "released": report.released,
        "stopped": report.stopped,
        "drained": report.drained,
    }


def _describe(client: redis.Redis) -> str:
    """A URL-like name of the client's server, for error messages (no password)."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


def _worker_stopping(store: LeaseStore, name: str | None) -> bool:
    """True when the RQ worker running this job recorded a warm shutdown request."""
    if not name:
        return False
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
