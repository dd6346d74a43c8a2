"""A job a worker cannot run fails alone: a real ``redis-lease worker`` (forking and
``--simple``) takes a pickled job, jobs naming a missing function or module, and jobs with
garbage in their data or in other fields RQ decodes. After each the worker is alive, the
job is in the queue's failed registry with a result that says why, the worker printed one
line about it, ``redis_lease_bad_jobs_total`` went up by one, and a shard job enqueued
after it is processed: its run finishes.
"""

from __future__ import annotations

import base64
import importlib
import sys
import zlib
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest
import redis
from rq import Queue

from redis_lease import LeaseStore
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.schedule import TICK_FUNC
from redis_lease.fleet.transport.shard_jobs import JsonJob, JsonQueue
from redis_lease.fleet.worker.bad_jobs import UNIMPORTABLE, UNREADABLE
from redis_lease.operate.dashboard import create_app
from tests import fleet_jobs
from tests.fleet_helpers import FLEET_PATH, Processes, drive, fleet_env, purge_queue, text, wait_for
from tests.helpers import scrape

pytestmark = pytest.mark.slow

#: Bytes no RQ field holds: not UTF-8, a NUL, a pickle's first byte.
GARBAGE = b"\xff\xfe\x00 not written by RQ \x80"
#: Fields RQ decodes when it reads a job hash (dates, a status, numbers, text, JSON).
GARBLED_FIELDS = ("created_at", "status", "timeout", "origin", "dependency_ids")
#: A harmless function, for jobs whose only fault is the garbage put in them.
HARMLESS = "os.getpid"
FIRST_DAY = date(2031, 9, 1)


@pytest.fixture
def fleet(real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Job, str]]:
    """The fleet job on a queue of this test's own (1 shard, 3 items); its queue name."""
    queue_name = f"{real_store.prefix}-q"
    for name, value in fleet_env(queue_name, items=3, shards=1, ttl=5).items():
        monkeypatch.setenv(name, value)
    yield importlib.reload(fleet_jobs).fleet, queue_name
    monkeypatch.undo()
    importlib.reload(fleet_jobs)


def worker_env(queue_name: str, prefix: str) -> dict[str, str]:
    return {**fleet_env(queue_name, items=3, shards=1, ttl=5), "REDIS_LEASE_PREFIX": prefix}


def enqueue_bad(client: redis.Redis, queue_name: str, kind: str) -> tuple[str, str, str]:
    """Enqueues a bad job of ``kind``; returns its id, its reason and what its line says."""
    json_queue = JsonQueue(queue_name, connection=client)
    if kind == "pickled":
        pickling = Queue(queue_name, connection=client)  # RQ's default serializer: pickle
        job = pickling.enqueue(TICK_FUNC, args=([FLEET_PATH], "x"), failure_ttl=600)
        return job.id, UNREADABLE, "its data is a pickle"
    if kind == "missing function":
        job = json_queue.enqueue("tests.fleet_jobs.no_such_function")
        return job.id, UNIMPORTABLE, "its function tests.fleet_jobs.no_such_function does not"
    if kind == "missing module":
        job = json_queue.enqueue("rltest_no_such_module.run")
        return job.id, UNIMPORTABLE, "no module rltest_no_such_module on this worker"
    field = kind.removeprefix("garbage ")
    with client.pipeline() as pipe:  # one transaction: no worker sees it without the garbage
        job = json_queue.enqueue(HARMLESS, pipeline=pipe)
        pipe.hset(job.key, field, GARBAGE)
        pipe.execute()
    said = "its data is not JSON" if field == "data" else f"RQ cannot read its fields {field}"
    return job.id, UNREADABLE, said


def bad_count(store: LeaseStore, queue_name: str, reason: str) -> float | None:
    """``redis_lease_bad_jobs_total`` of a queue and reason, as the exporter serves it."""
    key = ("redis_lease_bad_jobs_total", (("queue", queue_name), ("reason", reason)))
    return scrape(store).get(key)


