"""The RQ job that works one shard: :func:`process_shard`.

It sets up what :func:`~redis_lease.fleet.worker.shard_loop.work_shard` (the shard loop, which
needs no RQ) works under, and records what the pass did. While handlers run, a
:class:`~redis_lease.fleet.worker.lease_keeper.LeaseKeeper` thread renews the process's leases
(conditional on their tokens) and sends the shard job's heartbeat; a lease that
cannot be renewed is marked lost, which stops its handler.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from rq import get_current_job

from ...errors import InvalidInput, LeaseError, RedisFull, RedisLeaseError
from ...limits import DEFAULT_PREFIX
from ...protocol.connection.server_checks import eviction_danger
from ...protocol.connection.translate import REDIS_FAILURES, translating_errors
from ...protocol.connection.urls import safe_url
from ...protocol.store.lease_store import LeaseStore
from ..capacity import run_capacity
from ..full_redis import notice_full
from ..jobs.job import Job, check_concurrency, load_job
from ..jobs.live_lease import ActiveLease
from ..runs.lifecycle import Runs
from ..runs.run_states import RUNNING
from ..transport import shard_jobs, takeover
from ..transport.shard_job_failures import end_failure_streak, record_job_failure
from ..transport.shard_jobs import close_job_store, job_store
from .handler_outcomes import HandlerResult, ShardReport
from .lease_keeper import LeaseKeeper
from .shard_loop import work_shard

log = logging.getLogger("redis_lease.worker")

__all__ = [
    "ActiveLease",
    "HandlerResult",
    "LeaseKeeper",
    "ShardReport",
    "process_shard",
    "work_shard",
]
#: The environment variable through which ``redis-lease worker --concurrency N`` reaches
#: its job processes; it overrides the jobs' ``concurrency`` option.
CONCURRENCY_ENV = "REDIS_LEASE_CONCURRENCY"


def worker_name(rq_job_id: str) -> str:
    """A lease owner name: host, process and RQ job."""
    host = "".join(c if c.isalnum() or c in "-._" else "-" for c in socket.gethostname())
    return f"{host or 'host'}:{os.getpid()}:{rq_job_id[-8:]}"


def process_shard(
    job_path: str, run_id: str, shard: int, prefix: str = DEFAULT_PREFIX
) -> dict[str, Any]:
    """The RQ job: works one shard for up to the job's shard budget, then re-enqueues itself.

    Its store (:func:`~redis_lease.fleet.transport.shard_jobs.job_store`: RQ's server, or the lease
    store the worker was started with) retries connection errors and timeouts, so a reset
    costs a reconnect, not the job. SIGTERM (to this process) or a warm shutdown
    of its RQ worker drains it: the current item is finished and the unstarted
    ones released. Returns a report.

    A shard job that raises (its job does not import, has no handler, or a bug
    outside the handler's own call) is counted on its run with its error
    (:func:`~redis_lease.fleet.transport.shard_job_failures.record_job_failure`, shown by
    ``status``) before RQ
    marks it failed; one that ends normally ends the run's streak of failures and its
    dispatch back-off.
    """
    rq_job = get_current_job()
    if rq_job is None:
        raise LeaseError("process_shard runs inside an RQ worker; use work_shard directly")
    store = job_store(rq_job.connection, prefix)
    ended = False
    try:
        report = _process(store, rq_job, job_path, run_id, shard)
        ended = not report["taken_over"]  # a job taken over was counted failed by its taker
        return report
    except RedisFull as error:  # not the job's failure: the tick dispatches the shard again
        notice_full(error, f"shard job of run {run_id!r} shard {shard}")
        return {"taken_over": False, "run": run_id, "shard": shard, "full": True}
    except Exception as error:  # counted on the run (status shows it), then RQ fails the job
        _record_failure(store, run_id, shard, error)
        raise
    finally:
        # Whether or not the setup (import, first beat) got through: a job left among
        # the run's jobs would be counted failed a second time by the tick.
        _forget_job(store, run_id, rq_job.id, ended)
        close_job_store(store, rq_job.connection)


def _process(
    store: LeaseStore, rq_job: Any, job_path: str, run_id: str, shard: int
) -> dict[str, Any]:
    """The shard job's work: one pass over the shard under a kept lease set; its report."""
    job = load_job(job_path)
    _log_danger(store)
    stop = threading.Event()
    name = rq_job.worker_name
    keeper = LeaseKeeper(
        store,
        job.options.lease_ttl_seconds,
        beat_key=store.keys.run_beat(run_id, rq_job.id),
        stop_flag=(f"rq:worker:{name}", "shutdown_requested_date") if name else None,
        job_id=rq_job.id,
    )
    owner = worker_name(rq_job.id)
    registration = _registration(rq_job, job_path, job, run_id, shard, owner)
    takeover.register(store, registration, keeper.beat_value())  # registered with its first beat
    keeper.on_stop_requested = stop.set
    taken = threading.Event()

    def on_unregistered() -> None:  # taken over: stop claiming, give back what is not started
        taken.set()
        stop.set()

    keeper.on_unregistered = on_unregistered
    restore = _drain_on_sigterm(stop)
    keeper.start()
    started = time.monotonic()
    try:
        report = work_shard(
            store,
            job,
            run_id,
            shard,
            worker=owner,
            budget=job.options.shard_budget_seconds,
            stop=stop,
            keeper=keeper,
            concurrency=concurrency_override(),
        )
        _record_pass(store, run_id, report, time.monotonic() - started)
        if taken.is_set():  # its taker enqueued the shard's next job
            log.warning(
                "shard job %s of run %r shard %s is no longer registered: it stopped "
                "claiming and ends (whoever took it over enqueued the shard's next job)",
                rq_job.id,
                run_id,
                shard,
            )
        elif not report.drained and not report.closed:
            _enqueue_next(store, job_path, job, run_id, shard)
        elif report.drained:
            _end_if_done(store, run_id)
    finally:
        keeper.close()
        restore()
    return {
        "taken_over": taken.is_set(),
        "run": run_id,
        "shard": shard,
        "committed": report.committed,
        "failed": report.failed,
        "stale": report.stale,
        "released": report.released,
        "abandoned": report.abandoned,
        "stopped": report.stopped,
        "drained": report.drained,
        "handled": report.handled,
        "handler_seconds": round(report.handler_seconds, 6),
    }


def _enqueue_next(store: LeaseStore, job_path: str, job: Job, run_id: str, shard: int) -> None:
    """Enqueues the shard's next job; on a full Redis, leaves it to the tick's dispatch."""
    try:
        shard_jobs.enqueue_shard(
            store, job_path, job.options.queue, run_id, shard, job.options.shard_budget_seconds
        )
    except RedisFull as error:
        notice_full(error, f"the next shard job of run {run_id!r} shard {shard}")


def _end_if_done(store: LeaseStore, run_id: str) -> None:
    """Finalizes the run when no item of it is left to work (as the tick would at its next
    look), so that its end, and whatever waits for it, does not wait for the tick. Safe
    beside the tick: a run ends once (the state changes from an open one only), and a run
    still planning is left to its planner."""
    try:
        status = store.status(run_id)
        if status.state == RUNNING and status.unfinished == 0:
            Runs(store).finalize(run_id, "no item left to work")
    except (RedisLeaseError, *REDIS_FAILURES) as error:  # the tick ends it at its next look
        log.warning("run %r: could not end it after its last item: %s", run_id, error)


def _registration(
    rq_job: Any, job_path: str, job: Job, run_id: str, shard: int, owner: str
) -> takeover.ShardJob:
    """What the shard job registers: who runs it, and what a replacement would run."""
    return takeover.ShardJob(
        rq_id=rq_job.id,
        run_id=run_id,
        shard=shard,
        worker=str(rq_job.worker_name or ""),
        owner=owner,
        host=socket.gethostname(),
        pid=os.getpid(),
        path=job_path,
        queue=job.options.queue,
        budget=job.options.shard_budget_seconds,
    )


def _record_failure(store: LeaseStore, run_id: str, shard: int, error: Exception) -> None:
    """Counts the failed shard job on its run, with its error (best effort: logged otherwise)."""
    try:
        record_job_failure(store, run_id, shard, f"{type(error).__name__}: {error}")
    except RedisLeaseError as failure:
        if not notice_full(failure, f"shard job of run {run_id!r}"):
            log.warning(
                "could not record the failure of a shard job of run %r: %s", run_id, failure
            )


def _record_pass(store: LeaseStore, run_id: str, report: ShardReport, busy: float) -> None:
    """Adds the pass's handler count and times to the run's measured capacity (best effort).

    A pass that handled nothing is not recorded: its idle time would drag the rate down.
    """
    if not report.handled:
        return
    try:
        run_capacity.record_pass(store, run_id, report.handled, report.handler_seconds, busy)
    except RedisLeaseError as error:
        log.warning("could not record the pass of run %r: %s", run_id, error)


def _forget_job(store: LeaseStore, run_id: str, rq_id: str, ended: bool) -> None:
    """Removes the job from the run's jobs and what its beats said, then unregisters it
    (two round trips: a tick never finds it among the run's jobs unregistered, where RQ's
    status, which RQ's cleanup may set by a skewed clock, would judge it).

    A job that ``ended`` normally also ends the run's streak of failed shard jobs and its
    dispatch back-off, in one script
    (:func:`~redis_lease.fleet.transport.shard_job_failures.end_failure_streak`). Best effort:
    when Redis is gone, its registry entry gets no more heartbeats, and another worker takes
    over whatever the job still held.
    """
    try:
        with translating_errors(store.url, run_id=run_id):
            pipe = store.client.pipeline(transaction=False)
            pipe.hdel(store.keys.run_jobs(run_id), rq_id)
            pipe.hdel(store.keys.run_jobs_missing(run_id), rq_id)
            pipe.delete(store.keys.run_beat(run_id, rq_id))
            pipe.execute()
        takeover.unregister(store, rq_id)
        with translating_errors(store.url, run_id=run_id):
            if ended:  # apart: a cluster's pipeline does not load scripts
                end_failure_streak(store, run_id)
    except RedisLeaseError as error:
        if not notice_full(error, f"shard job {rq_id} of run {run_id!r}"):
            log.warning(
                "could not remove the heartbeat of job %s of run %r: %s", rq_id, run_id, error
            )


_dangers_logged: set[str] = set()


def _log_danger(store: LeaseStore) -> None:
    """Logs, once per server and process, an error when the server may evict keys."""
    if store.url in _dangers_logged:
        return
    _dangers_logged.add(store.url)
    try:
        danger = eviction_danger(store.client)
    except REDIS_FAILURES:  # the check must never stop the work
        return
    if danger:
        log.error("danger: Redis at %s: %s", safe_url(store.url), danger)


def concurrency_override() -> int | None:
    """The worker's ``--concurrency`` (from :data:`CONCURRENCY_ENV`), or None when not given."""
    raw = os.environ.get(CONCURRENCY_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(
            f"{CONCURRENCY_ENV}={raw!r} is not a whole number; give --concurrency N"
        ) from None
    return check_concurrency(value)


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
