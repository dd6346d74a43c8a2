"""The RQ worker classes: RQ's workers, reporting shard jobs, failing bad jobs alone, and
checking at start that the ACL lets them work.

The shard jobs themselves (queues, JSON jobs, enqueueing, liveness) are in
:mod:`redis_lease.fleet.shard_jobs`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import NoPermissionError
from rq import Queue, SimpleWorker, Worker
from rq.command import PUBSUB_CHANNEL_TEMPLATE
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.job_lifecycle import call_exception_handlers
from rq.worker import BaseWorker

from ...protocol.store.lease_store import LeaseStore
from ..shard_jobs import SHARD_FUNC, job_error
from .bad_jobs import BadJobGuard

#: Seconds a worker waits for the server to confirm its command channel before it starts.
SUBSCRIBE_WAIT = 5.0

#: The run a worker's first read names (no key of it is ever written).
ACCESS_CHECK_RUN = "worker-access-check"


class _PromptUnsubscribe:
    """Leaves RQ's command channel without waiting a second for its listener thread.

    RQ unsubscribes, then stops the listener: when the unsubscribe reply wakes
    the listener first, it blocks again (60 s) and RQ's join gives up only after
    one second, so every worker exit took a second. Stopping first lets that
    reply end the listener at once. Since redis-py 8.2 ``stop()`` also waits for
    the listener (up to its 60 s block): here it only clears the flag.
    """

    pubsub: Any
    pubsub_thread: Any

    def unsubscribe(self) -> None:
        """Stops the listener, unsubscribes (its reply wakes the listener), joins it."""
        if self.pubsub_thread:
            try:
                self.pubsub_thread.stop(timeout=0)  # redis-py 8.2+: clear the flag, no wait
            except TypeError:  # earlier redis-py: stop() takes no timeout and never waits
                self.pubsub_thread.stop()
            self.pubsub.unsubscribe()
            self.pubsub_thread.join(timeout=1)
            self.pubsub.close()


class _Reporting(BaseWorker):
    """Says what the worker does with shard jobs, one line each, and counts the failed ones.

    Lines go to :attr:`say` (nothing is said when it is None): one per shard job
    (its run, shard, items committed and failed, seconds; or its error) and one
    when a stop signal arrives. They come from the worker's own process, after
    each job, whether it ran in a forked work horse or in place.
    """

    say: Callable[[str], None] | None = None
    #: Called once RQ has registered the worker and subscribed it (its bootstrap), before
    #: its first job: ``worker`` prints its start line then, not before.
    started: Callable[[], None] | None = None
    #: Whether a failed shard job's traceback is logged (``worker --verbose``).
    tracebacks = True
    #: Shard jobs run, and those of them that failed (raised, or their work horse died).
    shard_jobs = 0
    failed_shard_jobs = 0
    #: The last failed shard job's run, shard and error.
    last_failure = ""
    #: Leases the shard jobs lost to other workers (taken over while held).
    lost_leases = 0
    #: The key prefixes of the shard jobs run (the fleet watch watches them).
    shard_prefixes: frozenset[str] = frozenset()

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """Registers and subscribes the worker as RQ does, then calls :attr:`started`."""
        super().bootstrap(*args, **kwargs)
        if self.started is not None:
            self.started()

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """RQ's loop. A command the ACL refuses in it ends the loop, as RQ does with any
        error, and is raised once the worker has stopped (its one line names what to grant),
        instead of RQ's logged traceback and a clean exit."""
        refusals = _Refusals()
        self.log.addFilter(refusals)
        try:
            worked = bool(super().work(*args, **kwargs))
        finally:
            self.log.removeFilter(refusals)
        if refusals.error is not None:
            raise refusals.error
        return worked

    def execute_job(self, job: RQJob, queue: Queue) -> None:
        """Runs the job as RQ does, then reports it when it is a shard job."""
        started = time.monotonic()
        if job.func_name == SHARD_FUNC:
            args = list(job.args or ())
            if len(args) > 3 and isinstance(args[3], str):
                self.shard_prefixes = self.shard_prefixes | {args[3]}
        super().execute_job(job, queue)
        if job.func_name == SHARD_FUNC:
            self._report(job, time.monotonic() - started)

    def _report(self, job: RQJob, seconds: float) -> None:
        args = list(job.args or ())
        run_id, shard = (args[1], args[2]) if len(args) > 2 else ("?", "?")
        where = f"run {run_id} shard {shard}"
        self.shard_jobs += 1
        try:
            status = job.get_status(refresh=True)
            result = job.return_value(refresh=True) if status == JobStatus.FINISHED else None
        except (redis.RedisError, NoSuchJobError):
            status, result = None, None
        if isinstance(result, dict):
            line = (
                f"{where}: committed {result.get('committed', 0)}, failed "
                f"{result.get('failed', 0)} in {seconds:.1f}s"
            )
            lost = int(result.get("stale") or 0)
            self.lost_leases += lost
            if lost:
                line += f", {lost} leases lost to other workers"
            if result.get("stopped"):
                line += " (stopped: unstarted items released)"
        elif status == JobStatus.FINISHED:  # its result is not kept
            line = f"{where}: finished in {seconds:.1f}s"
        else:
            self.failed_shard_jobs += 1
            self.last_failure = f"{where}: {job_error(job, status)}"
            line = f"{where}: job failed after {seconds:.1f}s: {job_error(job, status)}"
        if self.say is not None:
            self.say(line)

    def handle_exception(self, job: RQJob, *exc_info: Any) -> None:
        """Logs a job's traceback as RQ does, but not a shard job's when :attr:`tracebacks`
        is off: its line says the error, and RQ keeps the traceback with the job."""
        if self.tracebacks or job.func_name != SHARD_FUNC:
            super().handle_exception(job, *exc_info)
            return
        call_exception_handlers(self._exc_handlers, job, *exc_info)

    def request_stop(self, signum: int, frame: Any) -> None:
        """Says that a stop signal arrived, then stops warmly as RQ does."""
        if self.say is not None:
            self.say(
                f"worker {self.name}: {signal.Signals(signum).name}: finishing the current shard "
                "job (its unstarted items are released), then stopping; again to stop at once"
            )
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]


