"""RQ jobs for the dashboard's RQ tests: made by RQ itself (a burst of a worker in this
process), and jobs RQ cannot read, planted as anyone who can write ``rq:*`` could."""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from rq.serializers import JSONSerializer

from redis_lease.fleet.transport import shard_jobs
from redis_lease.fleet.transport.shard_jobs import JsonJob
from redis_lease.fleet.worker.rq_worker import SimpleLeaseWorker


def raise_error(message: str) -> None:
    """An RQ job that fails with ``message`` (its traceback ends with it)."""
    raise RuntimeError(message)


def burst(client: redis.Redis, queue_name: str, name: str) -> None:
    """Works ``queue_name`` until it is empty with an RQ worker in this process (the
    project's, which leaves RQ's command channel without waiting for its listener)."""
    queue = shard_jobs.queue(client, queue_name)
    worker = SimpleLeaseWorker(
        [queue], connection=client, serializer=JSONSerializer, job_class=JsonJob, name=name
    )
    worker.work(burst=True)


def failed_job(client: redis.Redis, queue_name: str, message: str) -> str:
    """A job of ``queue_name`` that failed with ``message``, in its failed registry."""
    job = shard_jobs.queue(client, queue_name).enqueue(f"{__name__}.raise_error", message)
    burst(client, queue_name, f"{queue_name}-burst")
    assert job.get_status(refresh=True) == "failed"
    return str(job.id)


@contextmanager
def planted(client: redis.Redis) -> Iterator[list[bytes | str]]:
    """Keys a test writes straight into Redis: deleted afterwards (append each one)."""
    keys: list[bytes | str] = []
    try:
        yield keys
    finally:
        if keys:
            client.delete(*keys)


def plant_job(
    client: redis.Redis,
    keys: list[bytes | str],
    job_id: bytes,
    fields: dict[str, bytes | str],
    *,
    queue: str | None = None,
    registry: str = "failed",
) -> None:
    """Writes the hash of job ``job_id`` as given and, with ``queue``, lists it in that
    queue's ``registry`` (``queued``: its list); the list or registry is then deleted with
    the planted keys (a test's own queue: its purge could not read such an id)."""
    key = b"rq:job:" + job_id
    client.hset(key, mapping=fields)  # type: ignore[arg-type]
    keys.append(key)
    if queue is None:
        return
    if registry == "queued":
        keys.append(f"rq:queue:{queue}")
        client.rpush(f"rq:queue:{queue}", job_id)
    else:
        keys.append(f"rq:{registry}:{queue}")
        client.zadd(f"rq:{registry}:{queue}", {job_id: 1})


def pickled_call() -> bytes:
    """A job's ``data`` as RQ's default (pickle) serializer writes it: never to be loaded."""
    return zlib.compress(pickle.dumps(("os.system", None, ["true"], {})))
