"""The RQ worker classes: RQ's workers, reporting shard jobs, failing bad jobs alone, and
checking at start that the ACL lets them work; a worker built from its settings
(:func:`build_worker`) and run with its heartbeat thread beside it (:func:`run_worker`).

The shard jobs themselves (queues, JSON jobs, enqueueing, liveness) are in
:mod:`redis_lease.fleet.transport.shard_jobs`.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from redis.exceptions import NoPermissionError
from rq import Queue, SimpleWorker, Worker
from rq.command import PUBSUB_CHANNEL_TEMPLATE
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.job_lifecycle import call_exception_handlers
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker

from ...protocol.store.lease_store import LeaseStore
from ...protocol.store.stamp import check_protocol
from ...protocol.validation import check_id
from ..full_redis import riding_out_full
from ..jobs.job import check_concurrency, with_cwd_on_path
from ..transport.shard_jobs import (
    SHARD_FUNC,
    JsonJob,
    job_error,
    queue,
    use_lease_url,
    use_replica_wait,
)
from .bad_jobs import BadJobGuard
from .shard_job import CONCURRENCY_ENV
from .watch import FleetWatch

#: Seconds a worker waits for the server to confirm its command channel before it starts.
SUBSCRIBE_WAIT = 5.0

#: The queue a worker works when none is named.
DEFAULT_QUEUE = "redis-lease"

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
    #: The key prefixes of the shard jobs run (the FleetWatch checks their heartbeats).
    shard_prefixes: frozenset[str] = frozenset()
    #: Whether the worker's RQ connection is its own (closed when :func:`run_worker` ends).
    own_connection = False

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
            if result.get("full"):  # said once a minute, not once per job (full_redis)
                return
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
    the store's keys (and a WAIT when the store waits for replicas); on RQ's
    ``connection``, CLIENT SETNAME ``name``, CLIENT INFO (Redis
    6.2+) and a subscription to the worker's channel. RQ's registration comes next, before
    the worker says it started (:attr:`_Reporting.started`).

    Raises:
        redis.RedisError: what the server refused (the caller translates it).
    """
    store.scripts.call("shard_status", store.keys.status(ACCESS_CHECK_RUN, 0), [])
    if store.replica_wait is not None:  # its claims wait for replicas: WAIT must be allowed
        store.client.wait(0, 1)
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


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker is built from (``redis-lease worker``'s options); checked when made.

    Attributes:
        queues: the queues it works.
        simple: run jobs in its own process (no fork per job).
        name: the RQ worker's name (None: a new random one, as RQ's).
        tracebacks: log every RQ job, and failed shard jobs' tracebacks.
        concurrency: handlers each shard job runs at once (None: the jobs' own).
        lease_url: the lease store's URL when RQ's queues are on another Redis.
        say: where the worker's lines go (None: nowhere).

    Raises:
        InvalidInput: a queue name or the concurrency is not acceptable.
    """

    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    simple: bool = False
    name: str | None = None
    tracebacks: bool = False
    concurrency: int | None = None
    lease_url: str | None = None
    say: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        for queue_name in self.queues:
            check_id(queue_name, "queue")
        if self.concurrency is not None:
            check_concurrency(self.concurrency)


def build_worker(store: LeaseStore, settings: WorkerSettings) -> LeaseWorker | SimpleLeaseWorker:
    """A worker ready to :func:`run <run_worker>`: the protocol stamp checked first (and
    stamped where there is none), then RQ's worker (forking, or in-process when
    ``settings.simple``) on the store's RQ Redis, JSON jobs, its access checked
    (:func:`check_worker_access`), the shard jobs' concurrency and lease store set for this
    process (and the replicas its claims wait for: the store's), and the working directory
    on the import path (jobs import from it). Both entry points build their worker here:
    ``redis-lease worker`` and :func:`redis_lease.run_worker`.

    Raises:
        ProtocolMismatch: the data under the prefix is in a protocol this release does not
            speak (exit 9); nothing was written.
        InvalidInput: the store is on a cluster and has no queue URL.
        RedisUnavailable: the server refused what the worker needs (PermissionDenied).
    """
    check_protocol(store)  # before anything is written, from Python as from the CLI
    if settings.concurrency is not None:  # read by the shard jobs, forked or not
        os.environ[CONCURRENCY_ENV] = str(settings.concurrency)
    name = settings.name or uuid.uuid4().hex  # RQ's default name, known before RQ starts
    with store.translating_errors():
        checked = store.rq  # RQ's Redis: the store's, or the queue URL's
        check_worker_access(store, checked, name)
    # RQ's loop quits at an error it does not expect: on a full Redis its calls wait instead
    client = riding_out_full(checked, f"worker {name}")
    use_lease_url(settings.lease_url)
    use_replica_wait(store.replica_wait)  # the jobs' stores wait for the replicas this one does
    worker_class = SimpleLeaseWorker if settings.simple else LeaseWorker
    worker = worker_class(
        [queue(client, n) for n in settings.queues],
        connection=client,
        serializer=JSONSerializer,
        job_class=JsonJob,
        name=name,
    )
    with_cwd_on_path()  # the shard jobs' modules import from here, forked or not
    worker.say = settings.say
    worker.tracebacks = settings.tracebacks
    worker.bad_job_store = store
    worker.own_connection = client is not checked
    return worker


class Beside(Protocol):
    """A thread a worker runs beside its RQ loop (the tick leader): started once the worker
    started, closed when it stops."""

    def start(self) -> None:
        """Starts the thread."""

    def close(self) -> None:
        """Stops it, and undoes what it holds."""


def run_worker(
    worker: LeaseWorker | SimpleLeaseWorker,
    store: LeaseStore,
    *,
    burst: bool = False,
    started: Callable[[], None] | None = None,
    beside: Sequence[Beside] = (),
) -> None:
    """Works the worker's queues until stopped (or until they are empty, with ``burst``).

    A :class:`~redis_lease.fleet.worker.watch.FleetWatch` thread runs beside it. Once RQ
    has registered the worker, the thread sends its first heartbeat and looks for dead shard
    jobs (a refusal is raised as this library's error). Then ``started`` is called, and the
    thread repeats this every second until the worker stops. The threads of ``beside``
    start after ``started`` and are closed when the worker stops."""
    queues = worker.queue_names()
    watch = FleetWatch(
        store, worker.name, queues, say=worker.say, prefixes=lambda: worker.shard_prefixes
    )

    def on_started() -> None:
        with store.translating_errors():
            watch.tick()
        if started is not None:
            started()
        watch.start()
        for thread in beside:
            thread.start()
            running.append(thread)

    running: list[Beside] = []
    worker.started = on_started
    try:
        worker.work(burst=burst, logging_level="INFO" if worker.tracebacks else "WARNING")
    finally:
        for thread in running:
            thread.close()
        if watch.is_alive():
            watch.close()
        if worker.own_connection:
            worker.connection.close()
