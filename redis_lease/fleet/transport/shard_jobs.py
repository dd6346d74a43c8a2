"""RQ as the transport: shard jobs on queues, JSON-serialized, their liveness, and the
store an RQ job of this project works on in a worker process (:func:`job_store`).

Redis state is the truth; an RQ job only says "work this shard for a while".
Lost, repeated or abandoned RQ jobs are harmless because ownership lives in the
items. Jobs use RQ's JSON serializer, never pickle. The workers that run them are
:mod:`redis_lease.dispatch`'s.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from ...errors import RedisLeaseError
from ...limits import DEFAULT_PREFIX
from ...protocol.connection.clients import (
    as_text,
    client_from_url,
    describe,
    queue_time,
    resilient,
    time_ms,
)
from ...protocol.connection.replica_wait import ReplicaWait
from ...protocol.store.lease_store import LeaseStore
from . import takeover
from .shard_job_failures import record_job_failure

#: Extra seconds RQ allows a shard job beyond its budget before it kills it.
TIMEOUT_MARGIN = 120

#: How long a queued shard job missing from its queue still counts as live: a worker
#: between taking it and starting it needs a moment; one that died, longer.
MISSING_GRACE_MS = 5_000

#: Statuses of jobs that will run without a worker holding them (queued: see live_jobs).
LIVE_STATUSES = {JobStatus.SCHEDULED, JobStatus.DEFERRED}

SHARD_FUNC = "redis_lease.worker.process_shard"

log = logging.getLogger("redis_lease.worker")


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

    It first takes over the registered shard jobs that are dead by the server's clock
    (:func:`redis_lease.fleet.transport.takeover.sweep`, as a worker's watch does). A registered
    shard job is live: the registry judges it, not RQ's status (which RQ's cleanup sets from the
    clock of whichever worker runs it), except when RQ failed it because it saw its work
    horse die: that job is taken over now. Scheduled and deferred jobs are live, so
    is a queued job waiting in its queue, and a started job whose beat key lives (one about
    to register, or one of a worker of 0.9.0). A queued job missing from its queue (a
    worker took it and has not started it yet, or died doing so; or its queue was lost)
    counts as live for :data:`MISSING_GRACE_MS` after it was first found so, then as dead:
    RQ itself would requeue it only minutes later. A worker drained between taking a job
    and starting it leaves it so; a job counted dead while it was only slow to start costs
    a second job on its shard, which is harmless. A failed job still listed, and not
    registered, is counted on the run: its work horse died before it registered (see
    :func:`_count_failed`), unless RQ's cleanup called it abandoned (see :func:`_abandoned`).
    """
    takeover.sweep(store, why=lambda job: stopped_job_why(store, job))
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
        pipe.hmget(store.keys.shard_job_registry[0], ids)
        pipe.hgetall(missing_key)
        queue_time(pipe)
        positions = waiting_in.execute() if apart else []
        answers = pipe.execute()
        if not apart:
            positions, answers = answers[: len(ids)], answers[len(ids) :]
        *beats, entries, missing_raw, now = answers
        registered = dict(zip(ids, entries, strict=True))
        missing = {as_text(k): int(v) for k, v in missing_raw.items()}
        now_ms = time_ms(now)
        live: dict[int, list[str]] = {}
        dead: list[str] = []
        found_missing: list[str] = []
        found_again: list[str] = []
        failed: list[tuple[str, RQJob]] = []
        horse_died: list[tuple[str, RQJob]] = []
        for rq_id, rq_job, beat, waiting in zip(ids, jobs, beats, positions, strict=True):
            status = rq_job.get_status(refresh=False) if rq_job is not None else None
            if (
                registered[rq_id] is not None
                and status == JobStatus.FAILED
                and rq_job is not None
                and not _abandoned(rq_job)
            ):  # RQ saw its work horse die: it beats no more, and is taken over now
                dead.append(rq_id)
                horse_died.append((rq_id, rq_job))
            elif (
                registered[rq_id] is not None
                or status in LIVE_STATUSES
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
                if status == JobStatus.FAILED and rq_job is not None and not _abandoned(rq_job):
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
    for rq_id, rq_job in horse_died:
        _take_over_dead(store, rq_id, registered[rq_id], rq_job)
    for rq_id, rq_job in failed:
        _count_failed(store, run_id, known[rq_id], rq_job)
    return live


def _take_over_dead(store: LeaseStore, rq_id: str, raw: Any, rq_job: RQJob) -> None:
    """Takes over a registered shard job whose work horse RQ saw die (it failed the job
    for it): its leases end now, whatever its last beats say."""
    job = takeover.ShardJob.from_json(rq_id, raw)
    if job is None:
        return
    done = takeover.take_over(store, job, why_stopped(rq_job), known_dead=True)
    if done is not None:
        log.warning(done.line())


def _abandoned(rq_job: RQJob) -> bool:
    """True when RQ failed the job as abandoned: its cleanup found the job's entry in a
    started registry expired, by the clock of whichever worker cleaned, so a job that runs
    on a worker whose clock is behind is "abandoned" by one whose clock is ahead. Not
    counted as a shard job failure: a shard job that runs is judged by the registry."""
    return "AbandonedJobError" in job_error(rq_job, "")


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


# -- the store an RQ job works on -------------------------------------------------
# By default RQ's own Redis (the job's connection): lease state and queues share one
# server. A worker started with a queue URL of its own (RQ on a plain Redis, the lease
# state on a cluster) names the lease store's URL with use_lease_url; its jobs, forked
# or not, then open that store, with RQ's connection for what they enqueue. A worker whose
# store waits for replicas says so with use_replica_wait: RQ's connection carries no URL.

_lease_url: str | None = None
_replica_wait: ReplicaWait | None = None


def use_lease_url(url: str | None) -> None:
    """The lease store's URL for this process's jobs (None: RQ's own Redis)."""
    global _lease_url
    _lease_url = url


def use_replica_wait(wait: ReplicaWait | None) -> None:
    """The replicas this process's jobs wait for after each claim and intent (None: none)."""
    global _replica_wait
    _replica_wait = wait


def job_store(rq_connection: redis.Redis, prefix: str = DEFAULT_PREFIX) -> LeaseStore:
    """A store of the job's own, whose connections retry
    (:func:`~redis_lease.protocol.connection.clients.resilient`).

    It waits for the replicas :func:`use_replica_wait` named. Close it with
    :meth:`LeaseStore.close` when the job ends; RQ's connection is left open.
    """
    rq_client = resilient(rq_connection)
    replicas = _replica_wait.replicas if _replica_wait else 0
    timeout_ms = _replica_wait.timeout_ms if _replica_wait else None
    if _lease_url is None:
        return LeaseStore(
            rq_client,
            prefix=prefix,
            url=describe(rq_client),
            wait_replicas=replicas,
            wait_timeout_ms=timeout_ms,
        )
    try:
        client = client_from_url(_lease_url)
    except BaseException:
        if rq_client is not rq_connection:
            rq_client.close()
        raise
    return LeaseStore(
        client,
        prefix=prefix,
        url=_lease_url,
        rq_client=rq_client,
        wait_replicas=replicas,
        wait_timeout_ms=timeout_ms,
    )


def close_job_store(store: LeaseStore, rq_connection: redis.Redis) -> None:
    """Closes what :func:`job_store` opened, not RQ's own connection."""
    if store.client is not rq_connection:
        store.client.close()
    if store.rq is not rq_connection and store.rq is not store.client:
        store.rq.close()
