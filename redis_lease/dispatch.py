"""RQ as the transport: shard jobs on queues, JSON-serialized, and their liveness.

Redis state is the truth; an RQ job only says "work this shard for a while".
Lost, repeated or abandoned RQ jobs are harmless because ownership lives in the
items. Jobs use RQ's JSON serializer, never pickle.
"""

from __future__ import annotations

import uuid
from typing import Any

import redis
from rq import Queue, SimpleWorker, Worker
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from .connection import as_text
from .store import LeaseStore

#: Extra seconds RQ allows a shard job beyond its budget before it kills it.
TIMEOUT_MARGIN = 120
#: How long a queued shard job missing from its queue still counts as live: a worker
#: between taking it and starting it needs a moment; one that died, longer.
MISSING_GRACE_MS = 5_000
#: Statuses of jobs that will run without a worker holding them (queued: see live_jobs).
LIVE_STATUSES = {JobStatus.SCHEDULED, JobStatus.DEFERRED}
SHARD_FUNC = "redis_lease.worker.process_shard"


class JsonJob(RQJob):
    """An RQ job that serializes with JSON unless told otherwise.

    Pass it to rq-scheduler (``rqscheduler -j redis_lease.dispatch.JsonJob``),
    which takes no serializer, so that its jobs are never pickled.
    """

    def __init__(
        self, id: str | None = None, connection: Any = None, serializer: Any = None
    ) -> None:
        super().__init__(id=id, connection=connection, serializer=serializer or JSONSerializer)


class _PromptUnsubscribe:
    """Leaves RQ's command channel without waiting a second for its listener thread.

    RQ unsubscribes, then stops the listener: when the unsubscribe reply wakes
    the listener first, it blocks again (60 s) and RQ's join gives up only after
    one second, so every worker exit took a second. Stopping first lets that
    reply end the listener at once.
    """

    pubsub: Any
    pubsub_thread: Any

    def unsubscribe(self) -> None:
        """Stops the listener, unsubscribes (its reply wakes the listener), joins it."""
        if self.pubsub_thread:
            self.pubsub_thread.stop()
            self.pubsub.unsubscribe()
            self.pubsub_thread.join(timeout=1)
            self.pubsub.close()


class LeaseWorker(_PromptUnsubscribe, Worker):
    """RQ's forking worker that exits promptly (see :class:`_PromptUnsubscribe`)."""


class SimpleLeaseWorker(_PromptUnsubscribe, SimpleWorker):
    """RQ's in-process worker that exits promptly (see :class:`_PromptUnsubscribe`)."""


def queue(connection: redis.Redis, name: str) -> Queue:
    """An RQ queue that writes JSON jobs."""
    return Queue(name, connection=connection, serializer=JSONSerializer, job_class=JsonJob)


def enqueue_shard(
    store: LeaseStore,
    job_path: str,
    queue_name: str,
    run_id: str,
    shard: int,
    budget: float,
) -> str:
    """Enqueues one RQ job that works ``shard`` of ``run_id``; returns its RQ id."""
    rq_id = f"rl-{uuid.uuid4().hex}"
    with store.errors(run_id):
        store.client.hset(store.keys.run_jobs(run_id), rq_id, str(shard))
        queue(store.client, queue_name).enqueue_call(
            func=SHARD_FUNC,
            args=[job_path, run_id, shard, store.prefix],
            job_id=rq_id,
            timeout=int(budget) + TIMEOUT_MARGIN,
            result_ttl=3600,
            failure_ttl=86400,
            description=f"redis-lease {run_id} shard {shard}",
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
    slow to start costs a second job on its shard, which is harmless.
    """
    key, missing_key = store.keys.run_jobs(run_id), store.keys.run_jobs_missing(run_id)
    with store.errors(run_id):
        known = {as_text(k): int(v) for k, v in store.client.hgetall(key).items()}
        if not known:
            return {}
        ids = list(known)
        jobs = RQJob.fetch_many(ids, connection=store.client, serializer=JSONSerializer)
        pipe = store.client.pipeline(transaction=False)
        for rq_id, rq_job in zip(ids, jobs, strict=True):
            pipe.exists(store.keys.run_beat(run_id, rq_id))
            origin = rq_job.origin if rq_job is not None else ""
            pipe.lpos(Queue.redis_queue_namespace_prefix + origin, rq_id)
        pipe.hgetall(missing_key)
        pipe.time()
        *answers, missing_raw, (seconds, micros) = pipe.execute()
        missing = {as_text(k): int(v) for k, v in missing_raw.items()}
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        live: dict[int, list[str]] = {}
        dead: list[str] = []
        found_missing: list[str] = []
        found_again: list[str] = []
        for rq_id, rq_job, beat, waiting in zip(
            ids, jobs, answers[::2], answers[1::2], strict=True
        ):
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
        pipe = store.client.pipeline(transaction=False)
        for rq_id in found_missing:
            pipe.hsetnx(missing_key, rq_id, now_ms)
        if dead:
            pipe.hdel(key, *dead)
        if found_again or dead:
            pipe.hdel(missing_key, *found_again, *dead)
        if found_missing or found_again or dead:
            pipe.execute()
    return live


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
