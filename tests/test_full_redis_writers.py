"""A full Redis (``maxmemory`` reached under ``noeviction``) met by what writes: a worker
rides it out and says so once a minute; ``add --from-file`` says what went in and how to go
on; the exporter shows Redis memory against ``maxmemory``."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import FINAL_STATES, Runs
from redis_lease.fleet.transport.shard_jobs import purge_queue
from tests.fleet_helpers import FLEET_PATH, Processes, fleet_env, wait_for
from tests.fleet_jobs import effects_key
from tests.redis_server import RedisServer

ITEMS = 200
#: Seconds into the in-process pass when memory is freed.
FREED_AFTER = 3.0
#: Seconds Redis stays full in the worker test: many beats, ticks and claims, and past the
#: 10 attempts a handler whose write is refused would use up (back-off 0.1 to 0.5 s).
FULL_FOR = 8.0


def fill_now(client: redis.Redis) -> None:
    """Fills the server at once: ``maxmemory`` set just over what is used, filler keys
    written until it refuses one, then ``maxmemory`` lowered well under what is used."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(used + 200_000))
    written = 0
    try:
        while written < 100_000:
            client.set(f"filler:{written}", "x" * 10_000)
            written += 1
    except redis.exceptions.OutOfMemoryError:
        pass
    client.config_set("maxmemory", "1mb")


def free(client: redis.Redis) -> None:
    """Deletes the filler keys and raises ``maxmemory`` again."""
    for key in client.scan_iter("filler:*", count=1000):
        client.delete(key)
    client.config_set("maxmemory", "64mb")


def ended(runs: Runs, run_id: str) -> str | None:
    """The run's state once it has ended, else None."""
    state = runs.info(run_id)["state"]
    return state if state in FINAL_STATES else None


def full_lines(log: str) -> list[str]:
    """The worker's lines that say Redis is full (once a minute at most)."""
    return [line for line in log.splitlines() if "Redis is full" in line or "still full" in line]