def worker_lines(procs: Processes, name: str, needle: str) -> list[str]:
    """The lines of worker ``name``'s output that mention ``needle``."""
    log = Path(procs.logs / f"{name}.log").read_text(errors="replace")
    return [line for line in log.splitlines() if needle in line]


def failure_text(client: redis.Redis, job_id: str) -> str:
    """The error of the job's latest result (RQ keeps it zlib-compressed, base64)."""
    entries = client.xrevrange(f"rq:results:{job_id}", count=1)
    assert entries, f"no result for {job_id!r}"
    _entry, fields = entries[0]
    return zlib.decompress(base64.b64decode(fields[b"exc_string"])).decode()


def assert_failed_alone(
    store: LeaseStore,
    procs: Processes,
    name: str,
    queue_name: str,
    job_id: str,
    said: str,
    shown_id: str | None = None,
) -> None:
    """The job is failed (in its queue's failed registry, where RQ reads it, unless RQ
    refuses its id), says why, and the worker named it (as ``shown_id``) in one line."""
    client = store.client
    listed = client.zscore(f"rq:failed:{queue_name}", job_id) is not None
    assert listed == (shown_id is None), job_id
    if listed:
        JsonJob.fetch(job_id, connection=client)  # RQ (and its dashboard) read the failed job
    assert text(client.hget(f"rq:job:{job_id}", "status")) == "failed"
    assert job_id not in [text(i) for i in client.lrange(f"rq:queue:{queue_name}", 0, -1)]
    # RQ moves each job it takes to the intermediate list: a shard job may be there now
    assert job_id not in [
        text(i) for i in client.lrange(f"rq:queue:{queue_name}:intermediate", 0, -1)
    ]
    assert said in failure_text(client, job_id)
    lines = worker_lines(procs, name, f"job {shown_id or job_id} (queue {queue_name})")
    assert len(lines) == 1, procs.log(name)
    assert "failed without running" in lines[0] and said in lines[0], lines[0]


@pytest.mark.parametrize("simple", [False, True], ids=["forking", "simple"])
def test_a_worker_fails_each_bad_job_alone_and_goes_on(
    simple: bool,
    real_store: LeaseStore,
    redis_url: str,
    procs: Processes,
    fleet: tuple[Job, str],
) -> None:
    job, queue_name = fleet
    client, runs = real_store.client, Runs(real_store)
    kinds = ["pickled", "missing function", "missing module", "garbage data"]
    kinds += [f"garbage {field}" for field in GARBLED_FIELDS]
    bad_ids: list[str] = []
    try:
        # A job left in the intermediate list by a worker that died holding it: RQ's
        # cleanup at the next worker's start cannot read it.
        left_id, _, _ = enqueue_bad(client, queue_name, "garbage created_at")
        bad_ids.append(left_id)
        client.lrem(f"rq:queue:{queue_name}", 1, left_id)
        client.lpush(f"rq:queue:{queue_name}:intermediate", left_id)
        name = "worker"
        env = worker_env(queue_name, real_store.prefix)
        worker = procs.worker(redis_url, queue_name, env, simple=simple, name=name)
        needle = f"job {left_id} (queue {queue_name})"  # the line comes last
        wait_for(lambda: worker_lines(procs, name, needle), 60, "the left job to be failed")
        said = "RQ cannot read its fields created_at"
        assert_failed_alone(real_store, procs, name, queue_name, left_id, said)
        assert bad_count(real_store, queue_name, UNREADABLE) == 1
        assert bad_count(real_store, queue_name, UNIMPORTABLE) == 0

        for n, kind in enumerate(kinds):
            before = (
                bad_count(real_store, queue_name, UNREADABLE),
                bad_count(real_store, queue_name, UNIMPORTABLE),
            )
            job_id, reason, said = enqueue_bad(client, queue_name, kind)
            bad_ids.append(job_id)
            run_id, _ = runs.ensure(job, FIRST_DAY + timedelta(days=n), runs.server_now())
            state = drive(real_store, FLEET_PATH, run_id, 90)  # dispatches after the bad job
            assert state == "succeeded", (kind, procs.log(name))
            assert real_store.status(run_id).counts["done"] == 3
            assert worker.poll() is None, (kind, procs.log(name))
            assert_failed_alone(real_store, procs, name, queue_name, job_id, said)
            field = kind.removeprefix("garbage ")
            if kind.startswith("garbage ") and field != "data":  # quoted, then removed
                assert f"{field} = {GARBAGE!r}" in failure_text(client, job_id)
                assert client.hget(f"rq:job:{job_id}", field) != GARBAGE  # status: "failed"
            kept = client.ttl(f"rq:job:{job_id}")  # the job's failure_ttl, else RQ's (a year)
            assert 0 < kept <= 600 if kind == "pickled" else kept > 86400, (kind, kept)
            after = (
                bad_count(real_store, queue_name, UNREADABLE),
                bad_count(real_store, queue_name, UNIMPORTABLE),
            )
            went_up = 0 if reason == UNREADABLE else 1
            assert after[went_up] == (before[went_up] or 0) + 1, kind
            assert after[1 - went_up] == before[1 - went_up], kind
        # RQ's dashboard lists and shows every failed bad job.
        dashboard = create_app(real_store).test_client()
        listed = dashboard.get(f"/rq/0/data/jobs/{queue_name}/failed/100/asc/1.json")
        assert listed.status_code == 200, listed.get_data(as_text=True)[-1500:]
        assert {j["id"] for j in listed.get_json()["jobs"]} == set(bad_ids)
        for job_id in bad_ids:
            assert dashboard.get(f"/rq/0/view/job/{job_id}").status_code == 200
    finally:
        purge_queue(client, queue_name, extra_job_ids=tuple(bad_ids))


