"""RQ as the transport: shard jobs on queues, JSON-serialized, and their liveness.

Redis state is the truth; an RQ job only says "work this shard for a while".
Lost, repeated or abandoned RQ jobs are harmless because ownership lives in the
items. Jobs use RQ's JSON serializer, never pickle.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
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
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker

from . import takeover
from .bad_jobs import BadJobGuard
from .connection import as_text, queue_time
from .errors import RedisLeaseError
from .job_failures import record_job_failure
from .store import LeaseStore

#: Extra seconds RQ allows a shard job beyond its budget before it kills it.
TIMEOUT_MARGIN = 120
#: How long a queued shard job missing from its queue still counts as live: a worker
#: between taking it and starting it needs a moment; one that died, longer.
MISSING_GRACE_MS = 5_000
#: Statuses of jobs that will run without a worker holding them (queued: see live_jobs).
LIVE_STATUSES = {JobStatus.SCHEDULED, JobStatus.DEFERRED}
SHARD_FUNC = "redis_lease.worker.process_shard"
log = logging.getLogger("redis_lease.worker")
#: Seconds a worker waits for the server to confirm its command channel before it starts.
SUBSCRIBE_WAIT = 5.0
#: The run a worker's first read names (no key of it is ever written).
ACCESS_CHECK_RUN = "worker-access-check"


class JsonJob(RQJob):
    """An RQ job that serializes with JSON unless told otherwise.

    Pass it to rq-scheduler (``rqscheduler -j redis_lease.dispatch.JsonJob``),
    which takes no serializer, so that its jobs are never pickled.
    """

    def __init__(
        self, id: str | None = None, connection: Any = None, serializer: Any = None
    ) -> None:
        super().__init__(id=id, connection=connection, serializer=serializer or JSONSerializer)


class JsonQueue(Queue):
    """An RQ queue whose jobs are JSON (:class:`JsonJob`) unless told otherwise."""

    def __init__(self, name: str = "default", connection: Any = None, **options: Any) -> None:
        options["serializer"] = options.get("serializer") or JSONSerializer
        options["job_class"] = options.get("job_class") or JsonJob
        super().__init__(name, connection=connection, **options)


def json_cron_jobs() -> None:
    """Makes the jobs RQ's cron scheduler enqueues in this process JSON (:class:`JsonQueue`).

    RQ's cron (3.0) takes no serializer or job class: ``rq cron`` accepts ``-S json`` and
    ``--job-class`` but never passes them on, and ``CronJob.enqueue`` builds
    ``rq.cron.Queue(name, connection=...)``, so its jobs are pickled. Call this in the cron
    configuration module (examples/scheduling/rq_cron.py): it points that name at
    :class:`JsonQueue`.

    Raises:
        RedisLeaseError: this RQ's cron does not enqueue through ``rq.cron.Queue``.
    """
    from rq import cron

    current = getattr(cron, "Queue", None)
    if not (isinstance(current, type) and issubclass(current, Queue)):
        raise RedisLeaseError(
            "this RQ's cron does not enqueue through rq.cron.Queue, so its jobs cannot be "
            "made JSON here: tick with redis-lease schedule install and rqscheduler instead"
        )
    cron.Queue = JsonQueue  # type: ignore[attr-defined,assignment]


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


def job_error(job: RQJob, status: Any = None) -> str:
    """The last line of a failed RQ job's error (its exception), or its status."""
    try:
        result = job.latest_result()
    except (redis.RedisError, NoSuchJobError):
        result = None
    text = getattr(result, "exc_string", None) or ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines:
        return lines[-1]
    return f"ended {status or 'without a status'}"


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
    store.scripts.call("shard_status", store.keys.shard(ACCESS_CHECK_RUN, 0), [])
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


def queue(connection: redis.Redis, name: str) -> Queue:
    """An RQ queue that writes JSON jobs."""
    return JsonQueue(name, connection=connection)


def enqueue_shard(
    store: LeaseStore,
    job_path: str,
    queue_name: str,
    run_id: str,
    shard: int,
    budget: float,
    *,
    at_front: bool = False,
) -> str:
    """Enqueues one RQ job that works ``shard`` of ``run_id`` (``at_front``: first in its
    queue, as for a shard taken over from a stopped job); returns its RQ id."""
    rq_id = f"rl-{uuid.uuid4().hex}"
    with store.translating_errors(run_id):
        store.client.hset(store.keys.run_jobs(run_id), rq_id, str(shard))
        queue(store.rq, queue_name).enqueue_call(
            func=SHARD_FUNC,
            args=[job_path, run_id, shard, store.prefix],
            job_id=rq_id,
            timeout=int(budget) + TIMEOUT_MARGIN,
            result_ttl=3600,
            failure_ttl=86400,
            description=f"redis-lease {run_id} shard {shard}",
            at_front=at_front,
        )
    return rq_id