def test_a_worker_rides_out_a_full_redis_says_so_once_and_loses_nothing(
    private_redis: Callable[..., RedisServer], procs: Processes, prefix: str
) -> None:
    """Redis fills while a worker (with --job: it ticks too) works a run: the worker says
    so in one line (not one per item, beat or tick), no traceback, no exit; once memory is
    freed it goes on by itself and every item is committed once, its effect made once."""
    server = private_redis(maxmemory="64mb", **{"maxmemory-policy": "noeviction"})
    admin = redis.Redis.from_url(server.url)
    queue = f"{prefix}-q"
    env = fleet_env(queue, items=ITEMS, shards=2, delay=0.02, ttl=3, budget=30)
    store = LeaseStore.from_url(server.url, prefix=prefix)
    runs = Runs(store)
    base = [sys.executable, "-m", "redis_lease", "--url", server.url, "--prefix", prefix]
    started = subprocess.run(
        [*base, "start", FLEET_PATH, "--date", "2031-06-02"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    run_id = "fleet:2031-06-02"
    args = [*base, "worker", "--queue", queue, "--job", FLEET_PATH, "--tick-every", "1"]
    procs.start(args, env, "worker")

    def done() -> int:
        return store.status(run_id).counts["done"]

    wait_for(lambda: done() >= 20, 30, "the worker to commit some items")
    fill_now(admin)
    wait_for(lambda: full_lines(procs.log("worker")), 20, "the worker to say Redis is full")
    held = done()
    time.sleep(FULL_FOR)  # full across several beats, ticks and claims: one line still
    free(admin)
    state = wait_for(lambda: ended(runs, run_id), 60, "the run to end")
    log = procs.log("worker")
    assert state == "succeeded", f"{store.status(run_id)}; {log}"
    assert held < ITEMS, "Redis filled before the run ended"
    assert len(full_lines(log)) == 1, log
    assert "Traceback" not in log, log
    status = store.status(run_id)
    assert status.counts["done"] == ITEMS and status.counters["commits"] == ITEMS, status
    effects = admin.hgetall(effects_key(prefix))
    assert len(effects) == ITEMS and set(effects.values()) == {b"1"}, effects
    purge_queue(store.client, queue)
    store.client.close()
    admin.close()


def test_add_from_file_stopped_by_a_full_redis_says_what_went_in_and_goes_on(
    private_redis: Callable[..., RedisServer], prefix: str, tmp_path: Path
) -> None:
    """A full Redis stops ``add --from-file`` partway: one line, exit 13, naming how many
    items went in, the run and its shards, and that the same command adds the rest; once
    memory is freed it does, and every distinct item of the file is there once."""
    from redis_lease.cli import app

    server = private_redis(maxmemory="64mb", **{"maxmemory-policy": "noeviction"})
    admin = redis.Redis.from_url(server.url)
    path = tmp_path / "items.jsonl"
    distinct = 30_000
    with path.open("w") as file:
        for n in [*range(distinct), *range(0, distinct, 10)]:  # every 10th id given twice
            file.write(json.dumps({"id": f"acct-{n:05d}", "payload": {"n": n, "pad": "y" * 50}}))
            file.write("\n")
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", str(used + 3_000_000))  # room for a few thousand items
    runner = CliRunner()
    base = ["--url", server.url, "--prefix", prefix]
    command = [*base, "add", "big", "--shards", "4", "--from-file", str(path)]

    stopped = runner.invoke(app, command)
    assert stopped.exit_code == 13, stopped.output
    assert stopped.stderr.count("\n") == 1 and "Traceback" not in stopped.output
    line = stopped.stderr
    store = LeaseStore.from_url(server.url, prefix=prefix)
    went_in = store.status("big").total
    assert 0 < went_in < distinct, went_in
    assert f"{went_in} of the file's {distinct + distinct // 10} items went in" in line, line
    assert "(run big, shards " in line and "the same command again adds the rest" in line, line
    assert "adding is idempotent" in line and "is full" in line, line

    admin.config_set("maxmemory", "64mb")  # memory freed
    again = runner.invoke(app, command)
    assert again.exit_code == 0, again.output
    assert f"{distinct - went_in} added" in again.stdout, again.stdout
    status = store.status("big")
    assert status.total == distinct and status.counts["pending"] == distinct
    assert status.counters["added"] == distinct, "each item added once"
    admin.close()
    store.client.close()


def memory_samples(store: LeaseStore) -> dict[str, float]:
    """The exporter's Redis memory samples, by metric name (one scrape)."""
    from redis_lease.operate.metrics.collector import LeaseCollector

    return {
        sample.name: sample.value
        for family in LeaseCollector(store).collect()
        if family.name.startswith("redis_lease_redis_memory_")
        for sample in family.samples
    }


def test_the_exporter_shows_redis_memory_against_maxmemory_full_or_not(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    server = private_redis(maxmemory="4mb", **{"maxmemory-policy": "noeviction"})
    admin = redis.Redis.from_url(server.url)
    store = LeaseStore.from_url(server.url, prefix=prefix)
    samples = memory_samples(store)
    assert samples["redis_lease_redis_memory_max_bytes"] == 4 * 1024 * 1024, samples
    assert 0 < samples["redis_lease_redis_memory_used_bytes"] < 4 * 1024 * 1024, samples

    fill_now(admin)  # a full Redis: the scrape still answers, used over max
    samples = memory_samples(store)
    used, most = (
        samples["redis_lease_redis_memory_used_bytes"],
        samples["redis_lease_redis_memory_max_bytes"],
    )
    assert most == 1024 * 1024 and used / most > 0.9, samples  # what the alert fires on

    admin.config_set("maxmemory", "0")  # no limit: max is 0, and the alert never fires
    assert memory_samples(store)["redis_lease_redis_memory_max_bytes"] == 0
    admin.close()
    store.client.close()


def test_start_and_worker_on_a_full_redis_exit_13_in_one_line(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    """``start JOB`` and ``worker --job`` on a Redis that is full already (a run of the job
    there, the protocol stamped): one line each, exit 13, no traceback."""
    server = private_redis(maxmemory="64mb", **{"maxmemory-policy": "noeviction"})
    admin = redis.Redis.from_url(server.url)
    env = {**os.environ, **fleet_env(f"{prefix}-q", items=20)}
    base = [sys.executable, "-m", "redis_lease", "--url", server.url, "--prefix", prefix]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], env=env, capture_output=True, text=True, timeout=60)

    assert run("start", FLEET_PATH, "--date", "2031-06-01").returncode == 0
    fill_now(admin)
    for args in (
        ("start", FLEET_PATH, "--date", "2031-06-02"),
        ("worker", "--queue", f"{prefix}-q", "--job", FLEET_PATH, "--burst"),
    ):
        done = run(*args)
        assert done.returncode == 13, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert "is full" in done.stderr and "free memory, raise maxmemory" in done.stderr
    admin.close()


def test_a_handler_whose_write_a_full_redis_refuses_gives_its_item_back(
    private_redis: Callable[..., RedisServer],
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process: a claim goes through a full Redis (its first write frees memory) but a
    handler's own write does not: its item is given back (the release sent again while its
    lease holds), its attempt not counted, none goes dead; once memory is freed, mid-pass,
    each is worked and committed once."""
    from redis_lease import Item
    from redis_lease.fleet import full_redis
    from redis_lease.fleet.jobs.job import Job
    from redis_lease.fleet.worker.shard_job import LeaseKeeper, work_shard

    monkeypatch.setattr(full_redis, "_said", mmap.mmap(-1, 16))  # nothing said yet
    server = private_redis(maxmemory="64mb", **{"maxmemory-policy": "noeviction"})
    admin = redis.Redis.from_url(server.url)
    store = LeaseStore.from_url(server.url, prefix=prefix)
    store.add("r", [Item(f"i{n}") for n in range(5)], max_attempts=2)
    # short leases: a pass that ends before memory is freed leaves its items' releases
    # unsent, and so its items leased until their leases run out
    job = Job("full", shards=1, lease_ttl_seconds=5, batch_size=10)

    @job.handler
    def handle(item: Item, lease: Any) -> Any:
        lease.store.client.incr(f"{prefix}:effects:{item.id}")  # refused while Redis is full
        return {"ok": item.id}

    def one_pass(budget: float) -> Any:
        keeper = LeaseKeeper(store, 5)  # not started: nothing to renew
        return work_shard(
            store, job, "r", 0, worker="w", budget=budget, stop=threading.Event(), keeper=keeper
        )

    fill_now(admin)
    freeing = threading.Timer(FREED_AFTER, free, args=(admin,))  # memory freed mid-pass
    freeing.start()
    reports = []
    try:
        with caplog.at_level("WARNING", logger="redis_lease.worker"):
            # a pass may drain (every item given back, none due) before memory is freed:
            # passes follow each other, as shard jobs do, until the run has no item left
            deadline = time.monotonic() + 60
            while store.status("r").unfinished and time.monotonic() < deadline:
                reports.append(one_pass(30))
                time.sleep(0.2)  # the next shard job comes later, as the leader dispatches it
    finally:
        freeing.join()
    total = {
        name: sum(getattr(report, name) for report in reports)
        for name in ("committed", "failed", "abandoned", "throttled")
    }
    assert (total["committed"], total["failed"], total["abandoned"]) == (5, 0, 0), reports
    assert total["throttled"] >= 5, reports  # each given back once at least, while Redis was full
    said = [r.getMessage() for r in caplog.records]
    assert len([line for line in said if "Redis is full" in line]) <= 1, said
    status = store.status("r")
    assert status.counts["done"] == 5 and status.counters.get("failures", 0) == 0, status
    assert [admin.get(f"{prefix}:effects:i{n}") for n in range(5)] == [b"1"] * 5
    admin.close()
    store.client.close()