def test_a_worker_on_two_queues_fails_bad_jobs_and_names_them_as_text(
    real_store: LeaseStore, redis_url: str, procs: Processes, fleet: tuple[Job, str]
) -> None:
    """With two queues RQ pops jobs (no intermediate list). A hand-written job whose id
    holds terminal escapes is named with them shown as text."""
    job, queue_name = fleet
    other = f"{queue_name}-2"
    client, runs = real_store.client, Runs(real_store)
    hostile_id = "evil\x1b]0;owned\x07"
    try:
        cli = [sys.executable, "-m", "redis_lease", "--url", redis_url, "worker", "--simple"]
        env = worker_env(queue_name, real_store.prefix)
        procs.start([*cli, "--queue", queue_name, "--queue", other], env, "two")
        pickled_id, _, said = enqueue_bad(client, other, "pickled")
        client.hset(f"rq:job:{hostile_id}", mapping={"data": GARBAGE, "origin": other})
        client.rpush(f"rq:queue:{other}", hostile_id)
        shown_id = "evil\\x1b]0;owned\\x07"
        for named in (pickled_id, shown_id):  # each line comes last, after the job is failed
            needle = f"job {named} (queue {other})"
            wait_for(lambda n=needle: worker_lines(procs, "two", n), 60, f"a line on {named}")
        assert_failed_alone(real_store, procs, "two", other, pickled_id, said)
        log = Path(procs.logs / "two.log").read_text(errors="replace")
        assert "\x1b" not in log and "\x07" not in log
        assert_failed_alone(
            real_store, procs, "two", other, hostile_id, "RQ refuses its id", shown_id
        )
        assert bad_count(real_store, other, UNREADABLE) == 2
        assert bad_count(real_store, other, UNIMPORTABLE) == 0
        run_id, _ = runs.ensure(job, FIRST_DAY, runs.server_now())
        assert drive(real_store, FLEET_PATH, run_id, 90) == "succeeded", procs.log("two")
        assert procs.started[-1].poll() is None, procs.log("two")
    finally:
        purge_queue(client, other, extra_job_ids=(hostile_id,))
        purge_queue(client, queue_name)