def live_jobs(store: LeaseStore, run_id: str) -> dict[int, list[str]]:
    """The run's live RQ jobs by shard; forgets the ones that ended or died.

    Scheduled and deferred jobs are live, so is a queued job waiting in its
    queue and a started job whose heartbeat key exists (the worker's lease
    keeper renews it, so a killed or paused worker stops counting within a few
    seconds). A queued job missing from its queue (a worker took it and has not
    started it yet, or died doing so; or its queue was lost) counts as live for
    :data:`MISSING_GRACE_MS` after it was first found so, then as dead: RQ
    itself would requeue it only minutes later. A worker drained between taking
    a job and starting it leaves it so; a job counted dead while it was only
    slow to start costs a second job on its shard, which is harmless. A failed job
    still listed is counted on the run: its work horse died (see :func:`_count_failed`).
    """
    key, missing_key = store.keys.run_jobs(run_id), store.keys.run_jobs_missing(run_id)
    with store.translating_errors(run_id):
        known = {as_text(k): int(v) for k, v in store.client.hgetall(key).items()}
        if not known:
            return {}
        ids = list(known)
        jobs = RQJob.fetch_many(ids, connection=store.rq, serializer=JSONSerializer)
        pipe = store.client.pipeline(transaction=False)
        # RQ's queues ride along when RQ shares the store's Redis (one round trip).
        apart = store.rq is not store.client
        waiting_in = store.rq.pipeline(transaction=False) if apart else pipe
        for rq_id, rq_job in zip(ids, jobs, strict=True):
            origin = rq_job.origin if rq_job is not None else ""
            waiting_in.lpos(Queue.redis_queue_namespace_prefix + origin, rq_id)
        for rq_id in ids:
            pipe.exists(store.keys.run_beat(run_id, rq_id))
        pipe.hmget(store.keys.shard_jobs, ids)
        pipe.hgetall(missing_key)
        queue_time(pipe)
        positions = waiting_in.execute() if apart else []
        answers = pipe.execute()
        if not apart:
            positions, answers = answers[: len(ids)], answers[len(ids) :]
        *beats, entries, missing_raw, (seconds, micros) = answers
        registered = dict(zip(ids, entries, strict=True))
        missing = {as_text(k): int(v) for k, v in missing_raw.items()}
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        live: dict[int, list[str]] = {}
        dead: list[str] = []
        found_missing: list[str] = []
        found_again: list[str] = []
        failed: list[tuple[str, RQJob]] = []
        for rq_id, rq_job, beat, waiting in zip(ids, jobs, beats, positions, strict=True):
            status = rq_job.get_status(refresh=False) if rq_job is not None else None
            if (
                status in LIVE_STATUSES
                or (status == JobStatus.QUEUED and waiting is not None)
                or (status == JobStatus.STARTED and beat)
            ):
                live.setdefault(known[rq_id], []).append(rq_id)
                if rq_id in missing:
                    found_again.append(rq_id)
            elif status == JobStatus.QUEUED and (
                now_ms - missing.get(rq_id, now_ms) < MISSING_GRACE_MS
            ):
                live.setdefault(known[rq_id], []).append(rq_id)
                if rq_id not in missing:
                    found_missing.append(rq_id)
            else:
                dead.append(rq_id)
                if status == JobStatus.FAILED and rq_job is not None:
                    failed.append((rq_id, rq_job))
        pipe = store.client.pipeline(transaction=False)
        for rq_id in found_missing:
            pipe.hsetnx(missing_key, rq_id, now_ms)
        if dead:
            pipe.hdel(key, *dead)
        if found_again or dead:
            pipe.hdel(missing_key, *found_again, *dead)
        if found_missing or found_again or dead:
            pipe.execute()
    jobs_by_id = dict(zip(ids, jobs, strict=True))
    taken = {
        rq_id
        for rq_id in dead
        if registered[rq_id] is not None
        and _take_over(store, rq_id, registered[rq_id], jobs_by_id[rq_id])
    }
    for rq_id, rq_job in failed:
        if rq_id not in taken:  # a takeover counted it already
            _count_failed(store, run_id, known[rq_id], rq_job)
    return live


