"""RQ's own cron ticks redis-lease: the real ``rq cron`` with examples/scheduling/rq_cron.py
writes JSON tick jobs, and a real ``redis-lease worker`` runs them: the run is created.

RQ's cron takes no serializer (``rq cron -S json`` is not passed on, ``cron.register`` has
no such argument); the example makes its jobs JSON with ``json_cron_jobs()``.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from rq import cron

from redis_lease import LeaseStore
from redis_lease.errors import NotFound, RedisLeaseError
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.schedule import TICK_FUNC
from redis_lease.fleet.transport.shard_jobs import JsonQueue, json_cron_jobs
from tests import fleet_jobs
from tests.fleet_helpers import (
    FLEET_PATH,
    Processes,
    assert_json_job,
    fleet_env,
    purge_queue,
    text,
    wait_for,
)

RQ = str(Path(sys.executable).parent / "rq")
EXAMPLE = "examples/scheduling/rq_cron.py"


def cron_history(client: redis.Redis, queue_name: str) -> list[str]:
    """Ids of the jobs the example's cron entry enqueued (RQ keeps them, newest first)."""
    return [
        text(i) for i in client.zrange(f"rq:cron_job:redis-lease-tick:{queue_name}:jobs", 0, -1)
    ]


def forget_cron(client: redis.Redis, queue_name: str) -> None:
    """Deletes what ``rq cron`` kept about the example's entry on this queue."""
    name = f"redis-lease-tick:{queue_name}"
    client.delete(f"rq:cron_job:{name}:jobs")
    client.zrem("rq:cron_jobs", name)
    for key in client.scan_iter(match="rq:cron_scheduler:*", count=1000):
        if client.type(key) == b"hash" and name in text(client.hget(key, "cron_jobs") or b""):
            client.zrem("rq:cron_schedulers", text(key).removeprefix("rq:cron_scheduler:"))
            client.delete(key)


@pytest.fixture
def fleet_queue(
    real_store: LeaseStore, procs: Processes, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A queue of this test's own; afterwards its processes are stopped (a live ``rq cron``
    writes its record again) and what RQ's cron kept about it is deleted."""
    queue_name = f"{real_store.prefix}-q"
    yield queue_name
    procs.kill_all()
    forget_cron(real_store.client, queue_name)
    monkeypatch.undo()
    importlib.reload(fleet_jobs)


@pytest.mark.slow
def test_rq_cron_with_the_example_ticks_through_a_json_job(
    real_store: LeaseStore,
    redis_url: str,
    procs: Processes,
    fleet_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = Runs(real_store)
    fire = (runs.server_now() - timedelta(minutes=3)).replace(second=0, microsecond=0)
    env = fleet_env(
        fleet_queue, items=4, shards=1, ttl=5, schedule=f"{fire.minute} {fire.hour} * * *",
        grace=3600,
    )  # fmt: skip
    env |= {
        "REDIS_LEASE_JOBS": FLEET_PATH,
        "REDIS_LEASE_QUEUE": fleet_queue,
        "REDIS_LEASE_PREFIX": real_store.prefix,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = importlib.reload(fleet_jobs).fleet
    run_id = job.run_id(fire.date())
    client = real_store.client
    ids: list[str] = []
    try:
        scheduler = procs.start([RQ, "cron", "-u", redis_url, EXAMPLE], env, "rq-cron")
        ids = wait_for(
            lambda: cron_history(client, fleet_queue), 60, "rq cron to enqueue a tick", every=0.1
        )
        # No worker yet: the job waits on the queue as rq cron wrote it.
        assert [text(i) for i in client.lrange(f"rq:queue:{fleet_queue}", 0, -1)] == ids
        payload = assert_json_job(client, ids[0])
        assert payload[0] == TICK_FUNC
        assert payload[2] == [[FLEET_PATH], real_store.prefix]

        procs.worker(redis_url, fleet_queue, env, simple=False, name="worker")

        def created() -> list[dict[str, str]] | None:
            try:
                runs.info(run_id)
            except NotFound:
                return None
            return [e for e in runs.decisions(run_id) if e["kind"] == "create"] or None

        wait_for(created, 60, f"the tick to create run {run_id}", every=0.2)
        assert runs.info(run_id)["business_date"] == fire.date().isoformat()
        finished = wait_for(
            lambda: text(client.hget(f"rq:job:{ids[0]}", "status") or b"") == "finished",
            60,
            "the tick job to finish",
            every=0.1,
        )
        assert finished, (procs.log("worker"), procs.log("rq-cron"))
        assert "failed without running" not in procs.log("worker")
        ids = cron_history(client, fleet_queue)
        for rq_id in ids:
            assert_json_job(client, rq_id)
        scheduler.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):  # else killed at teardown
            scheduler.wait(timeout=15)
    finally:
        purge_queue(client, fleet_queue, extra_job_ids=tuple(ids))


def test_json_cron_jobs_makes_rq_cron_enqueue_json_and_refuses_an_rq_it_does_not_know(
    real_store: LeaseStore, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = real_store.client
    monkeypatch.setattr(cron, "Queue", cron.Queue)  # restored after the test
    # Any importable function: the job is never run.
    entry = cron.CronJob(queue_name, func=json_cron_jobs, interval=60, name=f"{queue_name}-e")
    try:
        json_cron_jobs()
        json_cron_jobs()  # twice: the same
        assert cron.Queue is JsonQueue
        payload = assert_json_job(client, entry.enqueue(client).id)
        assert payload[0] == f"{json_cron_jobs.__module__}.json_cron_jobs"
    finally:
        client.delete(f"rq:cron_job:{entry.name}:jobs")
        client.zrem("rq:cron_jobs", entry.name)

    monkeypatch.setattr(cron, "Queue", None)
    with pytest.raises(RedisLeaseError, match=r"does not enqueue through rq\.cron\.Queue"):
        json_cron_jobs()