class _Refusals(logging.Filter):
    """Keeps out of RQ's log, and holds, the ACL refusal (NOPERM) that ended its loop."""

    error: NoPermissionError | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        """False (not logged) for a record of a refused command; it is held in :attr:`error`."""
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, NoPermissionError):
            self.error = error
            return False
        return True


class LeaseWorker(_PromptUnsubscribe, _Reporting, BadJobGuard, Worker):
    """RQ's forking worker that reports shard jobs, fails bad jobs alone and exits promptly
    (see the mixins)."""


class SimpleLeaseWorker(_PromptUnsubscribe, _Reporting, BadJobGuard, SimpleWorker):
    """RQ's in-process worker that reports shard jobs, fails bad jobs alone and exits
    promptly (see the mixins)."""


def check_worker_access(store: LeaseStore, connection: redis.Redis, name: str) -> None:
    """Sends what a worker needs of its Redis users before it starts, so that a refusal of the
    ACL is one error here: not RQ's warning ("CLIENT SETNAME command not supported"), a
    traceback of its listener thread, or shard jobs failing one by one. A read-only script on
    the store's keys; on RQ's ``connection``, CLIENT SETNAME ``name``, CLIENT INFO (Redis
    6.2+) and a subscription to the worker's channel. RQ's registration comes next, before
    the worker says it started (:attr:`_Reporting.started`).

    Raises:
        redis.RedisError: what the server refused (the caller translates it).
    """
    store.scripts.call("shard_status", store.keys.status(ACCESS_CHECK_RUN, 0), [])
    connection.client_setname(name)
    try:
        connection.client_info()
    except NoPermissionError:
        raise
    except redis.ResponseError:  # before Redis 6.2: RQ reads CLIENT LIST instead
        pass
    pubsub = connection.pubsub()
    try:
        pubsub.subscribe(PUBSUB_CHANNEL_TEMPLATE % name)
        deadline = time.monotonic() + SUBSCRIBE_WAIT
        while time.monotonic() < deadline:  # the confirmation, or the refusal (raised)
            if pubsub.get_message(timeout=deadline - time.monotonic()) is not None:
                break
    finally:
        pubsub.close()