def _take_over(store: LeaseStore, rq_id: str, raw: Any, rq_job: RQJob | None) -> bool:
    """Takes over a dead shard job that registered (it beat, then stopped): its leases end
    now (:mod:`redis_lease.takeover`). True when it was registered and readable."""
    job = takeover.ShardJob.from_json(rq_id, raw)
    if job is None:
        return False
    done = takeover.take_over(store, job, why_stopped(rq_job))
    if done is not None:
        log.warning(done.line())
    return True


def why_stopped(rq_job: RQJob | None) -> str:
    """What is known of a stopped shard job's end: its work horse died (RQ failed it,
    with its error), or only that it stopped beating."""
    try:
        failed = rq_job is not None and rq_job.get_status(refresh=False) == JobStatus.FAILED
    except (redis.RedisError, NoSuchJobError):
        failed = False
    if rq_job is not None and failed:
        return f"work horse died: {job_error(rq_job)}"
    return takeover.STOPPED


def stopped_job_why(store: LeaseStore, job: takeover.ShardJob) -> str:
    """:func:`why_stopped` of a registered shard job, its RQ job read from RQ's Redis."""
    try:
        rq_job = RQJob.fetch(job.rq_id, connection=store.rq, serializer=JSONSerializer)
    except Exception:  # gone, unreadable, or Redis away: the plain reason will do
        return takeover.STOPPED
    return why_stopped(rq_job)


def _count_failed(store: LeaseStore, run_id: str, shard: int, rq_job: RQJob) -> None:
    """Counts a shard job RQ failed that never said so itself (its work horse died).

    A shard job that raises counts itself and leaves the run's jobs before RQ
    marks it failed, so a failed job still listed there ended without a word.
    """
    try:
        record_job_failure(store, run_id, shard, f"work horse died: {job_error(rq_job)}")
    except RedisLeaseError:  # the tick goes on; the next one does not see the job again
        return


def purge_queue(client: redis.Redis, name: str, extra_job_ids: tuple[str, ...] = ()) -> None:
    """Deletes an RQ queue and what RQ keeps for it: its jobs in every registry, its workers.

    For a queue of one's own (a demo's, a test's) on a shared server; RQ's keys
    carry no prefix of ours.
    """
    rq_queue = queue(client, name)
    # A job a worker took but never started (a drain at that moment) waits in the intermediate list.
    intermediate = f"{rq_queue.key}:intermediate"
    ids = {as_text(i) for i in client.lrange(rq_queue.key, 0, -1)} | set(extra_job_ids)
    ids |= {as_text(i) for i in client.lrange(intermediate, 0, -1)}
    registries = [
        rq_queue.started_job_registry,
        rq_queue.finished_job_registry,
        rq_queue.failed_job_registry,
        rq_queue.deferred_job_registry,
        rq_queue.scheduled_job_registry,
        rq_queue.canceled_job_registry,
    ]
    for registry in registries:
        ids |= {as_text(m).split(":")[0] for m in client.zrange(registry.key, 0, -1)}
    for rq_id in ids:
        keys = [f"rq:job:{rq_id}", f"rq:results:{rq_id}", f"rq:executions:{rq_id}"]
        keys += [as_text(k) for k in client.scan_iter(match=f"rq:execution:{rq_id}:*", count=500)]
        client.delete(*keys)
    worker_keys = {as_text(k) for k in client.smembers(f"rq:workers:{name}")}
    for key in client.scan_iter(match="rq:worker:*", count=1000):  # dead ones linger a while
        queues = client.hget(key, "queues") if client.type(key) == b"hash" else None
        if queues is not None and name in as_text(queues).split(","):
            worker_keys.add(as_text(key))
    for worker_key in worker_keys:
        client.delete(worker_key, f"{worker_key}:executions")
        client.srem("rq:workers", worker_key)
    client.srem("rq:queues", rq_queue.key)
    leftovers = [
        as_text(k)
        for pattern in (f"rq:*:{name}", f"rq:queue:{name}:*")
        for k in client.scan_iter(match=pattern, count=500)
    ]
    client.delete(rq_queue.key, intermediate, *[r.key for r in registries], *leftovers)
